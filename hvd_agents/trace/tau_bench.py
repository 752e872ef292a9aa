"""tau-bench results (customer-service agents calling tools) read into the trace format.

Input: a results file as tau-bench's ``run.py`` writes it (and as its ``historical_trajectories/`` ship): a JSON
array of ``{"task_id", "trial", "reward", "info", "traj"}``, ``traj`` the conversation as OpenAI chat messages
(the domain's policy as the system message, the simulated user's turns, the agent's replies and tool calls, the
tools' outputs).

Each result becomes one :class:`~hvd_agents.trace.loader.Conversation`, id ``<file stem>/<task_id>/<trial>``:
its messages with the fields a chat template reads (``role``, ``content``, ``tool_calls``, a tool message's
``tool_call_id``). The results do not hold the tool schemas; when the file sits inside a tau-bench checkout
(``tau_bench/envs/<domain>/tools/`` in one of its parent directories) each tool's schema is read from its
``get_info`` there, the domain being the env whose name the system message's first line (or else the file
name) holds. Outside a checkout the conversations have no tools (a warning says so). The agent's messages are a
model's own output: replaying them measures what that model's turns would have accepted.

Errors: a result that is not such an object, or a message of the wrong shape, raises
:class:`~hvd_agents.errors.TraceFormatError` naming the file and line; so does a tool file whose ``get_info``
does not return a literal schema.

Example::

    trace = load_tau_bench("tau-bench/historical_trajectories/gpt-4o-airline.json")
"""

from __future__ import annotations

import ast
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hvd_agents.chat.render import to_template_messages
from hvd_agents.errors import InvalidRequestError, TraceFormatError
from hvd_agents.trace.loader import Conversation, TraceFile, array_elements, read_text

logger = logging.getLogger(__name__)

RESULT_KEYS = frozenset({"task_id", "traj"})
MESSAGE_FIELDS = ("role", "content", "tool_calls", "tool_call_id")


def is_tau_bench(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a tau-bench results file (a JSON array whose first element has ``task_id`` and ``traj``)."""
    p = Path(path)
    if not p.is_file() or p.suffix != ".json":
        return False
    try:  # the first element alone is decoded
        _, first = next(array_elements(str(p), read_text(str(p), "file")), (0, None))
    except TraceFormatError:
        return False
    return isinstance(first, dict) and RESULT_KEYS <= first.keys()


def load_tau_bench(path: str | os.PathLike, *, limit: int | None = None) -> TraceFile:
    """Read a tau-bench results file as conversations (see the module docstring).

    Args:
        path: the results file.
        limit: read at most this many conversations (None: all).

    Raises:
        TraceFormatError: the file cannot be read, or a result or tool file is malformed.
    """
    name = os.fspath(path)
    text = read_text(name, "tau-bench results file")
    trace = TraceFile(name)
    tools: list[dict] | None = None
    for line, result in array_elements(name, text):
        if limit is not None and len(trace.conversations) >= limit:
            break
        where = f"{name}:{line}"
        if not isinstance(result, Mapping) or not RESULT_KEYS <= result.keys() or not isinstance(result["traj"], list):
            raise TraceFormatError(f"{where}: a tau-bench result is an object with 'task_id' and a 'traj' list")
        messages = [_message(m, where) for m in result["traj"]]
        if tools is None:
            tools = _tools(Path(name), messages)
        try:
            to_template_messages(messages, tools)
        except InvalidRequestError as exc:
            raise TraceFormatError(f"{where}: {exc}") from exc
        conversation_id = f"{Path(name).stem}/{result['task_id']}/{result.get('trial', 0)}"
        trace.conversations.append(Conversation(conversation_id, messages, tools, line))
    return trace

def _message(message: Any, where: str) -> dict:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise TraceFormatError(f"{where}: a message of 'traj' is an object with a 'role'")
    out = {key: message[key] for key in MESSAGE_FIELDS if key in message and message[key] is not None}
    if "tool_calls" in out:  # OpenAI's fields only (tau-bench keeps its SDK's extra ones)
        calls = out["tool_calls"]
        if not isinstance(calls, list) or not all(isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)
                                                  and "name" in c["function"] for c in calls):
            raise TraceFormatError(f"{where}: a message's 'tool_calls' is a list of {{'function': {{'name', "
                                   f"'arguments'}}}} objects")
        out["tool_calls"] = [{"id": call.get("id"), "type": "function",
                              "function": {"name": call["function"]["name"],
                                           "arguments": call["function"].get("arguments", "{}")}}
                             for call in calls]
    out.setdefault("content", None)
    return out


def _tools(file: Path, messages: list[dict]) -> list[dict]:
    """The domain's tool schemas from a tau-bench checkout above ``file``, or none (with a warning)."""
    envs = next((parent / "tau_bench" / "envs" for parent in file.resolve().parents
                 if (parent / "tau_bench" / "envs").is_dir()), None)
    if envs is None:
        logger.warning("%s: no tau-bench checkout above it, so its conversations have no tool schemas", file)
        return []
    system = next((m.get("content") or "" for m in messages if m["role"] == "system"), "")
    heading = system.strip().splitlines()[0].lower() if system.strip() else ""
    domains = sorted(d.name for d in envs.iterdir() if (d / "tools").is_dir())
    domain = next((d for d in domains if d in heading), None) or next((d for d in domains if d in file.name), None)
    if domain is None:
        logger.warning("%s: no domain of %s (%s) is named by its system message or file name, so no tool schemas",
                       file, envs, ", ".join(domains))
        return []
    return [_schema(tool) for tool in sorted((envs / domain / "tools").glob("*.py")) if tool.name != "__init__.py"]


def _schema(tool: Path) -> dict:
    """The literal dict ``get_info`` returns in ``tool`` (read, never run)."""
    try:
        tree = ast.parse(tool.read_text(encoding="utf-8"))
        returns = [node.value for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name == "get_info"
                   for node in fn.body if isinstance(node, ast.Return)]
        schema = ast.literal_eval(returns[0]) if returns and returns[0] is not None else None
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise TraceFormatError(f"{tool}: cannot read its tool schema: {exc}") from exc
    if not isinstance(schema, dict) or not isinstance(schema.get("function"), dict):
        raise TraceFormatError(f"{tool}: get_info does not return an OpenAI tool schema")
    return schema
