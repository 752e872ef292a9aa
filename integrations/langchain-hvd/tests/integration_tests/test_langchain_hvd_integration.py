"""ChatHVD on the embedded SmolLM2-135M-Instruct: LangChain's standard integration suite and agents.

Greedy equality with the engine's plain AR output, a forced tool call streamed and
invoked, a two-tool agent loop with ``langchain.agents.create_agent`` (invoked, and
streamed: each call's ``tool_call_chunks`` while it is written) and with a
LangGraph ``StateGraph``, and async behaviour (the loop keeps running, cancellation
stops generation). The model is loaded once per pytest session (``real_engine`` and
the suite's ``ChatHVD(device="cpu")`` share ``shared_engine(None, device="cpu")``).
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import reduce
from operator import add

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_hvd import ChatHVD
from langchain_hvd._convert import to_openai_messages
from langchain_tests.integration_tests import ChatModelIntegrationTests

from hvd_agents import GenerationParams
from hvd_agents.chat.conversation import prepare
from tests import agent_tools
from tests.agent_tools import QUESTION, SYSTEM, TOOL_LOG, ticking


def _calls(message: BaseMessage) -> list[tuple[str, dict]]:
    return [(call["name"], call["args"]) for call in message.tool_calls]


# ============================================================== LangChain's standard integration suite


@pytest.mark.real_model
class TestChatHVDStandardIntegration(ChatModelIntegrationTests):
    """The standard integration suite on the embedded SmolLM2-135M-Instruct (greedy, 48 tokens a call).

    Its coroutine tests carry no asyncio mark: they run under ``asyncio_mode = "auto"``
    (pyproject.toml), the mode langchain-tests is written for. The tests overridden
    here are expected failures, each with the reason the 135M model fails it.
    """

    @property
    def chat_model_class(self) -> type[ChatHVD]:
        return ChatHVD

    @property
    def chat_model_params(self) -> dict:
        return {"device": "cpu", "max_tokens": 48}  # the engine of the `real_engine` fixture (shared_engine)

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "smollm2-135m-instruct"  # the embedded model's alias: a second shared engine

    @pytest.mark.xfail(reason=(
        "forced into a unicode_customer call, SmolLM2-135M names the customer right but writes a description "
        "('A Chinese technology company that specializes in creating ...') that runs past the suite's "
        "max_tokens of 48: the call is cut, so none is parsed; the grammar keeps it valid, not short"), strict=False)
    def test_unicode_tool_call_integration(
        self, model: BaseChatModel, *, tool_choice: str | None = None, force_tool_call: bool = True
    ) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice, force_tool_call=force_tool_call)

    @pytest.mark.xfail(reason=(
        "with tool_choice='auto' SmolLM2-135M answers 'What is the weather in San Francisco, CA?' in prose "
        "instead of opening a call: the lazy grammar holds a call once opened, it cannot make the model open one"), strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=(
        "in JSON mode SmolLM2-135M writes a setup that repeats 'the cat was having a cat-themed party, and' "
        "past the suite's max_tokens of 48: the grammar keeps the object valid but cannot end a string the "
        "model keeps writing, so the reply is cut"), strict=False)
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)


# ============================================================== real model: equality, tools, agents, async


real_model_test = pytest.mark.real_model

GREEDY_CASES = [
    [HumanMessage("List three prime numbers.")],
    [SystemMessage(SYSTEM), HumanMessage("What is the capital of France? Answer in one sentence.")],
    [HumanMessage("hello"), AIMessage("Hello! How can I help you today?"), HumanMessage("Tell me about cats.")],
]


@real_model_test
@pytest.mark.parametrize("case", range(len(GREEDY_CASES)))
def test_greedy_chat_output_equals_engine_ar_output(real_engine, case) -> None:
    messages = GREEDY_CASES[case]
    structure = prepare(real_engine, to_openai_messages(messages))
    expected = real_engine.generate(structure.prompt_ids, GenerationParams(method="ar", max_new_tokens=48))
    message = ChatHVD(engine=real_engine, method="hvd-cache", max_tokens=48).invoke(messages)
    assert message.content == expected.text
    assert message.usage_metadata["output_tokens"] == len(expected.token_ids)
    streamed = "".join(chunk.content for chunk in ChatHVD(engine=real_engine, max_tokens=48).stream(messages))
    assert streamed == expected.text


TOOLS: list[BaseTool] = [tool(agent_tools.get_weather), tool(agent_tools.get_local_time)]


def _example_exchange() -> list[BaseMessage]:
    """An earlier turn of the conversation that shows the two-tool pattern (as in hvd_agents/demo.py)."""

    def call(name: str, args: dict, call_id: str) -> dict:
        return {"name": name, "args": args, "id": call_id, "type": "tool_call"}

    return [
        HumanMessage("What's the weather like in London today, and what time is it there?"),
        AIMessage("", tool_calls=[call("get_weather", {"city": "London", "unit": "celsius"}, "call_1")]),
        ToolMessage(json.dumps({"city": "London", "temperature": 14, "unit": "celsius",
                                "condition": "partly cloudy"}), tool_call_id="call_1"),
        AIMessage("", tool_calls=[call("get_local_time", {"city": "London"}, "call_2")]),
        ToolMessage(json.dumps({"city": "London", "time": "09:30"}), tool_call_id="call_2"),
        AIMessage("It is 14 degrees celsius and partly cloudy in London, and the local time is 09:30."),
    ]




def _tool_choice_for(messages: list[BaseMessage]) -> str:
    """Force a call until this turn has two tool results, then forbid calls (the model answers)."""
    last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    results = sum(isinstance(m, ToolMessage) for m in messages[last_human:])
    return "required" if results < 2 else "none"


def _check_tool_loop(messages: list[BaseMessage]) -> None:
    turn = messages[max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage)):]
    calls = [call for m in turn if isinstance(m, AIMessage) for call in m.tool_calls]
    assert [c["name"] for c in calls] == ["get_weather", "get_local_time"]
    assert all(c["args"]["city"] == "Paris" for c in calls)
    assert [name for name, _ in TOOL_LOG] == ["get_weather", "get_local_time"]
    assert all(args["city"] == "Paris" for _, args in TOOL_LOG)
    results = [m for m in turn if isinstance(m, ToolMessage)]
    assert [r.tool_call_id for r in results] == [c["id"] for c in calls]
    assert json.loads(results[0].content)["temperature"] == 18 and json.loads(results[1].content)["time"] == "10:30"
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and final.content.strip()


@real_model_test
def test_forced_tool_call_streams_like_invoke(real_engine) -> None:
    model = ChatHVD(engine=real_engine, max_tokens=64).bind_tools(TOOLS, tool_choice="required")
    messages = [SystemMessage(SYSTEM), *_example_exchange(), HumanMessage(QUESTION)]
    message = model.invoke(messages)
    assert [(c["name"], c["args"]["city"]) for c in message.tool_calls] == [("get_weather", "Paris")]
    assert message.tool_calls[0]["id"].startswith("call_")
    full = reduce(add, model.stream(messages))
    assert full.content == message.content
    assert _calls(full) == _calls(message)
    assert full.usage_metadata == message.usage_metadata
    assert message.response_metadata["hvd_stats"]["steps"] >= 1


@real_model_test
def test_create_agent_runs_a_two_tool_loop(real_engine) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call
    def steer_tool_choice(request, handler):
        return handler(request.override(tool_choice=_tool_choice_for(request.messages)))

    TOOL_LOG.clear()
    agent = create_agent(ChatHVD(engine=real_engine, max_tokens=64), tools=TOOLS, system_prompt=SYSTEM,
                         middleware=[steer_tool_choice])
    result = agent.invoke({"messages": [*_example_exchange(), HumanMessage(QUESTION)]})
    _check_tool_loop(result["messages"])


@real_model_test
def test_create_agent_streams_each_tool_call_while_it_is_written(real_engine) -> None:
    """``stream_mode="messages"``: each forced call's ``tool_call_chunks`` come before its model call's last chunk."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call
    def steer_tool_choice(request, handler):
        return handler(request.override(tool_choice=_tool_choice_for(request.messages)))

    TOOL_LOG.clear()
    agent = create_agent(ChatHVD(engine=real_engine, max_tokens=64), tools=TOOLS, system_prompt=SYSTEM,
                         middleware=[steer_tool_choice])
    state, calls, chunks = None, [], []
    for mode, payload in agent.stream({"messages": [*_example_exchange(), HumanMessage(QUESTION)]},
                                      stream_mode=["messages", "values"]):
        if mode == "values":
            state = payload
        elif isinstance(payload[0], AIMessageChunk):
            chunks.append(payload[0])
            if chunks[-1].chunk_position == "last":
                calls.append(chunks)
                chunks = []
    _check_tool_loop(state["messages"])
    assert len(calls) == 3  # get_weather, get_local_time, the answer
    for model_call, name in zip(calls[:2], ["get_weather", "get_local_time"]):
        first = next(chunk for chunk in model_call if chunk.tool_call_chunks)
        assert first is not model_call[-1] and first.tool_call_chunks[0]["name"] == name
        assert _calls(reduce(add, model_call))[0][0] == name


@real_model_test
def test_langgraph_state_graph_runs_a_two_tool_loop_in_its_thread(real_engine, monkeypatch) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    import hvd_agents.chat.request

    sessions: list[str | None] = []

    def recording_prepare(engine, messages, tools=None, **kwargs):
        sessions.append(kwargs.get("session_id"))
        return prepare(engine, messages, tools, **kwargs)

    monkeypatch.setattr(hvd_agents.chat.request, "prepare", recording_prepare)
    llm = ChatHVD(engine=real_engine, max_tokens=64)

    def agent(state: MessagesState) -> dict:
        messages = state["messages"]
        return {"messages": [llm.bind_tools(TOOLS, tool_choice=_tool_choice_for(messages)).invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())

    TOOL_LOG.clear()
    config = {"configurable": {"thread_id": "weather-thread-1"}}
    result = app.invoke({"messages": [SystemMessage(SYSTEM), *_example_exchange(), HumanMessage(QUESTION)]}, config)
    _check_tool_loop(result["messages"])
    # every model call registered the conversation in the cache store under LangGraph's thread id
    assert sessions == ["weather-thread-1"] * 3


@real_model_test
@pytest.mark.asyncio
async def test_ainvoke_and_astream_keep_the_loop_running(real_engine) -> None:
    model = ChatHVD(engine=real_engine, max_tokens=48)
    messages = [HumanMessage("Write a short poem about the sea.")]
    expected = await asyncio.to_thread(model.invoke, messages)

    async def run() -> tuple[list[AIMessageChunk], AIMessage]:
        return [chunk async for chunk in model.astream(messages)], await model.ainvoke(messages)

    started = time.perf_counter()
    (chunks, message), ticks = await ticking(run())
    elapsed = time.perf_counter() - started
    assert "".join(chunk.content for chunk in chunks) == message.content == expected.content
    assert len(chunks) > 1
    assert ticks >= min(20, int(elapsed / 0.01) // 4)  # a blocked loop would tick once or twice


@real_model_test
@pytest.mark.asyncio
async def test_cancelled_astream_stops_generation_and_frees_the_engine(real_engine) -> None:
    model = ChatHVD(engine=real_engine, max_tokens=400, stop=None)
    first = asyncio.Event()
    received = 0

    async def consume() -> None:
        nonlocal received
        async for _ in model.astream("Write a very long story about a lighthouse keeper."):
            received += 1
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 120)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not real_engine._lock.locked()  # the worker closed the engine iterator before the task ended
    assert received < 200
    follow_up = await asyncio.wait_for(model.ainvoke("Say hi.", max_tokens=8), 120)
    assert follow_up.content and follow_up.response_metadata["finish_reason"] in ("stop", "length")
