"""Streaming a reply that may hold tool calls: what can be shown while it is generated.

Framework-neutral pieces shared by the LangChain and LlamaIndex adapters:

* :class:`ToolCallStreamSplitter` streams the text outside ``<tool_call>`` blocks and
  holds back everything from the first block on; at the end the whole reply is
  parsed once (:func:`hvd_agents.chat.toolcalls.parse_tool_calls`), so the streamed pieces
  add up exactly to the parsed content.
* :class:`JsonObjectScanner` finds where the first JSON object of a streamed text
  ends (JSON mode: the reply is cut after it).
* :func:`normalize_tool_choice` maps the ``tool_choice`` values of LangChain, OpenAI
  and LlamaIndex to what :func:`hvd_agents.chat.toolcalls.forced_call_prefix` takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hvd_agents.chat.toolcalls import TOOL_CALL_OPEN, ParsedOutput
from hvd_agents.errors import InvalidRequestError


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


class VisibleReply:
    """The content a reply shows while it streams, as deltas: the prefix it was started with, then
    the generated text; in JSON mode, cut just after the first complete JSON object.

    Example:
        >>> reply = VisibleReply(prefix='{"a"', json_mode=True)
        >>> reply.push(": 1}"), reply.push(" trailing")
        ('{"a": 1}', '')
    """

    def __init__(self, prefix: str = "", json_mode: bool = False) -> None:
        self._pending = prefix
        self._text = ""
        self._shown = 0
        self._scanner = JsonObjectScanner() if json_mode else None

    def push(self, text: str) -> str:
        """Add generated ``text``; return what is newly visible."""
        new, self._pending = self._pending + text, ""
        self._text += new
        end = self._scanner.push(new) if self._scanner is not None else None
        visible = self._text if end is None else self._text[:end]
        delta, self._shown = visible[self._shown:], len(visible)
        return delta
