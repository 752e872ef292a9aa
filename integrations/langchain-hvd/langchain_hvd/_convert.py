"""Pure helpers of the adapter (no engine): message conversion and tool-call streaming.

* :func:`to_openai_messages` turns LangChain messages into the OpenAI-shape dicts
  that :func:`hvd_agents.conversation.prepare` takes.
* :class:`ToolCallStreamSplitter` streams the text outside ``<tool_call>`` blocks and
  holds back everything from the first block on; at the end the whole reply is
  parsed once (:func:`hvd_agents.toolcalls.parse_tool_calls`) and the calls are
  emitted as ``tool_call_chunks``, so that the aggregated stream equals the
  non-streaming message.
* :func:`normalize_tool_choice` maps LangChain / OpenAI ``tool_choice`` values to
  what :func:`hvd_agents.toolcalls.forced_call_prefix` takes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hvd_agents.errors import InvalidRequestError
from hvd_agents.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParsedOutput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import InvalidToolCall as LCInvalidToolCall
from langchain_core.messages import ToolCall as LCToolCall
from langchain_core.messages import ToolCallChunk
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk

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


def normalize_tool_choice(tool_choice: Any) -> str | None:
    """A ``tool_choice`` as ``None`` (auto), ``"none"``, ``"required"`` or a tool name.

    Accepts ``None``, ``"auto"``, ``"none"``, ``"any"``, ``"required"``, ``True``
    (required), ``False`` (none), a tool name, and the dicts
    ``{"type": "function", "function": {"name": ...}}`` and ``{"name": ...}``.

    Raises:
        InvalidRequestError: any other value.
    """
    if tool_choice is None or tool_choice == "auto":
        return None
    if tool_choice is True or tool_choice in ("any", "required"):
        return "required"
    if tool_choice is False or tool_choice == "none":
        return "none"
    if isinstance(tool_choice, str) and tool_choice:
        return tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        if isinstance(name, str) and name:
            return name
        kind = tool_choice.get("type")
        if kind in ("any", "required", "auto", "none"):
            return normalize_tool_choice(kind)
    raise InvalidRequestError(f"unsupported tool_choice {tool_choice!r}")


def _partial_open_length(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for length in range(min(len(text), len(TOOL_CALL_OPEN) - 1), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-length:]):
            return length
    return 0


class ToolCallStreamSplitter:
    """Streams content outside tool-call blocks; the calls come out at the end.

    ``push(text)`` returns the content that can be shown now: the reply's text
    before its first ``<tool_call>``, without leading whitespace, holding back
    trailing whitespace and a possible partial ``<tool_call>`` tag. Everything
    from the first ``<tool_call>`` on is held. ``finish(parsed)`` returns the rest
    of ``parsed.content``. What was emitted is always a prefix of
    ``parse_tool_calls(full_text).content``, so the pieces add up to it exactly.

    Args:
        prefix: text the reply was forced to start with (a forced tool call's
            opening); it is part of the reply but was not generated.
    """

    def __init__(self, prefix: str = "") -> None:
        self.text = ""
        self.emitted = ""
        self.held = False
        self.push(prefix)

    def push(self, text: str) -> str:
        self.text += text
        if self.held:
            return ""
        at = self.text.find(TOOL_CALL_OPEN)
        if at >= 0:
            self.held = True
            visible = self.text[:at]
        else:
            visible = self.text[: len(self.text) - _partial_open_length(self.text)]
        return self._advance(visible.strip())

    def finish(self, parsed: ParsedOutput) -> str:
        """The content not emitted yet (``parsed`` is the parse of the full reply)."""
        return self._advance(parsed.content)

    def _advance(self, content: str) -> str:
        if not content.startswith(self.emitted):  # cannot happen (see class docstring); never re-emit
            raise AssertionError(f"streamed content {self.emitted!r} is not a prefix of {content!r}")
        delta = content[len(self.emitted) :]
        self.emitted = content
        return delta


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


def parsed_tool_calls(parsed: ParsedOutput) -> tuple[list[LCToolCall], list[LCInvalidToolCall]]:
    """The parsed calls as LangChain tool calls and invalid tool calls (with the parse error)."""
    calls = [tool_call(name=call.name, args=dict(call.arguments), id=call.id) for call in parsed.tool_calls]
    invalid = [
        invalid_tool_call(name=bad.name, args=invalid_call_args(bad.text, bad.error), id=bad.id, error=bad.error)
        for bad in parsed.invalid_tool_calls
    ]
    return calls, invalid


class JsonObjectScanner:
    """Finds where the first top-level JSON object of a streamed text ends.

    ``push(text)`` returns the index (in the text pushed so far) just after the
    closing brace of the first ``{...}`` object, or None while it is open. Strings
    and escapes are tracked, so braces inside strings do not count.
    """

    def __init__(self) -> None:
        self.length = 0
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escaped = False
        self.end: int | None = None

    def push(self, text: str) -> int | None:
        if self.end is not None:
            return self.end
        for offset, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"' and self.started:
                self.in_string = True
            elif char == "{":
                self.started = True
                self.depth += 1
            elif char == "}" and self.started:
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.length + offset + 1
                    break
        self.length += len(text)
        return self.end
