"""API-Bank tool-use dialogues (as ToolSpec's evaluation processed them) read into the trace format.

Input: a ``level-*-api_processed.json`` file, or a directory of them (read in name order). Each file is a JSON
array of items ``{"system": str, "user": str, "answer": ..., "other": {...}}``: ``system`` states the tools as
text, ``user`` is the dialogue so far as text, ``answer`` the gold next call, one ``{"name", "parameters"}``
object or a list of them.

Each item becomes one :class:`~hvd_agents.trace.loader.Conversation` of three messages: the system text, the
dialogue as one user message, and an assistant message whose ``tool_calls`` are the gold answer (arguments as a
JSON string, as OpenAI messages carry them), so a replay renders it as this project's ``<tool_call>{json}
</tool_call>`` template. The conversation id is ``<file stem>#<index>``. The gold answers are human-written, not
a model's output: replay figures on them stand in for an agent that calls tools the same way.

Errors: a missing file, a document that is not an array of such items, or an item whose answer is not a call
raises :class:`~hvd_agents.errors.TraceFormatError` naming the file and item.

Example::

    trace = load_api_bank("traces/api_bank")  # TraceFile: one conversation per item, in file order
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvd_agents.chat.render import to_template_messages
from hvd_agents.errors import InvalidRequestError, TraceFormatError
from hvd_agents.trace.loader import Conversation, TraceFile

PATTERN = "*api_processed.json"


def is_api_bank(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an API-Bank directory (holding :data:`PATTERN` files) or such a file."""
    p = Path(path)
    return any(p.glob(PATTERN)) if p.is_dir() else p.match(PATTERN)


def load_api_bank(path: str | os.PathLike, *, limit: int | None = None) -> TraceFile:
    """Read API-Bank items as conversations (see the module docstring).

    Args:
        path: a processed API-Bank JSON file, or a directory of them.
        limit: read at most this many items (None: all).

    Raises:
        TraceFormatError: no such file or directory, or a malformed document or item.
    """
    root = Path(path)
    files = sorted(root.glob(PATTERN)) if root.is_dir() else [root]
    if not files or not all(f.is_file() for f in files):
        raise TraceFormatError(f"{path}: no API-Bank file ({PATTERN}) there")
    trace = TraceFile(os.fspath(path))
    for file in files:
        try:
            items = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TraceFormatError(f"cannot read API-Bank file {file}: {exc}") from exc
        if not isinstance(items, list):
            raise TraceFormatError(f"{file}: expected a JSON array of API-Bank items")
        for index, item in enumerate(items):
            if limit is not None and len(trace.conversations) >= limit:
                return trace
            trace.conversations.append(_conversation(item, f"{file.stem}#{index}", f"{file} item {index}", index))
    return trace


def _conversation(item: Any, conversation_id: str, where: str, index: int) -> Conversation:
    if not isinstance(item, Mapping) or not isinstance(item.get("system"), str) or not isinstance(item.get("user"),
                                                                                                  str):
        raise TraceFormatError(f"{where}: expected an object with 'system' and 'user' texts")
    answer = item.get("answer")
    calls = answer if isinstance(answer, list) else [answer]
    if not calls or not all(_is_call(call) for call in calls):
        raise TraceFormatError(f"{where}: 'answer' must be a call {{name, parameters}} or a non-empty list of them")
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": call["name"], "arguments": json.dumps(call.get("parameters") or {})}}
                  for i, call in enumerate(calls)]
    messages = [{"role": "system", "content": item["system"]}, {"role": "user", "content": item["user"]},
                {"role": "assistant", "content": None, "tool_calls": tool_calls}]
    try:
        to_template_messages(messages, [])
    except InvalidRequestError as exc:
        raise TraceFormatError(f"{where}: {exc}") from exc
    return Conversation(conversation_id, messages, [], index + 1)


def _is_call(call: Any) -> bool:
    return (isinstance(call, Mapping) and isinstance(call.get("name"), str) and bool(call["name"])
            and isinstance(call.get("parameters") or {}, Mapping))
