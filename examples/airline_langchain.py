"""An airline customer-service agent with LangChain's ``create_agent`` on ``ChatHVD``.

    python examples/airline_langchain.py                 # 4 turns, method hvd, greedy
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

The embedded SmolLM2-135M does not call tools on its own (asked free-form it answers
in prose or writes code). The example steers it with what works for small models, as
``own_model.py`` does: an earlier conversation in the history that shows one call per
tool, and a ``wrap_model_call`` middleware that sets ``tool_choice`` to the turn's
planned tool (the reply is pre-filled with the call's start; the model writes the
arguments) and to ``"none"`` once the result is in. With a capable model
(``own_model.py --model ...``) drop both.
"""

from __future__ import annotations

import argparse
import sys
import time

from _airline import EXAMPLE, SYSTEM, TURNS, Airline, planned_choice
from _report import Report
from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, convert_to_messages
from langchain_core.tools import tool
from langchain_hvd import ChatHVD
from langgraph.checkpoint.memory import InMemorySaver

from hvd_agents.bench.recorder import save_calls
from hvd_agents.chat.templates import apply_system_template, load_template
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine

THREAD = "airline-langchain"
STEERING = ("an earlier exchange with one call per tool in the history; each turn's planned tool forced by "
            "tool_choice until its result is in, then tool_choice=\"none\"")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="hvd", choices=available_methods())
    parser.add_argument("--max-turns", type=int, default=len(TURNS), help="user turns to run (at most 4)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="most tokens per model call")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the conversation's model calls as JSON (replayed by hvd-agents bench-agents)")
    return parser.parse_args(argv)


@wrap_model_call
def steer_tool_choice(request, handler):
    """Force the turn's planned tool until its result is in, then forbid calls (the model answers)."""
    humans = [i for i, m in enumerate(request.messages) if isinstance(m, HumanMessage)]
    turn = len(humans) - sum(m["role"] == "user" for m in EXAMPLE) - 1
    results = sum(isinstance(m, ToolMessage) for m in request.messages[humans[-1]:])
    return handler(request.override(tool_choice=planned_choice(turn, results)))


def main(argv: list[str] | None = None, engine: Engine | None = None) -> tuple[Airline, list, Report]:
    """Run the agent over the user's turns and print each turn and the summary.

    Args:
        argv: command-line arguments (None: ``sys.argv``).
        engine: an engine to use instead of the embedded model's shared one.

    Returns:
        The airline (its ``calls`` log), the thread's messages and the report.
    """
    args = parse_args(argv)
    started = time.perf_counter()
    engine = engine or shared_engine(None, device="cpu")
    print(f"model loaded in {time.perf_counter() - started:.1f} s")
    airline = Airline()
    [system] = apply_system_template([{"role": "system", "content": SYSTEM}], load_template("agent-system"))
    llm = ChatHVD(engine=engine, method=args.method, max_tokens=args.max_new_tokens)
    agent = create_agent(llm, tools=[tool(f) for f in airline.tools()], system_prompt=system["content"],
                         middleware=[steer_tool_choice], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": THREAD}}
    report = Report("airline agent, LangChain create_agent", args.method)
    messages: list = []
    with save_calls(args.save, engine, "airline_langchain", title="airline customer-service agent, LangChain "
                    "create_agent on ChatHVD (look up a user, a reservation, other flights, change it)",
                    command=" ".join(["python examples/airline_langchain.py", *(sys.argv[1:] if argv is None else argv)]),
                    steering=STEERING):
        for index, (question, _) in enumerate(TURNS[:args.max_turns]):
            print(f"\nuser: {question}")
            new = [*convert_to_messages(EXAMPLE), HumanMessage(question)] if index == 0 else [HumanMessage(question)]
            with report.turn(question):
                messages = agent.invoke({"messages": new}, config)["messages"]
            turn = messages[max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage)):]
            for message in turn:
                if isinstance(message, AIMessage):
                    report.add_call(message.response_metadata.get("hvd_stats"))
                    for call in message.tool_calls:
                        print(f"  -> {call['name']}({call['args']})")
                elif isinstance(message, ToolMessage):
                    print(f"     = {message.content[:120]}")
            print(f"assistant: {messages[-1].content}")
    print()
    report.print()
    return airline, messages, report


if __name__ == "__main__":
    main()
