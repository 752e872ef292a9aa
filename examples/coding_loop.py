"""A coding-style agent loop: list files, read one, edit it, run a check (long tool outputs).

    python examples/coding_loop.py                 # 2 tasks, method hvd, greedy
    python examples/coding_loop.py --method ar     # the same tokens, plain decoding
    python examples/coding_loop.py --save c.json   # record the model calls (hvd-agents bench-agents)

A framework-free loop (``_loop.py``) over the engine on an in-memory repository: each
task is one user turn in which the agent lists the files, reads the module to fix
(numbered lines, as coding agents show them), replaces a snippet and runs the module's
check, whose report is long; then it answers. Tool outputs are long and the agent's
calls repeat paths and lines from them, which is what the cache drafter copies. The
system prompt starts with the ``agent-system`` template and the tool schemas are
canonicalised.

The embedded SmolLM2-135M does not run such a loop on its own, so it is steered: each
step forces the planned tool by name (``tool_choice``: the model does not pick tools on
its own), then ``tool_choice="none"`` for the answer; an earlier solved task in the
history shows the four calls, because it teaches the argument values (the paths and
the snippet to replace). The forced call is decoded under the tool's grammar: the model
writes it whole (nothing pre-filled) and it parses by construction.
``own_model.py --model ...`` shows a free-running agent on a capable model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _loop import agent_turn
from _report import Report
from _tools import call_tool, string_tool

from hvd_agents.bench.recorder import save_calls
from hvd_agents.chat.prompt_templates import apply_system_template, canonicalize_tools, load_template
from hvd_agents.chat.request import ChatSettings
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine
from hvd_agents.runtime.progress import set_quiet

SYSTEM = ("You are a coding agent working in a small Python repository. List the files, read the code, make the "
          "smallest edit that fixes the task, and run the check before you answer.")

PLAN = ("list_files", "read_file", "edit_file", "run_check")
"""The tools each task calls, in order."""


def _module(name: str, rate: str, bug: str) -> str:
    lines = [f'"""{name.capitalize()} rules of the shop."""', "", "from dataclasses import dataclass", "",
             f"{name.upper()}_RATE = {rate}", ""]
    for i in range(8):
        lines += ["", "@dataclass", f"class Rule{i}:", f"    threshold: float = {10 * (i + 1)}.0",
                  f"    factor: float = {1 + i / 100:.2f}", "", "    def applies(self, amount: float) -> bool:",
                  "        return amount >= self.threshold"]
    lines += ["", "", f"def {name}_for(amount: float) -> float:", f"    return {bug}", ""]
    return "\n".join(lines)


FILES = {
    "README.md": "# shop\n\nPricing and shipping rules. Run the checks with run_check.\n",
    "src/shipping.py": _module("shipping", "0.05", "amount + SHIPPING_RATE"),
    "src/tax.py": _module("tax", "0.2", "amount + TAX_RATE"),
    "tests/test_shipping.py": "assert round(shipping_for(100.0), 2) == 5.0\n",
    "tests/test_tax.py": "assert round(tax_for(100.0), 2) == 20.0\n",
}

# Each task: the request, the module, the check, and the edit a correct agent makes.
TASKS = [
    ("tax_for(100.0) should be 20.0 but the check fails. Fix src/tax.py.", "src/tax.py", "tests/test_tax.py",
     "amount + TAX_RATE", "amount * TAX_RATE"),
]
EXAMPLE_TASK = ("shipping_for(100.0) should be 5.0 but the check fails. Fix src/shipping.py.", "src/shipping.py",
                "tests/test_shipping.py", "amount + SHIPPING_RATE", "amount * SHIPPING_RATE")


class Repository:
    """The in-memory repository and its tools (each returns JSON), with a log of the calls."""

    def __init__(self) -> None:
        self.files = dict(FILES)
        self.calls: list[tuple[str, dict]] = []

    def list_files(self, directory: str) -> str:
        self.calls.append(("list_files", {"directory": directory}))
        return json.dumps([name for name in sorted(self.files) if name.startswith(directory.rstrip("/"))])

    def read_file(self, file: str) -> str:
        self.calls.append(("read_file", {"file": file}))
        if file not in self.files:
            return json.dumps({"error": f"no file {file}"})
        return "\n".join(f"{i:>4}  {line}" for i, line in enumerate(self.files[file].split("\n"), 1))

    def edit_file(self, file: str, old_text: str, new_text: str) -> str:
        self.calls.append(("edit_file", {"file": file, "old_text": old_text, "new_text": new_text}))
        text = self.files.get(file)
        if text is None or text.count(old_text) != 1:
            return json.dumps({"error": f"old_text must occur exactly once in {file}"})
        self.files[file] = text.replace(old_text, new_text)
        return json.dumps({"status": "edited"})

    def run_check(self, check: str) -> str:
        """Run a check file against the module it tests; the report lists every rule too (long)."""
        self.calls.append(("run_check", {"check": check}))
        path, module = check, check.replace("tests/test_", "src/")
        if path not in self.files or module not in self.files:
            return json.dumps({"error": f"no check {path}"})
        scope: dict = {}
        try:
            exec(compile(self.files[module], module, "exec"), scope)  # noqa: S102 (the repository's own code)
            exec(compile(self.files[path], path, "exec"), scope)  # noqa: S102
            detail = f"{path}: 1 passed"
        except Exception as exc:  # noqa: BLE001 (a failing check is a report, not a crash)
            detail = f"{path}: 1 failed: {type(exc).__name__}: {exc}"
        rules = [f"{module}::Rule{i} collected, threshold={10 * (i + 1)}.0 ok" for i in range(8)]
        return "\n".join([*rules, detail])

    def run(self, name: str, arguments: dict) -> str:
        """Execute a call by name (:func:`_tools.call_tool`)."""
        return call_tool({"list_files": self.list_files, "read_file": self.read_file, "edit_file": self.edit_file,
                    "run_check": self.run_check}, TOOLS, name, arguments)


TOOLS = [
    string_tool("list_files", "List the repository's files under a directory.", directory="Directory, e.g. src"),
    string_tool("read_file", "Read a file, with line numbers.", file="File path"),
    string_tool("edit_file", "Replace an exact snippet of a file.", file="File path", old_text="Exact text to replace",
                new_text="Replacement text"),
    string_tool("run_check", "Run a check file and print its report.", check="Check file path"),
]


def _example() -> list[dict]:
    """An earlier task, solved: the four calls with their real outputs, then the answer."""
    repo = Repository()
    request, module, check, old, new = EXAMPLE_TASK
    steps = [("list_files", {"directory": "src"}), ("read_file", {"file": module}),
             ("edit_file", {"file": module, "old_text": old, "new_text": new}), ("run_check", {"check": check})]
    messages: list[dict] = [{"role": "user", "content": request}]
    for i, (name, arguments) in enumerate(steps):
        call_id = f"call_{i + 1}"
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": repo.run(name, arguments)},
        ]
    messages.append({"role": "assistant", "content": f"Fixed {module}: `{old}` is now `{new}`; {check} passes."})
    return messages


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="hvd", choices=available_methods())
    parser.add_argument("--max-steps", type=int, default=len(PLAN), help="tool calls before the answer (at most 4)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="most tokens per model call")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the conversation's model calls as JSON (replayed by hvd-agents bench-agents)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, engine: Engine | None = None) -> tuple[Repository, list[dict], Report]:
    """Run the task and print each call and the summary.

    Args:
        argv: command-line arguments (None: ``sys.argv``).
        engine: an engine to use instead of the embedded model's shared one.

    Returns:
        The repository (its ``calls`` log and files), the conversation and the report.
    """
    args = parse_args(argv)
    if args.quiet:
        set_quiet()
    started = time.perf_counter()
    engine = engine or shared_engine(None, device="cpu")
    print(f"model loaded in {time.perf_counter() - started:.1f} s")
    repo = Repository()
    messages = apply_system_template([{"role": "system", "content": SYSTEM}, *_example()],
                                     load_template("agent-system"))
    settings = ChatSettings(method=args.method, max_tokens=args.max_new_tokens)
    report = Report("coding loop, framework-free", args.method)
    steps = PLAN[:args.max_steps]
    command = " ".join(["python examples/coding_loop.py", *(sys.argv[1:] if argv is None else argv)])
    with save_calls(args.save, engine, "coding_loop", title="coding loop, framework-free (list files, read a "
                    "file, edit it, run a check; long tool outputs)", command=command,
                    steering="each planned tool forced by name (tool_choice; the call is decoded under its "
                    "grammar), then tool_choice=\"none\"; an earlier solved task in the history (it teaches the "
                    "values)"):
        for request, *_ in TASKS:
            print(f"\nuser: {request}")
            messages.append({"role": "user", "content": request})
            with report.turn(request):
                calls = agent_turn(engine, messages, canonicalize_tools(TOOLS), repo.run, settings,
                                   session_id="coding-loop", report=report, max_calls=len(steps),
                                   plan=lambda n: steps[n] if n < len(steps) else None)
            for call in calls:
                print(f"  -> {call.name}({json.dumps(call.arguments)[:100]}) = {call.result[:100]}...")
            print(f"assistant: {messages[-1]['content']}")
    print()
    report.print()
    return repo, messages, report


if __name__ == "__main__":
    main()
