"""HVD (llama-index-llms-hvd): unit tests, real-model tests and LlamaIndex agents.

* Unit tests (no real model): message conversion, tool calls in responses, the call
  plumbing, JSON mode and async behaviour, on a scripted engine (an ``Engine`` on a
  tiny random model whose ``stream`` replays chosen text) and on a tiny real ``Engine``.
* Real-model tests on the embedded SmolLM2-135M-Instruct (``real_engine``): greedy
  equality with the engine's plain AR output, chat / stream / async / completion
  forms, forced tool calls, a two-tool ``FunctionAgent`` loop and a ``ReActAgent`` run.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools import FunctionTool
from llama_index.llms.hvd import HVD
from llama_index.llms.hvd._convert import to_openai_messages

from hvd_agents import Engine, GenerationParams, InvalidRequestError
from hvd_agents.chat.conversation import prepare
from tests.agent_tools import QUESTION, SYSTEM, TOOL_LOG, get_local_time, get_weather, ticking

# ============================================================== tools (the engines are fixtures in conftest.py)


TOOLS = [FunctionTool.from_defaults(get_weather), FunctionTool.from_defaults(get_local_time)]


def _user(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, content=text)


# ============================================================== unit: conversion and metadata


def test_messages_convert_to_openai_shape() -> None:
    messages = [
        ChatMessage(role="system", content="Be brief."),
        _user("Weather in Zürich?"),
        ChatMessage(role="assistant", blocks=[
            ThinkingBlock(content="hmm"), TextBlock(text="Checking."),
            ToolCallBlock(tool_call_id="call_1", tool_name="get_weather", tool_kwargs={"city": "Zürich"}),
        ]),
        ChatMessage(role="tool", content='{"temp": 3}', additional_kwargs={"tool_call_id": "call_1"}),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}),
        ChatMessage(role="chatbot", content="It is 3 degrees."),
    ]
    assert to_openai_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "assistant", "content": "It is 3 degrees."},
    ]
    with pytest.raises(InvalidRequestError, match="text-only"):
        to_openai_messages([ChatMessage(role="user", blocks=[ImageBlock(url="http://example.com/a.png")])])


def test_metadata_and_construction_loading_nothing(monkeypatch, tiny_model, byte_tokenizer) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=())
    llm = HVD(engine=engine, max_tokens=77)
    assert isinstance(llm, FunctionCallingLLM)
    meta = llm.metadata
    assert (meta.context_window, meta.num_output, meta.is_chat_model, meta.is_function_calling_model,
            meta.model_name) == (engine.context_window, 77, True, True, "SmolLM2-135M-Instruct")
    assert HVD(engine=engine, model="my-model", context_window=4096).metadata.context_window == 4096

    def boom(*args, **kwargs):
        raise AssertionError("the engine must not be created before it is needed")

    monkeypatch.setattr("hvd_agents.chat.engine_choice.shared_engine", boom)
    lazy = HVD(model="some/hub-model", device="cpu", tool_choice="required", context_window=4096)
    assert (lazy.metadata.model_name, lazy.metadata.context_window) == ("some/hub-model", 4096)
    lazy.get_tool_calls_from_response(ChatResponse(message=ChatMessage(role="assistant")), error_on_no_tool_call=False)
    with pytest.raises(AssertionError, match="must not be created"):
        lazy.chat([_user("Hello")])
    with pytest.raises(ValueError, match="unknown decoding method"):
        HVD(method="magic")
    with pytest.raises(ValueError, match="unsupported tool_choice"):
        HVD(tool_choice=42)


# ============================================================== unit: tool calls and streaming


def test_stream_holds_tool_calls_and_its_last_response_equals_chat(scripted, fixed_call_ids) -> None:
    engine = scripted(["Let me", " check.", "\n<tool", '_call>\n{"name": "get_weather", ',
                       '"arguments": {"city": "Paris"}}\n</tool_call>'])
    llm = HVD(engine=engine)
    kwargs = llm._prepare_chat_with_tools(TOOLS, user_msg="Weather in Paris?")
    responses = list(llm.stream_chat(**kwargs))
    assert [r.delta for r in responses[:-1]] == ["Let me", " check."]
    assert [r.message.content for r in responses[:-1]] == ["Let me", "Let me check."]
    assert all(not llm.get_tool_calls_from_response(r, error_on_no_tool_call=False) for r in responses[:-1])
    last = responses[-1]
    chat = llm.chat(**kwargs)
    assert last.message.content == chat.message.content == "Let me check."
    expected = [ToolSelection(tool_id="call_0", tool_name="get_weather", tool_kwargs={"city": "Paris"})]
    assert llm.get_tool_calls_from_response(last) == llm.get_tool_calls_from_response(chat) == expected
    assert [type(block) for block in chat.message.blocks] == [TextBlock, ToolCallBlock]
    assert chat.raw["finish_reason"] == "tool_calls" and chat.raw["method"] == "hvd"  # as the server says; the default
    assert {"steps", "drafted_tokens", "accepted_tokens", "per_source"} <= set(chat.raw["hvd_stats"])
    prompt = engine.tokenizer.decode(engine.requests[-1][0])
    assert '"name": "get_local_time"' in prompt  # both schemas are in the system prompt


def test_bad_json_is_reported_never_raised(scripted) -> None:
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>'])
    llm = HVD(engine=engine)
    response = llm.chat_with_tools(TOOLS, user_msg="Weather?")
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    [bad] = response.message.additional_kwargs["invalid_tool_calls"]
    assert bad["name"] == "get_weather" and bad["error"].startswith("invalid JSON")
    with pytest.raises(ValueError, match="invalid JSON"):
        llm.get_tool_calls_from_response(response)
    last = list(llm.stream_chat_with_tools(TOOLS, user_msg="Weather?"))[-1]
    assert last.message.additional_kwargs["invalid_tool_calls"][0]["name"] == "get_weather"


def test_tool_required_constrains_the_reply_to_one_call_and_a_choice_policy_is_applied(scripted) -> None:
    # nothing is pre-filled: the model writes the whole call, "</tool_call>" included, under the call grammar
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'])
    llm = HVD(engine=engine, stop=["Observation:"])
    response = llm.chat_with_tools(TOOLS, user_msg="Weather in Paris?", tool_choice="get_weather")
    assert [(c.tool_name, c.tool_kwargs) for c in llm.get_tool_calls_from_response(response)] == [
        ("get_weather", {"city": "Paris"})]
    assert response.raw["finish_reason"] == "tool_calls"
    prompt_ids, params, _ = engine.requests[-1]
    assert params.stop == ("Observation:",)  # the grammar ends the call, not a stop string
    assert params.constraint.kind == "lark"
    assert '"get_weather"' in params.constraint.source and '"get_local_time"' not in params.constraint.source
    assert engine.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")

    llm.chat_with_tools(TOOLS, user_msg="Weather?", tool_required=True)  # one call to either tool
    prompt_ids, params, _ = engine.requests[-1]
    assert engine.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    assert params.constraint.kind == "lark"
    assert '"get_weather"' in params.constraint.source and '"get_local_time"' in params.constraint.source

    seen: list[int] = []
    policy = HVD(engine=engine, tool_choice=lambda messages: seen.append(len(messages)) or "none")
    policy.chat_with_tools(TOOLS, chat_history=[_user("a"), _user("b")])
    assert seen == [2] and engine.requests[-1][1].stop == ("<tool_call>",)
    assert engine.requests[-1][1].constraint is None  # "none": no grammar, the reply stops before a call


def test_predict_and_call_and_structured_predict_use_forced_calls(scripted) -> None:
    from llama_index.core.bridge.pydantic import BaseModel
    from llama_index.core.prompts import PromptTemplate

    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'])
    llm = HVD(engine=engine)
    TOOL_LOG.clear()
    response = llm.predict_and_call(TOOLS, user_msg="Weather in Paris?", tool_choice="get_weather")
    assert TOOL_LOG == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert json.loads(response.response)["temperature"] == 18

    class City(BaseModel):
        """A city."""

        name: str

    # structured_predict forces a call with one tool (tool_required): the grammar holds it to that tool
    engine.pieces = ['<tool_call>\n{"name": "City", "arguments": {"name": "Paris"}}\n</tool_call>']
    assert llm.structured_predict(City, PromptTemplate("Name a city.")) == City(name="Paris")
    prompt_ids, params, _ = engine.requests[-1]
    assert engine.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    assert params.constraint.kind == "lark" and '"City"' in params.constraint.source


def test_json_mode_asks_for_an_object_and_cuts_the_reply_after_it(scripted) -> None:
    # the model writes the whole object under the grammar; an engine that ignores it is cut after the object
    engine = scripted(['{"city": "Oslo", ', '"country": "Norway"}', "\nThat is all."])
    llm = HVD(engine=engine, json_mode=True)
    response = llm.chat([_user("A city and its country, as JSON.")])
    assert response.message.content == '{"city": "Oslo", "country": "Norway"}'
    prompt = engine.tokenizer.decode(engine.requests[-1][0])
    assert "as JSON.\n\nRespond only with a JSON object.<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert engine.requests[-1][1].constraint.schema() == {"type": "object"}  # any JSON object
    streamed = list(llm.stream_chat([_user("A city and its country, as JSON.")]))
    assert "".join(r.delta for r in streamed) == streamed[-1].message.content == response.message.content
    assert llm.complete("A city and its country, as JSON.").text == response.message.content
    schema = {"type": "object", "properties": {"city": {"type": "string", "description": "the city"},
                                               "country": {"type": "string"}}}
    plain = HVD(engine=engine)  # a call's response_format: "json" or a JSON schema, as LlamaIndex's OpenAI LLM
    assert plain.chat([_user("Name a city.")], response_format=schema).message.content == response.message.content
    prompt = engine.tokenizer.decode(engine.requests[-1][0])
    assert 'with these keys: {"city": "the city", "country": "string"}<|im_end|>' in prompt
    constraint = engine.requests[-1][1].constraint
    assert constraint.kind == "json_schema" and constraint.schema()["properties"] == schema["properties"]
    plain.chat([_user("Name a city.")])
    assert engine.requests[-1][1].constraint is None  # JSON mode is off
    with pytest.raises(InvalidRequestError, match="response_format"):
        plain.chat([_user("Name a city.")], response_format="yaml")


def test_generation_params_session_and_call_overrides(scripted) -> None:
    engine = scripted(["Hi", " there"])
    llm = HVD(engine=engine, model="my-model", method="pld", max_tokens=7, temperature=0.5, top_p=0.9, top_k=5,
              seed=3, num_draft_tokens=4, session_id="s-1")
    response = llm.chat([_user("Hello")])
    prompt_ids, params, structure = engine.requests[-1]
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.seed,
            params.num_draft_tokens, params.method) == (7, 0.5, 0.9, 5, 3, 4, "pld")
    assert structure.session_id == "s-1"
    assert response.raw["model"] == "my-model" and response.raw["usage"]["prompt_tokens"] == len(prompt_ids)
    assert response.additional_kwargs["completion_tokens"] == response.raw["hvd_stats"]["new_tokens"]
    llm.chat([_user("Hello")], max_tokens=3, method="ar", session_id="s-2")
    assert (engine.requests[-1][1].max_new_tokens, engine.requests[-1][1].method) == (3, "ar")
    assert engine.requests[-1][2].session_id == "s-2"
    HVD(engine=engine).chat([_user("Hello")])
    derived = engine.requests[-1][2].session_id
    HVD(engine=engine).chat([_user("Hello"), ChatMessage(role="assistant", content="ok"), _user("More")])
    assert derived and engine.requests[-1][2].session_id == derived  # prepare derives it from the first messages
    with pytest.raises(InvalidRequestError, match="unsupported call arguments"):
        llm.chat([_user("Hello")], max_new_tokens=5)


def test_greedy_output_equals_engine_ar_output_on_tiny_model(tiny_model, byte_tokenizer) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=())
    messages = [{"role": "system", "content": "Echo."}, {"role": "user", "content": "héllo wörld héllo wörld"}]
    expected = engine.generate(prepare(engine, messages).prompt_ids, GenerationParams(method="ar", max_new_tokens=40))
    chat = [ChatMessage(role="system", content="Echo."), _user("héllo wörld héllo wörld")]
    for method in ("ar", "pld", "hvd-cache", "hvd"):
        llm = HVD(engine=engine, method=method, max_tokens=40)
        assert llm.chat(chat).message.content == expected.text
        assert "".join(r.delta for r in llm.stream_chat(chat)) == expected.text


# ============================================================== unit: async on a scripted slow engine


@pytest.mark.asyncio
async def test_async_forms_do_not_block_the_event_loop(scripted) -> None:
    engine = scripted([f"w{i} " for i in range(20)], delay=0.03)  # ~0.6 s of "decoding" in the worker
    llm = HVD(engine=engine)

    async def run() -> tuple[list[ChatResponse], ChatResponse]:
        streamed = [r async for r in await llm.astream_chat([_user("Hello")])]
        return streamed, await llm.achat([_user("Hello")])

    (streamed, response), ticks = await ticking(run())
    assert "".join(r.delta for r in streamed) == response.message.content == "".join(engine.pieces)
    assert streamed[-1].message.content == response.message.content
    assert ticks >= 40  # the loop ran all along (a blocked loop would tick about once)


@pytest.mark.asyncio
async def test_cancelling_astream_chat_closes_the_engine_iterator(scripted) -> None:
    engine = scripted([f"w{i} " for i in range(500)], delay=0.01)  # 5 s if run to the end
    llm = HVD(engine=engine)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in await llm.astream_chat([_user("Hello")]):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.closed == 1 and engine.completed == 0 and engine.emitted < 100


@pytest.mark.asyncio
async def test_async_errors_propagate_as_themselves(scripted) -> None:
    llm = HVD(engine=scripted(["ok"]))
    with pytest.raises(InvalidRequestError, match="max_new_tokens"):
        await llm.achat([_user("Hello")], max_tokens=0)
    with pytest.raises(InvalidRequestError):
        async for _ in await llm.astream_chat([]):
            pass


# ============================================================== real model: equality, async, tools, agents


real_model_test = pytest.mark.real_model

GREEDY_CASES = [
    [_user("List three prime numbers.")],
    [ChatMessage(role="system", content=SYSTEM), _user("What is the capital of France? Answer in one sentence."),
     ChatMessage(role="assistant", content="The capital of France is Paris."), _user("And of Italy?")],
]


@real_model_test
@pytest.mark.parametrize("case", range(len(GREEDY_CASES)))
def test_greedy_chat_and_completion_equal_engine_ar_output(real_engine, case) -> None:
    messages = GREEDY_CASES[case]
    structure = prepare(real_engine, to_openai_messages(messages))
    expected = real_engine.generate(structure.prompt_ids, GenerationParams(method="ar", max_new_tokens=32))
    llm = HVD(engine=real_engine, method="hvd-cache", max_tokens=32)
    response = llm.chat(messages)
    assert response.message.content == expected.text
    assert response.raw["usage"]["completion_tokens"] == len(expected.token_ids)
    streamed = list(llm.stream_chat(messages))
    assert len(streamed) > 1 and "".join(r.delta for r in streamed) == streamed[-1].message.content == expected.text
    if len(messages) == 1:  # a completion is a chat on one user message
        assert llm.complete(messages[0].content).text == expected.text
        assert "".join(r.delta for r in llm.stream_complete(messages[0].content)) == expected.text


@real_model_test
@pytest.mark.asyncio
async def test_async_chat_and_completion_keep_the_loop_running(real_engine) -> None:
    llm = HVD(engine=real_engine, max_tokens=24)
    prompt = "Write a short poem about the sea."
    expected = (await asyncio.to_thread(llm.chat, [_user(prompt)])).message.content

    async def run() -> list[str]:
        streamed = [r async for r in await llm.astream_chat([_user(prompt)])]
        assert len(streamed) > 1 and "".join(r.delta for r in streamed) == streamed[-1].message.content
        completions = [r async for r in await llm.astream_complete(prompt)]
        return [streamed[-1].message.content, (await llm.achat([_user(prompt)])).message.content,
                (await llm.acomplete(prompt)).text, completions[-1].text]

    started = time.perf_counter()
    texts, ticks = await ticking(run())
    elapsed = time.perf_counter() - started
    assert texts == [expected] * 4
    assert ticks >= min(20, int(elapsed / 0.01) // 4)  # a blocked loop would tick once or twice


def _example_exchange() -> list[ChatMessage]:
    """An earlier turn of the conversation that shows the two-tool pattern (as in hvd_agents/demo.py)."""

    def call(name: str, kwargs: dict, call_id: str) -> ChatMessage:
        return ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_call_id=call_id, tool_name=name,
                                                                   tool_kwargs=kwargs)])

    def result(payload: dict, call_id: str) -> ChatMessage:
        return ChatMessage(role="tool", content=json.dumps(payload), additional_kwargs={"tool_call_id": call_id})

    return [
        _user("What's the weather like in London today, and what time is it there?"),
        call("get_weather", {"city": "London", "unit": "celsius"}, "call_1"),
        result({"city": "London", "temperature": 14, "unit": "celsius", "condition": "partly cloudy"}, "call_1"),
        call("get_local_time", {"city": "London"}, "call_2"),
        result({"city": "London", "time": "09:30"}, "call_2"),
        ChatMessage(role="assistant",
                    content="It is 14 degrees celsius and partly cloudy in London, and the local time is 09:30."),
    ]




def _tool_choice_for(messages) -> str:
    """Force a call until this turn has two tool results, then forbid calls (the model answers)."""
    last_user = max(i for i, m in enumerate(messages) if m.role == MessageRole.USER)
    results = sum(m.role == MessageRole.TOOL for m in messages[last_user:])
    return "required" if results < 2 else "none"


@real_model_test
def test_forced_tool_call_is_parsed_and_streamed(real_engine) -> None:
    llm = HVD(engine=real_engine, max_tokens=64)
    history = [ChatMessage(role="system", content=SYSTEM), *_example_exchange()]
    response = llm.chat_with_tools(TOOLS, user_msg=QUESTION, chat_history=list(history), tool_required=True)
    [selection] = llm.get_tool_calls_from_response(response)
    assert (selection.tool_name, selection.tool_kwargs["city"]) == ("get_weather", "Paris")
    assert selection.tool_id.startswith("call_") and response.raw["hvd_stats"]["steps"] >= 1
    streamed = list(llm.stream_chat_with_tools(TOOLS, user_msg=QUESTION, chat_history=list(history),
                                               tool_required=True))
    [streamed_selection] = llm.get_tool_calls_from_response(streamed[-1])
    assert (streamed_selection.tool_name, streamed_selection.tool_kwargs) == ("get_weather", selection.tool_kwargs)
    assert streamed[-1].message.content == response.message.content


@real_model_test
@pytest.mark.asyncio
async def test_function_agent_runs_a_two_tool_loop(real_engine, monkeypatch) -> None:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

    sessions: list[str] = []

    def recording_prepare(engine, messages, tools=None, **kwargs):
        structure = prepare(engine, messages, tools, **kwargs)
        sessions.append(structure.session_id)
        return structure

    monkeypatch.setattr("hvd_agents.chat.request.prepare", recording_prepare)
    TOOL_LOG.clear()
    agent = FunctionAgent(tools=TOOLS, llm=HVD(engine=real_engine, max_tokens=64, tool_choice=_tool_choice_for),
                          system_prompt=SYSTEM)
    handler = agent.run(user_msg=QUESTION, chat_history=_example_exchange())
    results = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
    output = await handler
    assert [(name, args["city"]) for name, args in TOOL_LOG] == [("get_weather", "Paris"), ("get_local_time", "Paris")]
    assert [r.tool_name for r in results] == ["get_weather", "get_local_time"] and not any(
        r.tool_output.is_error for r in results)
    assert json.loads(results[1].tool_output.content)["time"] == "10:30"
    assert [c.tool_name for c in output.tool_calls] == ["get_weather", "get_local_time"]  # the run's results
    assert str(output.response.content).strip()
    # three model calls (two forced calls, then the answer), all registered under one conversation key
    assert len(sessions) == 3 and len(set(sessions)) == 1 and sessions[0]


def _react_prefix(messages) -> str:
    """ReAct's counterpart of a forced tool choice: name the action until an observation came back."""
    if messages[-1].role == MessageRole.USER and (messages[-1].content or "").startswith("Observation:"):
        return "Thought:"
    return "Thought: I need to use a tool to help me answer the question.\nAction: get_weather\nAction Input:"


@real_model_test
@pytest.mark.asyncio
async def test_react_agent_calls_a_tool_and_answers(real_engine) -> None:
    from llama_index.core.agent.workflow import ReActAgent

    # an earlier turn as ReActAgent keeps it in memory: its reasoning, observation and answer
    example = [
        _user("What's the weather like in London today?"),
        ChatMessage(role="assistant", content=(
            "Thought: I need to use a tool to help me answer the question.\n"
            'Action: get_weather\nAction Input: {"city": "London"}\n'
            'Observation: {"city": "London", "temperature": 14, "unit": "celsius", "condition": "partly cloudy"}\n'
            "Thought: I can answer without using any more tools.\n"
            "Answer: It is 14 degrees celsius and partly cloudy in London.")),
    ]
    TOOL_LOG.clear()
    llm = HVD(engine=real_engine, max_tokens=64, stop=["Observation:"], reply_prefix=_react_prefix)
    agent = ReActAgent(tools=TOOLS, llm=llm, system_prompt=SYSTEM)
    output = await agent.run(user_msg="What's the weather like in Paris today?", chat_history=example,
                             max_iterations=4)
    assert [(name, args["city"]) for name, args in TOOL_LOG] == [("get_weather", "Paris")]
    assert "18" in str(output.response.content)  # the observed temperature reached the answer
