"""An airline customer-service agent with LangChain's ``create_agent`` on ``ChatHVD``.

    python examples/airline_langchain.py                 # 4 turns, method hvd, greedy
    python examples/airline_langchain.py --compare       # then the same conversation by plain decoding, side by side
    python examples/airline_langchain.py --method ar     # the same tokens, plain decoding
    python examples/airline_langchain.py --save a.json   # record the model calls (hvd-agents bench-agents)

The user (mia_li_3668) asks for their reservations, a reservation's flight, the other
flights on that route and day, and then to move the reservation; the agent answers each
turn with a tool call (the airline's tools in ``_airline.py`` return JSON), reads the
result and replies. The conversation is one LangGraph thread (an in-memory
checkpointer), so each model call sees every earlier turn and ``ChatHVD`` registers it
under the thread's id: later turns copy ids, flights and call text from earlier ones.
The system prompt starts with the ``agent-system`` template and the history ends
prefix-identical from call to call, so the engine reuses the earlier turns' KV.

``--compare`` (what ``make demo`` runs) runs each turn a second time right after it, by
plain decoding (``ar``), in a conversation of its own on a second engine over the same
loaded model (its own prefix KV cache and store: it reuses nothing from the first, and
turn by turn both see the same load on the machine), and ends with both side by side:
each turn's wall time, decode tokens/s, tokens per step, whether every model call
produced the same tokens, and the speedup.

The embedded SmolLM2-135M does not call tools on its own (asked free-form it answers
in prose or writes code), so one thing is steered: a ``wrap_model_call`` middleware
sets ``tool_choice`` to the turn's planned tool by name (the model does not pick tools
on its own) and to ``"none"`` once the result is in (the model answers). A forced
``tool_choice`` is a grammar: the reply is exactly one call to that tool, written whole
by the model (nothing pre-filled) and valid against the tool's schema, so every call
parses by construction. The earlier conversation in the history, one call per tool,
stays because it teaches the argument values (which id, which flight): without it the
model's arguments are wrong. The tools declare airport codes as three capital letters
(``_airline.AIRPORT``, a JSON Schema ``pattern``), a contract the call's grammar holds:
it is what keeps the model from writing the route (``JFK-SEA``) as both airports. With a
capable model (``own_model.py --model ...``) drop the steering.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from _airline import EXAMPLE, SYSTEM, TURNS, Airline, planned_choice
from _report import MODEL_NOTE, Report, side_by_side
from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, convert_to_messages
from langchain_core.tools import tool
from langchain_hvd import ChatHVD
from langgraph.checkpoint.memory import InMemorySaver

from hvd_agents.bench.recorder import record_calls
from hvd_agents.chat.prompt_templates import apply_system_template, load_template
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.engine.shared import shared_engine
from hvd_agents.runtime.progress import set_quiet, waiting

THREAD = "airline-langchain"
STEERING = ("each turn's planned tool forced by name (tool_choice; the call is decoded under its grammar) until its "
            "result is in, then tool_choice=\"none\"; an earlier exchange with one call per tool in the history "
            "(it teaches the values)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="hvd", choices=available_methods())
    parser.add_argument("--compare", action="store_true",
                        help="then replay the conversation with plain decoding (ar) and print both side by side")
    parser.add_argument("--max-turns", type=int, default=len(TURNS), help="user turns to run (at most 4)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="most tokens per model call")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the conversation's model calls as JSON (replayed by hvd-agents bench-agents)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


@wrap_model_call
def steer_tool_choice(request, handler):
    """Force the turn's planned tool until its result is in, then forbid calls (the model answers)."""
    humans = [i for i, m in enumerate(request.messages) if isinstance(m, HumanMessage)]
    turn = len(humans) - sum(m["role"] == "user" for m in EXAMPLE) - 1
    results = sum(isinstance(m, ToolMessage) for m in request.messages[humans[-1]:])
    return handler(request.override(tool_choice=planned_choice(turn, results)))


class Conversation:
    """The agent on one engine with one method, run turn by turn (one LangGraph thread, one report)."""

    def __init__(self, engine: Engine, method: str, args: argparse.Namespace) -> None:
        self.airline = Airline()
        [system] = apply_system_template([{"role": "system", "content": SYSTEM}], load_template("agent-system"))
        llm = ChatHVD(engine=engine, method=method, max_tokens=args.max_new_tokens)
        self.agent = create_agent(llm, tools=[tool(f) for f in self.airline.tools()], system_prompt=system["content"],
                                  middleware=[steer_tool_choice], checkpointer=InMemorySaver())
        self.report = Report("airline agent, LangChain create_agent", method)
        self.messages: list = []
        self.parsed_calls = self.invalid_calls = 0

    def turn(self, index: int, question: str, *, echo: bool) -> None:
        """Run user turn ``index``; print its calls, results and answer when ``echo``."""
        new = [*convert_to_messages(EXAMPLE), HumanMessage(question)] if index == 0 else [HumanMessage(question)]
        with self.report.turn(question):
            self.messages = self.agent.invoke({"messages": new}, {"configurable": {"thread_id": THREAD}})["messages"]
        turn = self.messages[max(i for i, m in enumerate(self.messages) if isinstance(m, HumanMessage)):]
        for message in turn:
            if isinstance(message, AIMessage):
                self.report.add_call(message.response_metadata.get("hvd_stats"))
                self.parsed_calls += len(message.tool_calls)
                self.invalid_calls += len(message.invalid_tool_calls)
                for call in message.tool_calls if echo else ():
                    print(f"  -> {call['name']}({call['args']})")
            elif isinstance(message, ToolMessage) and echo:
                print(f"     = {message.content[:120]}")
        if echo:
            print(f"assistant: {self.messages[-1].content}", flush=True)


def _plain_engine(engine: Engine) -> Engine:
    """An engine over ``engine``'s target (its model, runner, tokenizer and EOS ids: nothing loaded again) with a
    prefix cache and a store of its own: the plain run neither reuses nor copies anything from the other."""
    return Engine(engine.target, draft_head=None)


def _warm_up(engine: Engine, method: str) -> None:
    """Measure (or read) the cost profile and run one short generation with each method (``method``'s drafter
    and draft head are made on first use), so that no turn pays first-use costs; then empty the prefix KV cache
    the warm-up filled."""
    engine.cost_model()
    for each in dict.fromkeys(("ar", method)):
        engine.generate(engine.tokenizer.encode("Hello"), GenerationParams(max_new_tokens=4, method=each))
    engine.prefix_cache.clear()


def _recorded(engine: Engine, args: argparse.Namespace):
    return record_calls(engine, "airline_langchain", title="airline customer-service agent, LangChain "
                        "create_agent on ChatHVD (look up a user, a reservation, other flights, change it)",
                        command=" ".join(["python examples/airline_langchain.py", *args.argv]), steering=STEERING)


def main(argv: list[str] | None = None, engine: Engine | None = None) -> tuple[Airline, list, Report]:
    """Run the agent over the user's turns and print each turn and the summary; with ``--compare``, each turn
    again by plain decoding right after it, on an engine of its own over the same model, and both side by side.

    Args:
        argv: command-line arguments (None: ``sys.argv``).
        engine: an engine to use instead of the embedded model's shared one.

    Returns:
        The airline (its ``calls`` log), the thread's messages and the report (of ``--method``'s run).
    """
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.quiet:
        set_quiet()
    started = time.perf_counter()
    engine = engine or shared_engine(None, device="cpu")
    plain_engine = _plain_engine(engine) if args.compare else None
    if plain_engine is not None:
        with waiting("warming up (cost profile, first forwards)"):
            _warm_up(engine, args.method)
    print(f"model loaded in {time.perf_counter() - started:.1f} s")
    run = Conversation(engine, args.method, args)
    plain = Conversation(plain_engine, "ar", args) if plain_engine is not None else None
    with _recorded(engine, args) as recording, \
            (_recorded(plain_engine, args) if plain_engine is not None else contextlib.nullcontext()) as plain_rec:
        for index, (question, _) in enumerate(TURNS[:args.max_turns]):
            print(f"\nuser: {question}")
            run.turn(index, question, echo=True)
            if plain is not None:
                plain.turn(index, question, echo=False)
                print(f"  (the same turn by plain decoding, ar: {plain.report.turns[-1].wall_s:.2f} s against "
                      f"{run.report.turns[-1].wall_s:.2f} s)", flush=True)
    print()
    run.report.print()
    print(f"tool calls: {run.parsed_calls} of {run.parsed_calls + run.invalid_calls} parsed; each is decoded under "
          "the tool's grammar (parses by construction; nothing pre-filled)")
    print(f"still steered: {STEERING}")
    if args.save:
        recording.conversation().save(args.save)
        print(f"recorded {len(recording.calls)} model calls to {args.save}")
    if plain is not None:
        print()
        print("\n".join(side_by_side(run.report, plain.report, recording.calls, plain_rec.calls)))
        print(MODEL_NOTE)
    return run.airline, run.messages, run.report


if __name__ == "__main__":
    main()
