"""Reading agent traces: one conversation per JSONL line, or a JSON array of them.

Contract:

* Each conversation is ``{"id": ..., "messages": [OpenAI chat messages], "tools":
  [OpenAI tool schemas]}``; ``id`` is optional (default ``"<file stem>:<line>"``,
  any other JSON value is turned into a string), ``tools`` is optional (missing
  or null means no tools).
* The file is JSONL unless its first non-blank character is ``[``, then it is one
  JSON array (its elements are read one by one, so errors name the line each
  element starts on). JSONL lines end at ``\n`` only; blank lines are skipped.
* Messages and tools are validated by the chat layer
  (:func:`hvd_agents.chat.to_template_messages`), so a trace that loads renders.
* A bad conversation (bad JSON, not an object, missing or empty ``messages``, a
  message of the wrong shape, bad tools) raises
  :class:`~hvd_agents.errors.TraceFormatError` naming the file and line. With
  ``skip_bad=True`` it is logged as a warning, recorded in
  :attr:`TraceFile.skipped`, and the rest is read. A JSON array whose syntax is
  broken cannot be resynchronised: that always raises.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvd_agents.chat.render import to_template_messages
from hvd_agents.errors import InvalidRequestError, TraceFormatError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Conversation:
    """One agent conversation of a trace file.

    Attributes:
        id: the conversation id (also its session id in the cache store).
        messages: OpenAI chat messages.
        tools: OpenAI tool schemas (empty when none).
        line: the line of the file where it starts (1-based).
    """

    id: str
    messages: list[dict]
    tools: list[dict]
    line: int

    @property
    def assistant_indices(self) -> list[int]:
        """Indices of the assistant messages (the generation targets)."""
        return [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]


@dataclass(frozen=True)
class BadLine:
    """A conversation that could not be read (with ``skip_bad``)."""

    line: int
    error: str


@dataclass
class TraceFile:
    """The conversations of a trace file, in file order, and what was skipped."""

    path: str
    conversations: list[Conversation] = field(default_factory=list)
    skipped: list[BadLine] = field(default_factory=list)


def load_trace(path: str | os.PathLike, *, skip_bad: bool = False, limit: int | None = None) -> TraceFile:
    """Read and validate a trace file.

    Args:
        path: a ``.jsonl`` file (one conversation per line) or a JSON array file.
        skip_bad: skip bad conversations (warning + recorded) instead of raising.
        limit: read at most this many good conversations.

    Returns:
        The :class:`TraceFile`.

    Raises:
        TraceFormatError: the file is missing or unreadable, or a conversation is
            malformed and ``skip_bad`` is False.
    """
    name = os.fspath(path)
    text = read_text(name, "trace file")
    trace = TraceFile(name)
    stem = Path(name).stem
    for line, raw in _records(name, text):
        if limit is not None and len(trace.conversations) >= limit:
            break
        try:
            trace.conversations.append(_conversation(name, line, raw, stem))
        except TraceFormatError as exc:
            if not skip_bad:
                raise
            logger.warning("skipping: %s", exc)
            trace.skipped.append(BadLine(line, str(exc)))
    return trace


def read_text(name: str, what: str) -> str:
    """The UTF-8 text of file ``name`` (a ``what``: "trace file", ...).

    Raises:
        TraceFormatError: it does not exist or cannot be read.
    """
    try:
        return Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFormatError(f"{what} {name} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read {what} {name}: {exc}") from exc


def array_elements(name: str, text: str) -> Iterator[tuple[int, Any]]:
    """``(line, element)`` for each element of the JSON array ``text`` (file ``name``), decoded one by one, so
    errors name the line each element starts on.

    Raises:
        TraceFormatError: ``text`` is not a JSON array, or its syntax is broken.
    """
    stripped = text.lstrip()
    if not stripped.startswith("["):
        raise TraceFormatError(f"{name}: expected a JSON array")
    yield from _array_records(name, text, len(text) - len(stripped) + 1)


def _records(name: str, text: str) -> Iterator[tuple[int, Any]]:
    """``(line, decoded JSON or the JSONDecodeError)`` for each conversation of the file."""
    if text.lstrip().startswith("["):
        yield from array_elements(name, text)
        return
    # Lines end at "\n" only (a "\r" before it is JSON whitespace): str.splitlines would
    # also cut at U+2028, U+0085, ..., which JSON strings may hold unescaped.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, exc
        except RecursionError:
            yield number, json.JSONDecodeError("nested too deeply", line, 0)


def _array_records(name: str, text: str, position: int) -> Iterator[tuple[int, Any]]:
    """Elements of a JSON array read one by one from ``position`` (just after ``[``)."""
    decoder = json.JSONDecoder()
    expect_value = True
    while True:
        position = _skip_space(text, position)
        if position >= len(text):
            raise TraceFormatError(f"{name}: unterminated JSON array")
        if text[position] == "]":
            if _skip_space(text, position + 1) < len(text):
                raise TraceFormatError(f"{name}:{_line_of(text, position + 1)}: data after the JSON array")
            return
        if not expect_value:
            if text[position] != ",":
                raise TraceFormatError(f"{name}:{_line_of(text, position)}: expected ',' or ']' in the JSON array")
            position += 1
            expect_value = True
            continue
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{name}:{exc.lineno}: invalid JSON array: {exc.msg}") from exc
        except RecursionError:
            raise TraceFormatError(f"{name}:{_line_of(text, position)}: invalid JSON array: nested too deeply") from None
        yield _line_of(text, position), value
        position, expect_value = end, False


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _conversation(name: str, line: int, raw: Any, stem: str) -> Conversation:
    """Validate one decoded record."""
    where = f"{name}:{line}"
    if isinstance(raw, json.JSONDecodeError):
        raise TraceFormatError(f"{where}: invalid JSON: {raw.msg} (column {raw.colno})")
    if not isinstance(raw, dict):
        raise TraceFormatError(f"{where}: a conversation must be a JSON object, got {type(raw).__name__}")
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise TraceFormatError(f"{where}: 'messages' must be a non-empty list of chat messages")
    tools = raw.get("tools") or []
    if not isinstance(tools, list):
        raise TraceFormatError(f"{where}: 'tools' must be a list of tool schemas, got {type(tools).__name__}")
    try:
        to_template_messages(messages, tools)
    except InvalidRequestError as exc:
        raise TraceFormatError(f"{where}: {exc}") from exc
    conv_id = raw.get("id")
    conv_id = f"{stem}:{line}" if conv_id is None else conv_id if isinstance(conv_id, str) else json.dumps(conv_id)
    return Conversation(conv_id, messages, tools, line)
