"""A LlamaIndex ``FunctionAgent`` on ``HVD`` over a calculator and a small file store.

    python examples/calculator_llamaindex.py                # 3 turns, method hvd, greedy
    python examples/calculator_llamaindex.py --method ar    # the same tokens, plain decoding
    python examples/calculator_llamaindex.py --save c.json  # record the model calls (hvd-agents bench-agents)

The user asks for a product, to save it in a file and to read the file back; the agent
answers each turn with a tool call (``multiply``, ``write_file``, ``read_file``; the
results are JSON), then replies. Each run starts from the previous run's memory, so
the agent sees the whole conversation and every model call registers it in the
engine's cache store under one session. The system prompt starts with the
``agent-system`` template.

The embedded SmolLM2-135M does not call tools on its own, so one thing is steered:
``HVD(tool_choice=...)``, given a function of the call's messages, forces the turn's
planned tool by name until its result is in (the model does not pick tools on its own),
then returns ``"none"`` (the model answers, and cannot start another call). The forced
call is decoded under the tool's grammar: the model writes the whole call, name and
arguments, and it parses by construction (arguments valid against the tool's schema);
nothing of the reply is pre-filled. The earlier conversation in the history, one call
per tool, stays because it teaches the argument values: without it the model's
arguments (which numbers, which file name) are wrong. With a capable model
(``HVD(model=...)``) drop both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from _report import Report
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.tools import FunctionTool
from llama_index.llms.hvd import HVD

from hvd_agents.bench.recorder import save_calls
from hvd_agents.chat.prompt_templates import apply_system_template, load_template
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine
from hvd_agents.runtime.progress import set_quiet

SYSTEM = "You are a careful assistant. Compute with the calculator and keep notes in the file store."

STEERING = ("each turn's planned tool forced by name (tool_choice; the call is decoded under its grammar), then "
            "tool_choice=\"none\"; an earlier exchange with one call per tool in the history (it teaches the values)")

# The user's turns and the calls a correct agent makes in each (name, arguments).
TURNS = [
    ("What is 1234 * 56?", [("multiply", {"a": 1234, "b": 56})]),
    ("Save that result in a file named totals.txt.", [("write_file", {"name": "totals.txt", "text": "69104"})]),
    ("Read totals.txt back to me.", [("read_file", {"name": "totals.txt"})]),
]

class Workspace:
    """A calculator and an in-memory file store, with a log of the calls made."""

    def __init__(self) -> None:
        self.files = {"readme.txt": "Notes of the calculator agent."}
        self.calls: list[tuple[str, dict]] = []

    def add(self, a: float, b: float) -> str:
        """Add two numbers."""
        self.calls.append(("add", {"a": a, "b": b}))
        return json.dumps({"a": a, "b": b, "sum": a + b})

    def multiply(self, a: float, b: float) -> str:
        """Multiply two numbers."""
        self.calls.append(("multiply", {"a": a, "b": b}))
        return json.dumps({"a": a, "b": b, "product": a * b})

    def write_file(self, name: str, text: str) -> str:
        """Write text to a file of the store, replacing it if it exists."""
        self.calls.append(("write_file", {"name": name, "text": text}))
        self.files[name] = text
        return json.dumps({"written": len(text), "name": name})

    def read_file(self, name: str) -> str:
        """Read a file of the store."""
        self.calls.append(("read_file", {"name": name}))
        if name not in self.files:
            return json.dumps({"error": f"no file {name}", "files": sorted(self.files)})
        return json.dumps({"text": self.files[name], "name": name})

    def tools(self) -> list[FunctionTool]:
        return [FunctionTool.from_defaults(f) for f in (self.add, self.multiply, self.write_file, self.read_file)]


def _exchange(question: str, name: str, arguments: dict, result: dict, answer: str) -> list[ChatMessage]:
    call_id = f"call_{name}"
    return [
        ChatMessage(role="user", content=question),
        ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_call_id=call_id, tool_name=name,
                                                            tool_kwargs=arguments)]),
        ChatMessage(role="tool", content=json.dumps(result), additional_kwargs={"tool_call_id": call_id}),
        ChatMessage(role="assistant", content=answer),
    ]


EXAMPLE = [
    *_exchange("What is 25 * 4?", "multiply", {"a": 25, "b": 4}, {"a": 25, "b": 4, "product": 100}, "25 * 4 = 100."),
    *_exchange("Save that result in a file named notes.txt.", "write_file", {"name": "notes.txt", "text": "100"},
               {"written": 3, "name": "notes.txt"}, "Saved 100 in notes.txt."),
    *_exchange("Read notes.txt back to me.", "read_file", {"name": "notes.txt"},
               {"text": "100", "name": "notes.txt"}, "notes.txt says: 100"),
]
"""An earlier conversation that shows one call of each tool."""


def _planned_tool(messages: list[ChatMessage]) -> str | None:
    """The turn's planned tool until its result is in, then None (the model answers)."""
    users = [i for i, m in enumerate(messages) if m.role == MessageRole.USER]
    turn = len(users) - sum(m.role == MessageRole.USER for m in EXAMPLE) - 1
    results = sum(m.role == MessageRole.TOOL for m in messages[users[-1]:])
    plan = TURNS[turn][1]
    return plan[results][0] if results < len(plan) else None


def planned_choice(messages: list[ChatMessage]) -> str:
    """The planned tool by name while the turn still needs its call (a grammar: the reply is exactly one valid
    call to it), then ``"none"``: the model answers."""
    return _planned_tool(messages) or "none"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="hvd", choices=available_methods())
    parser.add_argument("--max-turns", type=int, default=len(TURNS), help="user turns to run (at most 3)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens per model call")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the conversation's model calls as JSON (replayed by hvd-agents bench-agents)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace, engine: Engine) -> tuple[Workspace, list[str], Report]:
    """Run the agent over the user's turns; return the workspace, the answers and the report."""
    workspace = Workspace()
    [system] = apply_system_template([{"role": "system", "content": SYSTEM}], load_template("agent-system"))
    llm = HVD(engine=engine, method=args.method, max_tokens=args.max_new_tokens, tool_choice=planned_choice,
              session_id="calculator-llamaindex")
    agent = FunctionAgent(tools=workspace.tools(), llm=llm, system_prompt=system["content"])
    report = Report("calculator and files, LlamaIndex FunctionAgent", args.method)
    history, answers = list(EXAMPLE), []
    for question, _ in TURNS[:args.max_turns]:
        print(f"\nuser: {question}")
        with report.turn(question):
            handler = agent.run(user_msg=question, chat_history=history)
            async for event in handler.stream_events():
                if isinstance(event, AgentOutput):
                    report.add_call((event.raw or {}).get("hvd_stats"))
                elif isinstance(event, ToolCallResult):
                    print(f"  -> {event.tool_name}({event.tool_kwargs}) = {event.tool_output.content[:120]}")
            output = await handler
        # the run's memory: the history, this turn's calls, results and answer (carried to the next run)
        history = await (await handler.ctx.store.get("memory")).aget_all()
        answers.append(str(output.response.content))
        print(f"assistant: {answers[-1]}")
    print()
    report.print()
    return workspace, answers, report


def main(argv: list[str] | None = None, engine: Engine | None = None) -> tuple[Workspace, list[str], Report]:
    """Run the example and print each turn and the summary.

    Args:
        argv: command-line arguments (None: ``sys.argv``).
        engine: an engine to use instead of the embedded model's shared one.

    Returns:
        The workspace (its ``calls`` log and files), the answers and the report.
    """
    args = parse_args(argv)
    if args.quiet:
        set_quiet()
    started = time.perf_counter()
    engine = engine or shared_engine(None, device="cpu")
    print(f"model loaded in {time.perf_counter() - started:.1f} s")
    command = " ".join(["python examples/calculator_llamaindex.py", *(sys.argv[1:] if argv is None else argv)])
    with save_calls(args.save, engine, "calculator_llamaindex", title="calculator and file store, LlamaIndex "
                    "FunctionAgent on HVD (multiply, write a file, read it back)", command=command,
                    steering=STEERING):
        return asyncio.run(run(args, engine))


if __name__ == "__main__":
    main()
