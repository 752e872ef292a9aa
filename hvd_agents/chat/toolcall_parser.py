"""Reading tool calls out of a reply: the one parser of the ``<tool_call>`` grammar.

Every reader of tool-call text goes through :class:`ToolCallReader`: the whole-reply
parse (:func:`parse_tool_calls`), the adapters' content stream and the server's
tool-call deltas (the faces in :mod:`hvd_agents.chat.toolcall_stream`). The reader
takes the reply in pieces of any size and reports it as a sequence of
:class:`ReplyEvent` s; the sequence depends only on the text, not on how it was cut
(argument text aside, which comes in the pieces it was pushed in). So the whole-reply
result and the streamed one are the same by construction.

Grammar (Hermes style)::

    reply   := (content | block)*
    block   := "<tool_call>" body "</tool_call>"      # the first "</tool_call>" ends it
    body    := JSON object {"name": str, "arguments": object | JSON string of an object, "id"?: str}

* A block ends at the first ``</tool_call>`` after its opening, wherever it is (even
  inside a JSON string), and a ``<tool_call>`` inside a block is part of its body.
* A block whose body starts ``{"name": "...", "arguments": {`` is a *streamed* call:
  :class:`CallOpened` as soon as that much is read, then its argument text as it is
  written (:class:`ArgumentsText`: the raw object after ``"arguments":``, up to its
  closing brace). Any other block is read whole when it closes.
* :class:`BlockClosed` gives each block's verdict: a :class:`ToolCall` or an
  :class:`InvalidToolCall` (bad JSON, no name, arguments that are not an object, or a
  block left unterminated at the end of the reply). The reader never raises on model
  output.

Example::

    reader = ToolCallReader()
    reader.push('Hi <tool_call>\\n{"name": "f", "arguments": {"a": ')
    # -> Content("Hi "), BlockOpened(), CallOpened(0, "call_...", "f"), ArgumentsText(0, '{"a": ')
    reader.push('1}}\\n</tool_call>')
    # -> ArgumentsText(0, "1}"), BlockClosed(ToolCall("f", {"a": 1}, "call_..."), ...)
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A well-formed tool call.

    Attributes:
        name: the function name.
        arguments: the decoded arguments object.
        id: the call id (``call_`` + 24 hex characters unless given by the model).
    """

    name: str
    arguments: dict
    id: str


@dataclass(frozen=True)
class InvalidToolCall:
    """A tool-call block that could not be turned into a :class:`ToolCall`.

    Attributes:
        text: the raw text inside the block (without the tags).
        error: why it is invalid.
        name: the function name, when one could be read.
        id: a call id, so that an error can be reported back to the model.
    """

    text: str
    error: str
    name: str | None
    id: str


@dataclass(frozen=True)
class ParsedOutput:
    """A model reply split into content and tool calls.

    Attributes:
        content: the text outside tool-call blocks, stripped.
        tool_calls: the valid calls, in order.
        invalid_tool_calls: the invalid blocks, in order.
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    invalid_tool_calls: tuple[InvalidToolCall, ...] = ()


def new_call_id() -> str:
    """A fresh call id: ``call_`` + 24 hex characters from a uuid4."""
    return "call_" + uuid.uuid4().hex[:24]


# ---------------------------------------------------------------------- events


@dataclass(frozen=True)
class Content:
    """Text outside blocks, as written (not stripped)."""

    text: str


@dataclass(frozen=True)
class BlockOpened:
    """A ``<tool_call>`` opened a block."""


@dataclass(frozen=True)
class CallOpened:
    """A streamed call's start: its position among the streamed calls, its id and its name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsText:
    """More of a streamed call's raw argument text."""

    index: int
    text: str


@dataclass(frozen=True)
class BlockClosed:
    """A block ended: by its ``</tool_call>`` (``terminated``) or by the end of the reply.

    Attributes:
        body: the text between the tags (everything after the opening tag when unterminated).
        verdict: the block read as a call, or why it is not one.
        streamed: the index of its :class:`CallOpened`, or None when it was read whole.
        terminated: it ended with ``</tool_call>``.
    """

    body: str
    verdict: ToolCall | InvalidToolCall
    streamed: int | None
    terminated: bool


ReplyEvent = Content | BlockOpened | CallOpened | ArgumentsText | BlockClosed


# ---------------------------------------------------------------------- the reader


class _Mode(Enum):
    CONTENT = "content"  # outside blocks
    HEADER = "header"  # inside a block, before its arguments
    ARGS = "args"  # streaming the arguments object
    RAW = "raw"  # inside a block that does not start in the usual way: read when it closes


class ToolCallReader:
    """Reads a reply pushed in pieces as :data:`ReplyEvent` s (see the module docstring)."""

    def __init__(self) -> None:
        self._mode = _Mode.CONTENT
        self._pending = ""  # unread text (content mode: a held partial "<tool_call>")
        self._block = ""  # the current block's text (after "<tool_call>")
        self._call: CallOpened | None = None  # the streamed call of the current block
        self._args_at = 0  # where its arguments start in ``_block``
        self._args_sent = 0  # argument characters reported
        self._scanner: JsonObjectScanner | None = None
        self._streamed = 0  # streamed calls so far
        self._events: list[ReplyEvent] = []

    @property
    def streamed_calls(self) -> int:
        """Streamed calls opened so far."""
        return self._streamed

    @property
    def in_block(self) -> bool:
        """A block is open."""
        return self._mode is not _Mode.CONTENT

    @property
    def reads_whole(self) -> bool:
        """The open block does not start as a streamed call: it is read when it closes."""
        return self._mode is _Mode.RAW

    def push(self, text: str) -> list[ReplyEvent]:
        """Read more of the reply; returns the events it completes."""
        self._pending += text
        progressed = True
        while progressed:
            if self._mode is _Mode.CONTENT:
                progressed = self._read_content()
            else:
                self._block, self._pending = self._block + self._pending, ""
                progressed = self._read_block()
        return self._take()

    def finish(self, close_open_block: bool = False) -> list[ReplyEvent]:
        """End of the reply: the events of what is left.

        Args:
            close_open_block: generation stopped at the stop string ``</tool_call>``,
                so an open block is complete (its closing tag was consumed as the stop).
        """
        closed = self.push(TOOL_CALL_CLOSE) if close_open_block and self.in_block else []
        if self._mode is _Mode.ARGS:  # cut short: the arguments written so far
            self._emit_args(len(self._block) - self._args_at)
        if self.in_block:
            body = self._block
            verdict = InvalidToolCall(body.strip(), "unterminated <tool_call> block", guess_name(body),
                                      self._call.id if self._call is not None else new_call_id())
            self._close(body, verdict, terminated=False)
        elif self._pending:
            self._events.append(Content(self._pending))
        self._pending = ""
        return closed + self._take()

    # ------------------------------------------------------------------ states

    def _read_content(self) -> bool:
        """Report pending text as content; True when a block opened."""
        at = self._pending.find(TOOL_CALL_OPEN)
        if at >= 0:
            if at:
                self._events.append(Content(self._pending[:at]))
            self._pending = self._pending[at + len(TOOL_CALL_OPEN) :]
            self._block, self._mode = "", _Mode.HEADER
            self._events.append(BlockOpened())
            return True
        keep = _partial_tag(self._pending, TOOL_CALL_OPEN)
        if len(self._pending) > keep:
            self._events.append(Content(self._pending[: len(self._pending) - keep]))
            self._pending = self._pending[len(self._pending) - keep :]
        return False

    def _read_block(self) -> bool:
        """Advance inside a block; True when it closed (the text after it is pending again)."""
        if self._mode is _Mode.HEADER:
            self._read_header()
        close = self._block.find(TOOL_CALL_CLOSE, self._args_at if self._mode is _Mode.ARGS else 0)
        if self._mode is _Mode.ARGS:
            self._stream_args(close)
        if close < 0:
            return False
        self._pending = self._block[close + len(TOOL_CALL_CLOSE) :] + self._pending
        body = self._block[:close]
        default_id = self._call.id if self._call is not None else None
        self._close(body, parse_block(body, default_id), terminated=True)
        return True

    def _read_header(self) -> None:
        """Open a streamed call once ``{"name": ..., "arguments": {`` is read; RAW when it cannot be."""
        state, end, name = _match_header(self._block)
        closed_at = self._block.find(TOOL_CALL_CLOSE)
        if state == "match" and (0 <= closed_at < end or self._block[end] != "{"):
            state = "fail"  # the block ends inside its header, or the arguments are no object
        if state == "fail" or (state == "partial" and closed_at >= 0):
            self._mode = _Mode.RAW
        elif state == "match":
            self._call = CallOpened(self._streamed, new_call_id(), name)
            self._events.append(self._call)
            self._streamed += 1
            self._mode, self._args_at, self._args_sent = _Mode.ARGS, end, 0
            self._scanner = JsonObjectScanner()

    def _stream_args(self, close: int) -> None:
        """Report the arguments object's text read so far (up to its end, or to ``close``)."""
        tail_end = len(self._block) if close < 0 else close
        args = self._block[self._args_at : tail_end]
        end = self._scanner.push(args[self._scanner.length :])
        if end is not None:
            self._emit_args(end)
        elif close >= 0:  # closed before the object ended: the broken text is the arguments
            self._emit_args(len(args))
        else:
            self._emit_args(len(args) - _partial_tag(args, TOOL_CALL_CLOSE))

    def _emit_args(self, upto: int) -> None:
        if upto > self._args_sent:
            text = self._block[self._args_at + self._args_sent : self._args_at + upto]
            self._events.append(ArgumentsText(self._call.index, text))
            self._args_sent = upto

    def _close(self, body: str, verdict: ToolCall | InvalidToolCall, terminated: bool) -> None:
        streamed = self._call.index if self._call is not None else None
        self._events.append(BlockClosed(body, verdict, streamed, terminated))
        self._block, self._mode, self._scanner, self._call, self._args_at = "", _Mode.CONTENT, None, None, 0

    def _take(self) -> list[ReplyEvent]:
        events, self._events = self._events, []
        return events


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split a model reply into content and tool calls; never raises on model output.

    Args:
        text: the generated text of one assistant turn.

    Returns:
        The :class:`ParsedOutput`: content outside the blocks (stripped; the pieces
        around blocks are joined as they are), valid calls and invalid blocks, each
        block read by :class:`ToolCallReader`.
    """
    reader = ToolCallReader()
    return parsed_output(reader.push(text) + reader.finish())


def parsed_output(events: list[ReplyEvent]) -> ParsedOutput:
    """The :class:`ParsedOutput` of a whole reply's events."""
    content = "".join(event.text for event in events if isinstance(event, Content)).strip()
    verdicts = [event.verdict for event in events if isinstance(event, BlockClosed)]
    calls = tuple(verdict for verdict in verdicts if isinstance(verdict, ToolCall))
    invalid = tuple(verdict for verdict in verdicts if isinstance(verdict, InvalidToolCall))
    return ParsedOutput(content, calls, invalid)


# ---------------------------------------------------------------------- one block


def parse_block(raw: str, call_id: str | None = None) -> ToolCall | InvalidToolCall:
    """The inside of one closed block as a call, or why it is none.

    Args:
        raw: the text between the tags.
        call_id: the id to give it when the block has none (None: a fresh one).
    """
    body = raw.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return InvalidToolCall(body, f"invalid JSON: {exc}", guess_name(body), call_id or new_call_id())
    except RecursionError:
        return InvalidToolCall(body, "invalid JSON: nested too deeply", guess_name(body), call_id or new_call_id())
    if not isinstance(obj, dict):
        return InvalidToolCall(body, "tool call is not a JSON object", None, call_id or new_call_id())
    given = obj.get("id")
    call_id = given if isinstance(given, str) and given else call_id or new_call_id()
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return InvalidToolCall(body, "missing or invalid function name", None, call_id)
    arguments, error = decode_arguments(obj.get("arguments", {}))
    if error is not None:
        return InvalidToolCall(body, error, name, call_id)
    return ToolCall(name, arguments, call_id)


def decode_arguments(arguments: Any) -> tuple[dict, str | None]:
    """The arguments object, decoding a JSON string holding an object; or an error."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return {}, f"arguments string is not valid JSON: {exc}"
        except RecursionError:
            return {}, "arguments string is not valid JSON: nested too deeply"
    if arguments is None:
        return {}, None
    if not isinstance(arguments, dict):
        return {}, f"arguments must be a JSON object, got {type(arguments).__name__}"
    return arguments, None


def guess_name(raw: str) -> str | None:
    """Best-effort function name from a broken block (``"name": "..."``), or None."""
    found = re.search(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', raw)
    if found is None:
        return None
    try:
        return json.loads(f'"{found.group(1)}"')
    except json.JSONDecodeError:
        return found.group(1)


# The start of a streamed block, element by element: whitespace, literals, and the name string.
_WS, _NAME = object(), object()
_HEADER = (_WS, "{", _WS, '"name"', _WS, ":", _WS, _NAME, _WS, ",", _WS, '"arguments"', _WS, ":", _WS)


def _match_header(text: str) -> tuple[str, int, str | None]:
    """Match the start of a block: ``("match", end, name)``, ``("partial", 0, None)`` or ``("fail", 0, None)``.

    ``end`` is the index of the first character of the arguments; a text that ends
    before it (even in whitespace after the colon) is ``partial``.
    """
    pos, name = 0, None
    for element in _HEADER:
        if element is _WS:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos == len(text):
                return "partial", 0, None
        elif element is _NAME:
            if text[pos] != '"':
                return "fail", 0, None
            end = _string_end(text, pos)
            if end is None:
                return "partial", 0, None
            try:
                name = json.loads(text[pos:end])
            except json.JSONDecodeError:
                return "fail", 0, None
            if not name:
                return "fail", 0, None
            pos = end
        else:
            chunk = text[pos : pos + len(element)]
            if not element.startswith(chunk):
                return "fail", 0, None
            if len(chunk) < len(element):
                return "partial", 0, None
            pos += len(element)
    return "match", pos, name


def _string_end(text: str, start: int) -> int | None:
    """Index just after the JSON string opening at ``text[start]``, or None while it is open."""
    escaped = False
    for index in range(start + 1, len(text)):
        char = text[index]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return index + 1
    return None


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


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
        """Read more text; the end of the first object, once it is known."""
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
