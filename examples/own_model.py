"""The airline customer-service workflow on your own model: a free-running agent, or a steered small one.

    python examples/own_model.py                                  # embedded SmolLM2-135M, steered
    python examples/own_model.py --model Qwen/Qwen2.5-1.5B-Instruct   # your model, free-running
    python examples/own_model.py --model ./model.gguf --free      # any model id, path or GGUF file
    python examples/own_model.py --save own_model.json            # record the model calls (hvd-agents bench-agents)

A framework-free agent loop (``_loop.py``) over the engine: each model call gets the
conversation and four airline tools (JSON results), the calls it makes are executed and
their results sent back until it answers. The system prompt starts with the
``agent-system`` template (``templates/agent-system.txt``) and the tool schemas are
canonicalised, so every call renders the same tokens for the same content and the
cache drafter can copy from the earlier turns.

With ``--model`` the model decides on its own whether and which tool to call
(``tool_choice="auto"``): use a model that follows tool calls (a 1B+ instruct model).
The embedded SmolLM2-135M does not: left free it answers in prose or writes code. So
on it (or with ``--steer``) the example steers it: each call forces the turn's planned
tool by name (``tool_choice``: the model does not pick tools on its own), then
``tool_choice="none"`` for the answer; and an earlier exchange in the history shows one
call per tool, because it teaches the argument values (without it the values are
wrong). Every call, steered or free, is decoded under the tools' grammar (a forced
tool: exactly one call to it; ``"auto"``: text, or valid calls once the model opens
one), so it parses by construction: nothing of the reply is pre-filled; the airport
codes are declared as three capital letters (a schema ``pattern`` the grammar holds).
"""

from __future__ import annotations

import argparse
import sys
import time

from _airline import EXAMPLE, SYSTEM, TOOL_SCHEMAS, TURNS, Airline, planned_tool
from _loop import agent_turn
from _report import Report

from hvd_agents.bench.recorder import save_calls
from hvd_agents.chat.prompt_templates import apply_system_template, canonicalize_tools, load_template
from hvd_agents.chat.request import ChatSettings
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine
from hvd_agents.runtime.progress import set_quiet


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="hub id, local directory or .gguf file (default: embedded)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: CUDA when available)")
    parser.add_argument("--method", default="hvd", choices=available_methods())
    parser.add_argument("--max-turns", type=int, default=len(TURNS), help="user turns to run (at most 4)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="most tokens per model call")
    steer = parser.add_mutually_exclusive_group()
    steer.add_argument("--steer", dest="steer", action="store_true", default=None,
                       help="force each turn's planned tool (default on the embedded model)")
    steer.add_argument("--free", dest="steer", action="store_false",
                       help="let the model choose (default with --model)")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the conversation's model calls as JSON (replayed by hvd-agents bench-agents)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, engine: Engine | None = None) -> tuple[Airline, list[dict], Report]:
    """Run the workflow and print each turn and the summary.

    Args:
        argv: command-line arguments (None: ``sys.argv``).
        engine: an engine to use instead of loading ``--model``.

    Returns:
        The airline (its ``calls`` log), the conversation and the report.
    """
    args = parse_args(argv)
    if args.quiet:
        set_quiet()
    steer = args.model is None if args.steer is None else args.steer
    started = time.perf_counter()
    engine = engine or shared_engine(args.model, device=args.device)
    print(f"model loaded in {time.perf_counter() - started:.1f} s; "
          f"{'steered (example exchange + forced tool_choice)' if steer else 'free-running (tool_choice=auto)'}")
    airline = Airline()
    tools = canonicalize_tools(TOOL_SCHEMAS)
    history = EXAMPLE if steer else []
    messages = apply_system_template([{"role": "system", "content": SYSTEM}, *history], load_template("agent-system"))
    settings = ChatSettings(method=args.method, max_tokens=args.max_new_tokens)
    report = Report("airline agent, framework-free loop", args.method)
    command = " ".join(["python examples/own_model.py", *(sys.argv[1:] if argv is None else argv)])
    steering = ("each planned tool forced by name (tool_choice; the call is decoded under its grammar), then "
                "tool_choice=\"none\"; an earlier exchange with one call per tool in the history (it teaches the "
                "values)") if steer else ""
    with save_calls(args.save, engine, "own_model", title="airline customer-service agent, framework-free loop "
                    f"({'steered' if steer else 'free-running'})", command=command, steering=steering):
        for index, (question, _) in enumerate(TURNS[:args.max_turns]):
            print(f"\nuser: {question}")
            messages.append({"role": "user", "content": question})
            with report.turn(question):
                calls = agent_turn(engine, messages, tools, airline.run, settings, session_id="airline-own-model",
                                   report=report, plan=(lambda n, t=index: planned_tool(t, n)) if steer else None)
            for call in calls:
                print(f"  -> {call.name}({call.arguments}) = {call.result[:120]}")
            print(f"assistant: {messages[-1]['content']}")
    print()
    report.print()
    return airline, messages, report


if __name__ == "__main__":
    main()
