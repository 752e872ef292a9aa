"""A framework-free agent loop over the engine, as ``coding_loop.py`` and ``own_model.py`` run it.

One user turn: call the model with the conversation and the tools, execute the tool
calls it makes, send the results back, and repeat until it answers without a call (or
``max_calls`` calls were made). Every model call goes through
:func:`hvd_agents.chat.request.build_chat_request`, the path both adapters and the
server take: it turns ``tool_choice`` into the grammar the reply is decoded under (a
forced tool: exactly one call to it, its arguments valid against its schema;
``"auto"``: text, or valid calls once the model opens one) and registers the
conversation in the engine's cache store, so later calls can copy earlier turns and
tool outputs. Nothing of the reply is pre-filled: every call the model writes parses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from _report import Report

from hvd_agents.chat.delta_stream import collect, stream_reply_deltas
from hvd_agents.chat.request import ChatSettings, build_chat_request
from hvd_agents.engine import Engine

Plan = Callable[[int], "str | None"]
"""A function of the number of tool calls so far in this turn: the tool to call next, or None to answer."""


@dataclass(frozen=True)
class Call:
    """One executed tool call: what the model asked for and what the tool returned."""

    name: str
    arguments: dict
    result: str


def agent_turn(
    engine: Engine,
    messages: list[dict],
    tools: list[dict],
    execute: Callable[[str, dict], str],
    settings: ChatSettings,
    *,
    session_id: str,
    report: Report,
    plan: Plan | None = None,
    max_calls: int = 6,
) -> list[Call]:
    """Run one user turn (the user's message is already last in ``messages``), appending to ``messages``.

    Args:
        engine: the engine.
        messages: OpenAI-shape conversation; the assistant's calls, the tool results and
            the final answer are appended to it.
        tools: OpenAI-shape tool schemas.
        execute: runs a call: ``execute(name, arguments) -> result text``.
        settings: generation settings.
        session_id: the conversation's key in the engine's cache store.
        report: receives each model call's stats.
        plan: steers a small model: each call forces the planned tool (``tool_choice`` set
            to its name: the model writes that call's arguments under its schema's grammar),
            and once ``plan`` returns None the call forbids tools (``tool_choice="none"``: the
            model answers). None: ``"auto"``, the model decides.
        max_calls: the most tool calls in this turn; the call after them forbids tools.

    Returns:
        The calls made, in order (an invalid call counts, with its error as the result).
    """
    calls: list[Call] = []
    while True:
        planned = plan(len(calls)) if plan is not None and len(calls) < max_calls else None
        choice = "none" if len(calls) >= max_calls or (plan is not None and planned is None) else planned or "auto"
        request = build_chat_request(engine, messages, tools, settings=settings, tool_choice=choice,
                                     session_id=session_id)
        reply = collect(stream_reply_deltas(request))
        report.add_call(reply.summary.hvd_stats)
        parsed = reply.parsed()
        made = parsed.tool_calls
        if not made and parsed.invalid_tool_calls and choice != "none":
            # as agent frameworks do: the reply goes back with an error result, and the model tries again
            bad = parsed.invalid_tool_calls[0]
            error = json.dumps({"error": f"invalid tool call: {bad.error}"})
            messages.append({"role": "assistant", "content": f"{parsed.content}<tool_call>\n{bad.text}\n</tool_call>"})
            messages.append({"role": "tool", "tool_call_id": bad.id, "content": error})
            calls.append(Call(bad.name or "", {}, error))
            continue
        if not made:
            messages.append({"role": "assistant", "content": parsed.content})
            return calls
        ids = [f"call_{sum(m['role'] == 'tool' for m in messages) + i + 1}" for i in range(len(made))]
        messages.append({"role": "assistant", "content": parsed.content, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            for call_id, call in zip(ids, made)]})
        for call_id, call in zip(ids, made):
            result = execute(call.name, call.arguments)
            calls.append(Call(call.name, call.arguments, result))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
