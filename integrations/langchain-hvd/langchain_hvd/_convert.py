"""Pure helpers of the adapter (no engine): LangChain types to and from hvd-agents'.

* :func:`to_openai_messages` turns LangChain messages into the OpenAI-shape dicts
  that :func:`hvd_agents.chat.conversation.prepare` takes.
* :class:`ToolCallChunks` turns the tool calls of a reply's deltas
  (:func:`hvd_agents.chat.delta_stream.stream_reply_deltas`, the one reply pipeline of
  hvd-agents) into LangChain's ``tool_call_chunks`` as they are generated; summing the
  chunks yields the message's ``tool_calls`` and ``invalid_tool_calls``.
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
from langchain_core.utils.json import parse_partial_json

from hvd_agents.chat.delta_stream import ReplyDelta
from hvd_agents.chat.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
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


class ToolCallChunks:
    """The ``tool_call_chunks`` of a reply's deltas, one chunk index per call, in the order calls begin.

    A call's deltas become chunks of its index: the first with its id and name, the next ones
    its argument text as generated, as ``langchain-openai`` streams them. A block that ends
    without a call that parses (an :class:`~hvd_agents.chat.toolcall_stream.InvalidCallDelta`)
    must stay invalid once LangChain sums the chunks and reads each call's ``args`` with its
    lenient partial-JSON parser (which would complete ``{"city": "Pa`` into an object): a
    streamed call's argument text then gets :func:`unreadable_tail`; a block read whole comes
    as one chunk whose ``args`` are the block as written, tags included
    (:func:`invalid_call_args`). :attr:`errors` keeps each invalid call's error by id (a chunk
    cannot carry it).
    """

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self._index: dict[int, int] = {}  # the reply's call index -> the chunk index
        self._next = 0  # the next chunk index
        self._arguments: dict[int, str] = {}  # argument text streamed so far, by the reply's call index

    def of(self, delta: ReplyDelta) -> list[ToolCallChunk]:
        """The tool-call chunks of one delta (at most one per call)."""
        chunks: dict[int, ToolCallChunk] = {}
        for call in delta.tool_calls:
            if call.index not in self._index:
                self._index[call.index], self._next = self._next, self._next + 1
            index = self._index[call.index]
            self._arguments[call.index] = self._arguments.get(call.index, "") + call.arguments
            chunks[index] = tool_call_chunk(name=call.name, args=call.arguments, id=call.id, index=index)
        for bad in delta.invalid_calls:
            self.errors[bad.id] = bad.error
            if bad.index is None:  # read whole: its own chunk index, after the calls begun so far
                index, self._next = self._next, self._next + 1
                chunks[index] = tool_call_chunk(name=bad.name, args=invalid_call_args(bad.text, bad.error),
                                                id=bad.id, index=index)
                continue
            tail = unreadable_tail(self._arguments.get(bad.index, ""))
            index = self._index[bad.index]
            if index in chunks:
                chunks[index]["args"] = (chunks[index]["args"] or "") + tail
            elif tail:
                chunks[index] = tool_call_chunk(name=None, args=tail, id=None, index=index)
        return list(chunks.values())


def unreadable_tail(arguments: str) -> str:
    """What to append to a call's argument text so that LangChain reads no object from it ("" if it reads none).

    LangChain's ``parse_partial_json`` completes an unfinished object (closing its strings and
    brackets, dropping a broken end), but gives up at a closing bracket that closes nothing
    outside a string. The tail closes an open string and adds such a bracket: ``{"city": "Pa``
    becomes ``{"city": "Pa"]``.
    """
    if arguments and not _reads_as_object(arguments):
        return ""
    in_string = escaped = False
    stack: list[str] = []
    for char in arguments:  # the parser's own reading: strings, escapes and the open brackets
        if in_string:
            if char == '"' and not escaped:
                in_string = False
            elif char == "\\":
                escaped = not escaped
            else:
                escaped = False
        elif char == '"':
            in_string, escaped = True, False
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack and stack[-1] == char:
            stack.pop()
    closing_quote = ('""' if escaped else '"') if in_string else ""  # an escaped quote does not close it
    return closing_quote + ("}" if stack and stack[-1] == "]" else "]")


def _reads_as_object(arguments: str) -> bool:
    """Whether LangChain's chunk aggregation reads ``arguments`` as a tool call's arguments object."""
    try:
        return isinstance(parse_partial_json(arguments), dict)
    except (ValueError, RecursionError):
        return False
