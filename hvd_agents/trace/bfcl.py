"""Berkeley Function-Calling Leaderboard (BFCL v4) single-turn results read into the trace format.

Input: a BFCL directory laid out as the leaderboard writes it: ``questions/BFCL_v4_<category>.json`` (the
prompts and the function docs, JSONL: ``{"id", "question": [[messages]], "function": [docs]}``) and
``results/<model>/<group>/BFCL_v4_<category>_result.json`` (one model's answers, JSONL: ``{"id", "result"}``,
``result`` a list of ``{function name: "<arguments JSON>"}``). Every single-turn result file under ``results/``
is read (multi-turn ones are not: their conversations need the tool outputs of the run's inference log).

Each result that holds calls becomes one :class:`~hvd_agents.trace.loader.Conversation`: the question's messages,
then an assistant message whose ``tool_calls`` are the model's calls (arguments as the JSON string it wrote), with
the function docs as OpenAI tool schemas, as a function-calling model is served them: a ``.`` in a name becomes
``_`` (the result names the function that way) and BFCL's types become JSON Schema's (``dict`` -> ``object``,
``float`` -> ``number``, ``tuple`` -> ``array``; a language's own type such as Java's ``String`` -> ``string``).
A result without calls (the model answered in text, which the file does not keep) is left out. The conversation
id is ``<model>/<category>/<question id>``. The calls are a model's own output: replaying them measures what
that model's single-turn tool calls would have accepted.

Errors: a directory without that layout, a result whose question is missing, or a malformed line raises
:class:`~hvd_agents.errors.TraceFormatError` naming the file and line.

Example::

    trace = load_bfcl("traces/bfcl_v4")  # TraceFile: one conversation per answered single-turn question
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hvd_agents.chat.render import to_template_messages
from hvd_agents.errors import InvalidRequestError, TraceFormatError
from hvd_agents.trace.loader import Conversation, TraceFile

PREFIX, SUFFIX = "BFCL_v4_", "_result.json"
JSON_TYPES: dict[str, str] = {"dict": "object", "float": "number", "tuple": "array", "list": "array",
                              "any": "string", "object": "object", "number": "number", "array": "array",
                              "string": "string", "integer": "integer", "boolean": "boolean", "null": "null"}


def is_bfcl(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a BFCL directory (``questions/`` and ``results/`` in it)."""
    p = Path(path)
    return p.is_dir() and (p / "questions").is_dir() and (p / "results").is_dir()


def load_bfcl(path: str | os.PathLike, *, limit: int | None = None) -> TraceFile:
    """Read BFCL single-turn results as conversations (see the module docstring).

    Args:
        path: the BFCL directory.
        limit: read at most this many conversations (None: all).

    Raises:
        TraceFormatError: not such a directory, no single-turn result in it, or a malformed line.
    """
    root = Path(path)
    if not is_bfcl(root):
        raise TraceFormatError(f"{path}: not a BFCL directory (questions/ and results/ in it)")
    files = sorted(f for f in (root / "results").glob(f"*/*/{PREFIX}*{SUFFIX}") if "multi_turn" not in f.name)
    if not files:
        raise TraceFormatError(f"{path}: no single-turn result file (results/<model>/<group>/{PREFIX}*{SUFFIX})")
    trace = TraceFile(os.fspath(path))
    questions: dict[str, dict[str, Mapping]] = {}
    for file in files:
        category = file.name[len(PREFIX):-len(SUFFIX)]
        if category not in questions:
            questions[category] = {q["id"]: q for q, _ in _lines(root / "questions" / f"{PREFIX}{category}.json")}
        model = file.parent.parent.name
        for result, line in _lines(file):
            where = f"{file} line {line}"
            if limit is not None and len(trace.conversations) >= limit:
                return trace
            question = questions[category].get(result["id"])
            if question is None:
                raise TraceFormatError(f"{where}: no question {result['id']!r} in questions/{PREFIX}{category}.json")
            conversation = _conversation(question, result, f"{model}/{category}/{result['id']}", where, line)
            if conversation is not None:
                trace.conversations.append(conversation)
    return trace


def _lines(file: Path) -> Iterator[tuple[dict, int]]:
    """The JSONL file's objects, each with its line number."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read BFCL file {file}: {exc}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{where}: {exc}") from exc
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise TraceFormatError(f"{where}: expected an object with an 'id'")
        yield item, number


def _conversation(question: Mapping, result: Mapping, conversation_id: str, where: str,
                  line: int) -> Conversation | None:
    calls = result.get("result")
    if not isinstance(calls, list) or not calls or not all(isinstance(c, Mapping) for c in calls):
        return None  # answered in text (not kept) or not at all
    turns, docs = question.get("question"), question.get("function")
    if not isinstance(turns, list) or len(turns) != 1 or not isinstance(turns[0], list) or not isinstance(docs, list):
        raise TraceFormatError(f"{where}: question {question.get('id')!r} is not one turn with function docs")
    tool_calls = []
    for call in calls:
        for name, arguments in call.items():
            text = arguments if isinstance(arguments, str) else json.dumps(arguments)
            tool_calls.append({"id": f"call_{len(tool_calls)}", "type": "function",
                               "function": {"name": name, "arguments": text}})
    messages = [*turns[0], {"role": "assistant", "content": None, "tool_calls": tool_calls}]
    try:
        tools = [_tool(doc) for doc in docs]
        to_template_messages(messages, tools)
    except (InvalidRequestError, KeyError, TypeError, AttributeError) as exc:
        raise TraceFormatError(f"{where}: {exc}") from exc
    return Conversation(conversation_id, messages, tools, line)


def _tool(doc: Mapping) -> dict:
    return {"type": "function", "function": {"name": doc["name"].replace(".", "_"),
                                             "description": doc.get("description", ""),
                                             "parameters": _schema(doc.get("parameters") or {"type": "dict"})}}


def _schema(node: Any) -> Any:
    """BFCL's parameter schema with JSON Schema's types (recursively)."""
    if isinstance(node, list):
        return [_schema(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    out = {key: (_schema(value) if key != "type" else value) for key, value in node.items()}
    if isinstance(out.get("type"), str):
        out["type"] = JSON_TYPES.get(out["type"], "string")
    return out
