"""Pure helpers of the adapter (no engine): LangChain types to and from hvd-agents'.

* :func:`to_openai_messages` turns LangChain messages into the OpenAI-shape dicts
  that :func:`hvd_agents.chat.conversation.prepare` takes.
* :func:`parsed_tool_call_chunks` turns the parsed calls of a reply
  (:func:`hvd_agents.chat.toolcalls.parse_tool_calls`) into LangChain's
  ``tool_call_chunks``; summing the chunks (``_aggregate`` in :mod:`.chat_models`)
  yields the message's tool calls. The streaming split of the reply itself is
  :mod:`hvd_agents.chat.toolcall_stream` (shared with the LlamaIndex adapter).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolCallChunk,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.messages.utils import convert_to_messages

from hvd_agents.chat.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParsedOutput
from hvd_agents.errors import InvalidRequestError

# Content blocks that carry no prompt text: tool calls are rendered from
# ``AIMessage.tool_calls``; reasoning traces of other providers are dropped.
_SKIPPED_BLOCKS = frozenset({
    "tool_use", "tool_call", "tool_call_chunk", "invalid_tool_call", "server_tool_call",
    "server_tool_call_chunk", "server_tool_result", "thinking", "redacted_thinking", "reasoning",
})
_TEXT_BLOCKS = frozenset({"text", "text-plain"})
_CHAT_ROLES = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
               "system": "system", "developer": "system", "tool": "tool", "function": "tool"}


def content_text(index: int, content: Any) -> str:
    """A message's content as prompt text.

    Strings pass through; in a list of blocks, strings and text blocks are joined
    with newlines, tool-call and reasoning blocks are skipped.

    Raises:
        InvalidRequestError: an image, audio, file or other non-text block (the
            models served by hvd-agents are text-only).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for number, block in enumerate(content):
        if isinstance(block, str):
            texts.append(block)
            continue
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind in _TEXT_BLOCKS and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise InvalidRequestError(
                f"messages[{index}].content[{number}]: content blocks of type {kind!r} are not supported "
                "(ChatHVD models are text-only)"
            )
    return "\n".join(texts)


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Convert LangChain messages to OpenAI-shape message dicts.

    System, human, AI and tool messages map to the ``system``, ``user``,
    ``assistant`` and ``tool`` roles. An AI message's ``tool_calls`` become
    ``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``;
    its ``invalid_tool_calls`` are left out (they have no JSON to render). A tool
    message keeps its ``tool_call_id``. ``ChatMessage`` roles ``human`` / ``ai`` /
    ``developer`` / ``function`` are mapped; message names are ignored.

    Raises:
        InvalidRequestError: an unsupported message type or role, or non-text content.
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        text = content_text(index, message.content)
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": text})
        elif isinstance(message, HumanMessage):
            out.append({"role": "user", "content": text})
        elif isinstance(message, AIMessage):
            entry: dict[str, Any] = {"role": "assistant", "content": text}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.get("id") or f"call_{index}_{number}",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)},
                    }
                    for number, call in enumerate(message.tool_calls)
                ]
            out.append(entry)
        elif isinstance(message, ToolMessage):
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
        elif isinstance(message, FunctionMessage):
            out.append({"role": "tool", "tool_call_id": message.name, "content": text})
        elif isinstance(message, ChatMessage):
            role = _CHAT_ROLES.get(message.role)
            if role is None:
                raise InvalidRequestError(f"messages[{index}] has unsupported role {message.role!r}")
            out.append({"role": role, "content": text})
        else:
            raise InvalidRequestError(f"messages[{index}]: unsupported message type {type(message).__name__}")
    return out


def input_error(model_input: Any, exc: Exception) -> InvalidRequestError:
    """The :class:`InvalidRequestError` for an input LangChain could not turn into messages.

    Names the first item of a list that does not convert (its index and LangChain's
    reason), or the type of an input that is neither text, a list nor a prompt value.
    """
    if isinstance(model_input, Sequence) and not isinstance(model_input, str):
        for index, item in enumerate(model_input):
            try:
                convert_to_messages([item])
            except (ValueError, TypeError, NotImplementedError) as item_exc:
                return InvalidRequestError(f"messages[{index}]: {first_line(item_exc)}")
    if not isinstance(model_input, (str, Sequence)):
        return InvalidRequestError(
            f"input must be a string, a list of messages or a PromptValue, got {type(model_input).__name__}"
        )
    return InvalidRequestError(f"invalid input: {first_line(exc)}")


def first_line(exc: Exception) -> str:
    """An exception's message without LangChain's troubleshooting link."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def invalid_call_args(raw: str, error: str) -> str:
    """The ``args`` string of an invalid call: the block as the model wrote it, tags included.

    The tags keep LangChain's chunk aggregation (which re-parses ``args`` with a
    lenient partial-JSON parser) from turning a broken call into a valid one.
    """
    unterminated = error.startswith("unterminated")
    return f"{TOOL_CALL_OPEN}\n{raw}" + ("" if unterminated else f"\n{TOOL_CALL_CLOSE}")


def parsed_tool_call_chunks(parsed: ParsedOutput) -> list[ToolCallChunk]:
    """The parsed calls as tool-call chunks: valid calls first, then invalid ones."""
    chunks = [
        tool_call_chunk(name=call.name, args=json.dumps(call.arguments, ensure_ascii=False), id=call.id, index=i)
        for i, call in enumerate(parsed.tool_calls)
    ]
    offset = len(chunks)
    chunks.extend(
        tool_call_chunk(name=bad.name, args=invalid_call_args(bad.text, bad.error), id=bad.id, index=offset + i)
        for i, bad in enumerate(parsed.invalid_tool_calls)
    )
    return chunks

