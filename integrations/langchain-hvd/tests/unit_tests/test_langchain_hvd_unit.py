"""ChatHVD unit tests: no real model (LangChain's standard unit suite included).

Message conversion, tool-call chunking and the call plumbing (settings, usage and
metadata, JSON mode, structured output, validation, async behaviour), on a scripted
engine (an ``Engine`` on a tiny random model whose ``stream`` replays chosen text;
the ``scripted`` fixture) and on a tiny real ``Engine``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from functools import reduce
from operator import add
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_hvd import ChatHVD
from langchain_hvd._convert import to_openai_messages, unreadable_tail
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import ValidationError

from hvd_agents import Engine, GenerationParams, InvalidRequestError
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.reply_options import normalize_tool_choice
from hvd_agents.chat.toolcalls import parse_tool_calls
from tests.agent_tools import TOOL_LOG, get_weather, ticking
from tests.scripted import ScriptsEngine

WEATHER_SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _calls(message: BaseMessage) -> list[tuple[str, dict]]:
    return [(call["name"], call["args"]) for call in message.tool_calls]


# ============================================================== unit: message conversion


def test_messages_convert_to_openai_shape() -> None:
    call = {"name": "get_weather", "args": {"city": "Zürich"}, "id": "call_1", "type": "tool_call"}
    messages = [
        SystemMessage("Be brief."),
        HumanMessage("Weather in Zürich?", name="someone"),
        AIMessage("Checking.", tool_calls=[call]),
        ToolMessage('{"temp": 3}', tool_call_id="call_1", name="get_weather"),
        AIMessage("It is 3 degrees."),
        ChatMessage(role="human", content="Thanks"),
    ]
    assert to_openai_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
        {"role": "assistant", "content": "It is 3 degrees."},
        {"role": "user", "content": "Thanks"},
    ]


def test_list_content_keeps_text_and_drops_tool_and_reasoning_blocks() -> None:
    ai = AIMessage(
        [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "some text"},
         {"type": "tool_use", "id": "abc", "name": "f", "input": {"a": 1}}],
        tool_calls=[{"name": "f", "args": {"a": 1}, "id": "abc", "type": "tool_call"}],
    )
    human = HumanMessage(["first", {"type": "text", "text": "second"}])
    converted = to_openai_messages([human, ai])
    assert converted[0]["content"] == "first\nsecond"
    assert converted[1]["content"] == "some text"
    assert converted[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_non_text_content_and_unknown_roles_are_rejected() -> None:
    image = HumanMessage([{"type": "text", "text": "what is this"},
                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
    with pytest.raises(InvalidRequestError, match="text-only"):
        to_openai_messages([image])
    with pytest.raises(InvalidRequestError, match="role"):
        to_openai_messages([ChatMessage(role="narrator", content="x")])


def test_converted_history_renders_tool_calls_and_results_into_the_prompt(byte_tokenizer, tiny_model) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=())
    call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_9", "type": "tool_call"}
    history = [HumanMessage("Weather in Oslo?"), AIMessage("", tool_calls=[call]),
               ToolMessage('{"temp": -2}', tool_call_id="call_9")]
    structure = prepare(engine, to_openai_messages(history), [WEATHER_SCHEMA])
    text = byte_tokenizer.decode(structure.prompt_ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp": -2}\n</tool_response>' in text
    assert '"name": "get_weather"' in text.split("<tool_call>")[0]  # the schema is in the system prompt


@pytest.mark.parametrize(
    ("choice", "expected"),
    [(None, None), ("auto", None), ("none", "none"), (False, "none"), ("any", "required"), ("required", "required"),
     (True, "required"), ("get_weather", "get_weather"),
     ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
     ({"name": "get_weather"}, "get_weather")],
)
def test_tool_choice_normalization(choice, expected) -> None:
    assert normalize_tool_choice(choice) == expected


def test_bad_tool_choices_are_refused_at_bind_time() -> None:
    with pytest.raises(InvalidRequestError):
        normalize_tool_choice(42)
    with pytest.raises(InvalidRequestError, match="names no available tool"):
        ChatHVD().bind_tools([WEATHER_SCHEMA], tool_choice="get_time")
    with pytest.raises(InvalidRequestError, match="at least one tool"):
        ChatHVD().bind_tools([], tool_choice="required")


# ============================================================== unit: tool-call chunking

SPLIT_TEXTS = [
    "Plain answer, no calls.",
    "  padded answer \n",
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}\n'
        "</tool_call>\nDone."
    ),
    'Before <tool_call>\n{"name": "broken", "arguments": {"x": }\n</tool_call> after',
    'Cut short <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
    "A stray <tool is not a call, nor is <tool_c or </tool_call>",
    "Ends with a partial tag <tool_ca",
]


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_any_split_streams_the_whole_reply_parse(scripted, text) -> None:
    whole = parse_tool_calls(text)
    cuts = [[], list(range(1, len(text))), list(range(3, len(text), 7)), list(range(5, len(text), 11))]
    for points in cuts:
        pieces = [text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])]
        chunks = list(ChatHVD(engine=scripted(pieces)).bind_tools([WEATHER_SCHEMA]).stream("Weather?"))
        full = reduce(add, chunks)
        assert full.content == whole.content and "<tool_call>" not in "".join(c.content for c in chunks)
        assert _calls(full) == [(call.name, call.arguments) for call in whole.tool_calls]
        assert [bad["name"] for bad in full.invalid_tool_calls] == [bad.name for bad in whole.invalid_tool_calls]
        assert sum(chunk.chunk_position == "last" for chunk in chunks) == 1


def test_a_forced_calls_name_streams_with_the_first_chunk(scripted) -> None:
    # the model writes the whole call under its grammar, "</tool_call>" included
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": ', '"Paris"}', "}\n</tool_call>"])
    chunks = list(ChatHVD(engine=engine).bind_tools([WEATHER_SCHEMA], tool_choice="get_weather").stream("Weather?"))
    first = chunks[0].tool_call_chunks
    assert [(c["name"], c["args"], c["index"]) for c in first] == [("get_weather", '{"city": ', 0)]
    assert [c["args"] for chunk in chunks[1:] for c in chunk.tool_call_chunks] == ['"Paris"}']
    full = reduce(add, chunks)
    assert _calls(full) == [("get_weather", {"city": "Paris"})] and full.response_metadata["finish_reason"] == "tool_calls"


def test_stream_yields_tool_call_chunks_as_generated_and_equals_invoke(scripted, fixed_call_ids) -> None:
    engine = scripted(["Let me", " check.", "\n<tool", '_call>\n{"name": "get_weather", ',
                       '"arguments": {"city": ', '"Paris"}}\n</tool_call>'])
    model = ChatHVD(engine=engine).bind_tools([WEATHER_SCHEMA])
    chunks = list(model.stream("Weather in Paris?"))
    assert [chunk.content for chunk in chunks] == ["Let me", " check.", "", ""]
    assert [c["name"] for c in chunks[2].tool_call_chunks] == ["get_weather"]  # the name as soon as it is read
    assert chunks[2].chunk_position is None and chunks[-1].chunk_position == "last"
    assert [c["args"] for chunk in chunks for c in chunk.tool_call_chunks] == ['{"city": ', '"Paris"}']
    full = reduce(add, chunks)
    message = model.invoke("Weather in Paris?")
    assert isinstance(message, AIMessage) and not isinstance(message, AIMessageChunk)
    assert full.content == message.content == "Let me check."
    assert full.tool_calls == message.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_0", "type": "tool_call"}
    ]
    assert full.invalid_tool_calls == message.invalid_tool_calls == []
    assert full.usage_metadata == message.usage_metadata
    assert full.response_metadata == message.response_metadata


def test_bad_json_becomes_an_invalid_tool_call_never_an_exception(scripted) -> None:
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>'])
    model = ChatHVD(engine=engine).bind_tools([WEATHER_SCHEMA])
    message = model.invoke("Weather?")
    assert message.tool_calls == []
    [bad] = message.invalid_tool_calls
    assert bad["name"] == "get_weather" and bad["error"].startswith("invalid JSON") and bad["id"]
    full = reduce(add, model.stream("Weather?"))
    assert full.tool_calls == [] and len(full.invalid_tool_calls) == 1
    [error] = full.response_metadata["invalid_tool_call_errors"].values()  # chunks cannot carry .error
    assert error.startswith("invalid JSON")


def test_a_cut_short_call_stays_invalid_when_chunks_are_aggregated(scripted) -> None:
    # LangChain re-parses aggregated tool_call_chunks with a lenient partial-JSON parser;
    # an unterminated call must not come back as a valid one.
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'], finish="length")
    model = ChatHVD(engine=engine).bind_tools([WEATHER_SCHEMA])
    for message in (model.invoke("Weather?"), reduce(add, model.stream("Weather?"))):
        assert message.tool_calls == []
        assert [bad["name"] for bad in message.invalid_tool_calls] == ["get_weather"]
    assert model.invoke("Weather?").invalid_tool_calls[0]["error"] == "unterminated <tool_call> block"


def test_create_agent_streams_a_tool_call_before_its_last_chunk(tiny_model, byte_tokenizer) -> None:
    """``stream_mode="messages"`` shows a call's ``tool_call_chunks`` while the model still writes it."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    engine = ScriptsEngine(tiny_model, byte_tokenizer, [["Checking.", call[:40], call[40:52], call[52:]],
                                                        ["It is", " 18 degrees."]])
    TOOL_LOG.clear()
    agent = create_agent(ChatHVD(engine=engine), tools=[tool(get_weather)])
    streamed = [message for message, _ in agent.stream({"messages": [HumanMessage("Weather in Paris?")]},
                                                       stream_mode="messages")]
    chunks = [message for message in streamed if isinstance(message, AIMessageChunk)]
    ends = [index for index, chunk in enumerate(chunks) if chunk.chunk_position == "last"]
    assert len(ends) == 2  # two model calls: the tool call, then the answer
    with_calls = [index for index, chunk in enumerate(chunks) if chunk.tool_call_chunks]
    assert with_calls and with_calls[0] < ends[0]  # before the first call's last chunk
    assert chunks[with_calls[0]].tool_call_chunks[0]["name"] == "get_weather"
    first = reduce(add, chunks[: ends[0] + 1])
    assert _calls(first) == [("get_weather", {"city": "Paris"})] and first.content == "Checking."
    assert TOOL_LOG == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert "".join(chunk.content for chunk in chunks[ends[0] + 1 :]) == "It is 18 degrees."


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from('{}[]"\\:, a1\n'), max_size=24))
def test_an_unreadable_tail_keeps_any_argument_text_from_reading_as_a_call(text) -> None:
    arguments = "{" + text
    tail = unreadable_tail(arguments)
    chunk = AIMessageChunk(content="", tool_call_chunks=[tool_call_chunk(name="f", args=arguments + tail, id="c",
                                                                         index=0)])
    assert chunk.tool_calls == [] and len(chunk.invalid_tool_calls) == 1
    if tail == "":  # nothing added where LangChain reads no object already
        assert AIMessageChunk(content="", tool_call_chunks=[tool_call_chunk(name="f", args=arguments, id="c",
                                                                            index=0)]).tool_calls == []


@pytest.mark.parametrize(
    "choice", ["required", "get_weather", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_choice_constrains_the_reply_to_one_call(scripted, choice) -> None:
    # "required" with one tool is that tool; nothing is pre-filled: the grammar holds the whole call, its end included
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'])
    message = ChatHVD(engine=engine, stop=["Observation:"]).bind_tools([WEATHER_SCHEMA], tool_choice=choice).invoke(
        "Weather in Paris?", stop=["\n\n"]
    )
    assert _calls(message) == [("get_weather", {"city": "Paris"})]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    prompt_ids, params, _ = engine.requests[-1]
    assert params.stop == ("Observation:", "\n\n")  # the grammar ends the call, not a stop string
    assert params.constraint.kind == "lark" and '"get_weather"' in params.constraint.source
    assert engine.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")


def test_tool_choice_none_stops_at_a_tool_call(scripted) -> None:
    engine = scripted(["It is sunny."])
    ChatHVD(engine=engine).bind_tools([WEATHER_SCHEMA], tool_choice="none").invoke("Weather?")
    assert engine.requests[-1][1].stop == ("<tool_call>",)


def test_metadata_usage_and_generation_params(scripted) -> None:
    engine = scripted(["Hi", " there"])
    model = ChatHVD(engine=engine, model="my-model", method="pld", max_tokens=7, temperature=0.5, top_p=0.9,
                    top_k=5, seed=3, num_draft_tokens=4)
    message = model.invoke("Hello")
    params = engine.requests[-1][1]
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.seed,
            params.num_draft_tokens, params.method) == (7, 0.5, 0.9, 5, 3, 4, "pld")
    prompt_tokens = len(engine.requests[-1][0])
    output_tokens = sum(len(engine.tokenizer(piece, add_special_tokens=False).input_ids) for piece in engine.pieces)
    assert message.usage_metadata == {"input_tokens": prompt_tokens, "output_tokens": output_tokens,
                                      "total_tokens": prompt_tokens + output_tokens}
    meta = message.response_metadata
    assert (meta["model_name"], meta["model_provider"], meta["finish_reason"], meta["method"]) == (
        "my-model", "hvd", "stop", "pld")
    assert {"steps", "drafted_tokens", "accepted_tokens", "per_source"} <= set(meta["hvd_stats"])
    model.invoke("Hello", max_tokens=3, temperature=0.0, method="ar")  # per-call overrides
    assert (engine.requests[-1][1].max_new_tokens, engine.requests[-1][1].method) == (3, "ar")
    assert model._get_ls_params(stop=["x"]) == {
        "ls_provider": "hvd", "ls_model_name": "my-model", "ls_model_type": "chat", "ls_temperature": 0.5,
        "ls_max_tokens": 7, "ls_stop": ["x"]}


def test_session_id_comes_from_the_thread_id(scripted) -> None:
    from langchain_core.runnables import RunnableLambda

    engine = scripted(["ok"])
    model = ChatHVD(engine=engine)
    model.invoke("Hello", config={"configurable": {"thread_id": "thread-7"}})
    assert engine.requests[-1][2].session_id == "thread-7"
    (RunnableLambda(lambda x: x) | model).invoke("Hello", config={"configurable": {"thread_id": "thread-8"}})
    assert engine.requests[-1][2].session_id == "thread-8"
    model.invoke("Hello", session_id="explicit")
    assert engine.requests[-1][2].session_id == "explicit"
    model.invoke("Hello")
    derived = engine.requests[-1][2].session_id
    model.invoke([HumanMessage("Hello"), AIMessage("ok"), HumanMessage("More")])
    assert derived and engine.requests[-1][2].session_id == derived  # prepare derives it from the first messages


def test_json_response_format_is_constrained_and_trimmed_to_the_object(scripted) -> None:
    # the model writes the whole object under the schema's grammar; an engine that ignores it is cut after the object
    engine = scripted(['{"setup": "Why?", ', '"punchline": "Because {braces} \\" in strings"}', " and more text"])
    schema = {"type": "object", "properties": {"setup": {"type": "string", "description": "the question"},
                                               "punchline": {"type": "string"}}}
    model = ChatHVD(engine=engine).bind(response_format=schema)
    message = model.invoke("Tell me a joke.")
    assert json.loads(message.content) == {"setup": "Why?", "punchline": 'Because {braces} " in strings'}
    assert "".join(chunk.content for chunk in model.stream("Tell me a joke.")) == message.content
    prompt = engine.tokenizer.decode(engine.requests[-1][0])
    assert 'with these keys: {"setup": "the question", "punchline": "string"}<|im_end|>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    constraint = engine.requests[-1][1].constraint
    assert constraint.kind == "json_schema" and constraint.schema()["properties"] == schema["properties"]


def test_json_mode_asks_for_an_object_and_parses_the_first_one(scripted) -> None:
    engine = scripted(['{"city": "Oslo", ', '"country": "Norway"}', "\nThat is all."])
    runnable = ChatHVD(engine=engine).with_structured_output(method="json_mode")
    assert runnable.invoke("A city and its country, as JSON.") == {"city": "Oslo", "country": "Norway"}
    prompt = engine.tokenizer.decode(engine.requests[-1][0])
    assert "as JSON.\n\nRespond only with a JSON object.<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert engine.requests[-1][1].constraint.schema() == {"type": "object"}  # any JSON object
    message = ChatHVD(engine=engine).invoke("A city, as JSON.", response_format={"type": "json_object"})
    assert message.content == '{"city": "Oslo", "country": "Norway"}'


def test_structured_output_parses_json_schema_and_function_calling(scripted) -> None:
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person."""

        name: str = Field(description="The name")
        age: int

    json_engine = scripted(['{"name": "Ada", "age": 36}'])
    assert ChatHVD(engine=json_engine).with_structured_output(Person).invoke("Ada is 36.") == Person(name="Ada", age=36)
    constraint = json_engine.requests[-1][1].constraint
    assert constraint.kind == "json_schema" and set(constraint.schema()["properties"]) == {"name", "age"}
    call_engine = scripted(['<tool_call>\n{"name": "Person", "arguments": {"name": "Ada", "age": 36}}\n</tool_call>'])
    runnable = ChatHVD(engine=call_engine).with_structured_output(Person, method="function_calling", include_raw=True)
    result = runnable.invoke("Ada is 36.")
    assert result["parsed"] == Person(name="Ada", age=36) and result["parsing_error"] is None
    assert _calls(result["raw"]) == [("Person", {"name": "Ada", "age": 36})]
    constraint = call_engine.requests[-1][1].constraint
    assert constraint.kind == "lark" and '"Person"' in constraint.source
    bad = ChatHVD(engine=scripted(['{"name": "Ada"}'])).with_structured_output(Person, include_raw=True).invoke("x")
    assert bad["parsed"] is None and bad["parsing_error"] is not None


def test_validation_errors_propagate_as_themselves(tiny_model, byte_tokenizer) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=())
    with pytest.raises(InvalidRequestError, match="max_new_tokens"):
        ChatHVD(engine=engine, max_tokens=0).invoke("Hello")
    with pytest.raises(InvalidRequestError, match="unsupported call arguments"):
        ChatHVD(engine=engine).invoke("Hello", max_new_tokens=5)
    with pytest.raises(ValueError, match="unknown decoding method"):
        ChatHVD(method="magic")
    with pytest.raises(InvalidRequestError, match="unknown decoding method"):
        ChatHVD(engine=engine).invoke("Hello", method="magic")
    with pytest.raises(InvalidRequestError, match="messages is empty"):
        ChatHVD(engine=engine).invoke([])
    assert isinstance(pytest.raises(ValidationError, ChatHVD, method="magic").value, ValueError)


def test_construction_loads_nothing(monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("the engine must not be created before the first call")

    monkeypatch.setattr("hvd_agents.chat.engine_choice.shared_engine", boom)
    model = ChatHVD(model="some/hub-model", device="cpu", max_tokens=12)
    model.bind_tools([WEATHER_SCHEMA], tool_choice="get_weather")
    model.with_structured_output({"title": "T", "type": "object", "properties": {"a": {"type": "string"}}})
    with pytest.raises(AssertionError, match="must not be created"):
        model.invoke("Hello")


def test_greedy_output_equals_engine_ar_output_on_tiny_model(tiny_model, byte_tokenizer) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=())
    messages = [{"role": "system", "content": "Echo."}, {"role": "user", "content": "héllo wörld héllo wörld"}]
    expected = engine.generate(prepare(engine, messages).prompt_ids, GenerationParams(method="ar", max_new_tokens=40))
    for method in ("ar", "pld", "hvd-cache", "hvd"):
        message = ChatHVD(engine=engine, method=method, max_tokens=40).invoke(
            [SystemMessage("Echo."), HumanMessage("héllo wörld héllo wörld")]
        )
        assert message.content == expected.text
        assert message.usage_metadata["output_tokens"] == len(expected.token_ids)


# ============================================================== unit: async on a scripted slow engine


@pytest.mark.asyncio
async def test_astream_does_not_block_the_event_loop(scripted) -> None:
    engine = scripted([f"w{i} " for i in range(20)], delay=0.03)  # ~0.6 s of "decoding" in the worker
    model = ChatHVD(engine=engine)

    async def run() -> tuple[list[AIMessageChunk], AIMessage]:
        return [chunk async for chunk in model.astream("Hello")], await model.ainvoke("Hello")

    (chunks, message), ticks = await ticking(run())
    assert "".join(chunk.content for chunk in chunks) == message.content == "".join(engine.pieces)
    assert ticks >= 40  # the loop ran all along (a blocked loop would tick about once)


@pytest.mark.asyncio
async def test_cancelling_astream_closes_the_engine_iterator(scripted) -> None:
    engine = scripted([f"w{i} " for i in range(500)], delay=0.01)  # 5 s if run to the end
    model = ChatHVD(engine=engine)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in model.astream("Hello"):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    started = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - started < 1.0
    assert engine.closed == 1 and engine.completed == 0 and engine.emitted < 100


@pytest.mark.asyncio
async def test_cancelling_stops_generation_while_a_tool_call_is_held_back(scripted) -> None:
    # No chunk reaches the consumer while the call is generated; the worker must still stop.
    engine = scripted(["<tool_call>\n", '{"name": "get_weather", "arguments": {"city": "', *["x"] * 500, '"}}'],
                      delay=0.01)
    task = asyncio.create_task(ChatHVD(engine=engine).bind_tools([WEATHER_SCHEMA]).ainvoke("Weather?"))
    await asyncio.sleep(0.3)
    assert engine.emitted > 0 and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.closed == 1 and engine.completed == 0 and engine.emitted < 200


def test_callbacks_see_each_token_once(scripted) -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            self.tokens.append(token)

    handler = Tokens()
    model = ChatHVD(engine=scripted(["Hello", " world", "!"]))
    content = "".join(chunk.content for chunk in model.stream("Hi", config={"callbacks": [handler]}))
    assert "".join(handler.tokens) == content == "Hello world!"


@pytest.mark.asyncio
async def test_async_errors_propagate_as_themselves(scripted) -> None:
    model = ChatHVD(engine=scripted(["ok"]))
    with pytest.raises(InvalidRequestError, match="max_new_tokens"):
        await model.ainvoke("Hello", max_tokens=0)
    with pytest.raises(InvalidRequestError):
        async for _ in model.astream([]):
            pass


# ============================================================== LangChain's standard unit suite


class TestChatHVDStandardUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatHVD]:
        return ChatHVD

    @property
    def chat_model_params(self) -> dict:
        return {"device": "cpu"}  # test_standard_params passes its own max_tokens and stop
