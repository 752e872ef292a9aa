"""The reliability matrix: every bad input fails with its documented error type and a message naming the cause.

Each case goes through the chat layer (:func:`hvd_agents.chat.prepare`, the one path from
a chat request to an engine request) and, where LangChain can carry it, through
``ChatHVD.invoke`` on a tiny engine. Model output is never an error: malformed tool-call
JSON becomes ``invalid_tool_calls``. A store file that cannot be read is kept aside and the
program continues with an empty store (see docs/engine.md#errors).
"""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import pytest
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage
from langchain_hvd import ChatHVD

from hvd_agents import ContextLengthError, Engine, GenerationParams, HVDError, InvalidRequestError
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.request import merge_stops
from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.errors import StoreFormatError, TraceFormatError
from hvd_agents.structure import SpanKind
from hvd_agents.trace.loader import load_trace

WINDOW = 160
USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _tool(**function) -> dict:
    return {"type": "function", "function": function}


@pytest.fixture(scope="module")
def engine(tiny_model, byte_tokenizer) -> Engine:
    """A tiny real engine with a short context window."""
    return Engine(tiny_model, byte_tokenizer, eos_token_ids=(), context_window=WINDOW)


@pytest.fixture(scope="module")
def llm(engine) -> ChatHVD:
    return ChatHVD(engine=engine, max_tokens=4)


# ================================================================ the chat layer: prepare

CHAT_LAYER_CASES = [
    # (id, messages, tools, error type, message fragment)
    ("empty", [], None, InvalidRequestError, r"^messages is empty$"),
    ("not a list", "hello", None, InvalidRequestError, r"messages must be a list of objects, got str"),
    ("none", None, None, InvalidRequestError, r"messages must be a list of objects, got NoneType"),
    ("message not a dict", ["hello"], None, InvalidRequestError, r"messages\[0\] must be an object, got str"),
    ("message a number", [USER[0], 7], None, InvalidRequestError, r"messages\[1\] must be an object, got int"),
    ("missing role", [{"content": "x"}], None, InvalidRequestError, r"messages\[0\] has no role \(expected one of"),
    ("unknown role", [USER[0], {"role": "robot", "content": "x"}], None, InvalidRequestError,
     r"messages\[1\] has unknown role 'robot' \(expected one of system, user, assistant, tool\)"),
    ("role of a wrong type", [{"role": ["user"], "content": "x"}], None, InvalidRequestError,
     r"messages\[0\] has unknown role \['user'\]"),
    ("missing content", [{"role": "user"}], None, InvalidRequestError,
     r"messages\[0\] \(user\) has no content; only assistant messages may omit it"),
    ("null system content", [{"role": "system", "content": None}, *USER], None, InvalidRequestError,
     r"messages\[0\] \(system\) has no content"),
    ("null tool content", [*USER, {"role": "tool", "content": None}], None, InvalidRequestError,
     r"messages\[1\] \(tool\) has no content"),
    ("content a number", [{"role": "user", "content": 42}], None, InvalidRequestError,
     r"messages\[0\]\.content must be a string, null or a list of text parts, got int"),
    ("content a dict", [{"role": "user", "content": {"text": "x"}}], None, InvalidRequestError,
     r"messages\[0\]\.content must be a string, null or a list of text parts, got dict"),
    ("text part without text", [{"role": "user", "content": [{"type": "text"}]}], None, InvalidRequestError,
     r"messages\[0\]\.content\[0\] must be a \{'type': 'text', 'text': str\} part"),
    ("image part", [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                                 {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}],
     None, InvalidRequestError,
     r"messages\[0\]\.content\[1\]: content parts of type 'image_url' are not supported: the model reads text only"),
    ("audio part", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], None,
     InvalidRequestError, r"messages\[0\]\.content\[0\]: content parts of type 'input_audio' are not supported"),
    ("lone surrogate", [{"role": "user", "content": "a\ud800b"}], None, InvalidRequestError,
     r"messages\[0\] holds text that is not valid Unicode: '\\ud800' at position 1"),
    ("tool calls on a user message", [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
     None, InvalidRequestError, r"messages\[0\] has tool_calls but role 'user' \(only assistant\)"),
    ("tool call arguments not serializable",
     [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"s": {1, 2}}}}]}],
     None, InvalidRequestError, r"messages\[0\]\.tool_calls\[0\]\.function\.arguments cannot be written as JSON"),
    ("tools not a list", USER, "get_weather", InvalidRequestError, r"^tools must be a list of tool schemas, got str$"),
    ("tools a single schema", USER, WEATHER, InvalidRequestError, r"^tools must be a list of tool schemas, got dict$"),
    ("tool not an object", USER, ["get_weather"], InvalidRequestError,
     r"tools\[0\]: tool schema must be an object, got str"),
    ("tool without a name", USER, [_tool(parameters={"type": "object"})], InvalidRequestError,
     r"tools\[0\]: tool schema has no function name"),
    ("tool with an empty name", USER, [WEATHER, _tool(name="")], InvalidRequestError,
     r"tools\[1\]: tool schema has no function name"),
    ("tool of another type", USER, [{"type": "retrieval", "function": {"name": "f"}}], InvalidRequestError,
     r"tools\[0\]: unsupported tool type 'retrieval' \(only 'function'\)"),
    ("parameters a string", USER, [_tool(name="f", parameters="city: str")], InvalidRequestError,
     r"tools\[0\]: tool 'f': parameters must be a JSON schema object, got str"),
    ("parameters a list", USER, [{"name": "f", "parameters": ["city"]}], InvalidRequestError,
     r"tools\[0\]: tool 'f': parameters must be a JSON schema object, got list"),
    ("parameters not of type object", USER, [_tool(name="f", parameters={"type": "string"})], InvalidRequestError,
     r"tools\[0\]: tool 'f': parameters must be a JSON schema of type 'object', got type 'string'"),
    ("duplicate tool names", USER, [WEATHER, _tool(name="get_time"), WEATHER], InvalidRequestError,
     r"tools\[2\]: duplicate tool name 'get_weather' \(also tools\[0\]\)"),
    ("tool not serializable", USER, [_tool(name="f", description={1, 2})], InvalidRequestError,
     r"tools\[0\]: tool 'f' is not JSON-serializable"),
]


@pytest.mark.parametrize(
    ("messages", "tools", "error", "match"),
    [case[1:] for case in CHAT_LAYER_CASES],
    ids=[case[0] for case in CHAT_LAYER_CASES],
)
def test_chat_layer_refuses_bad_requests(engine, messages, tools, error, match) -> None:
    before = len(engine.cache_store)
    with pytest.raises(error, match=match) as raised:
        prepare(engine, messages, tools)
    assert type(raised.value) is error and isinstance(raised.value, HVDError)
    assert len(engine.cache_store) == before  # nothing of a refused request is registered


def test_assistant_messages_may_omit_content(engine) -> None:
    call = {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    for message in ({"role": "assistant", "tool_calls": [call]}, {"role": "assistant", "content": None}):
        assert prepare(engine, [*USER, message]).prompt_ids


def test_prompt_over_the_context_window_names_both_numbers(engine) -> None:
    # prepare analyses a conversation of any length; running it refuses, before decoding,
    # a prompt that leaves no room for a new token (there is no truncation option).
    structure = prepare(engine, [{"role": "user", "content": "x" * 300}])
    n = len(structure.prompt_ids)
    assert n >= WINDOW
    with pytest.raises(ContextLengthError, match=rf"the prompt has {n} tokens but the model's context window is "
                                                 rf"{WINDOW}: no room for a new token"):
        engine.stream(structure.prompt_ids, GenerationParams(max_new_tokens=4))


# ================================================================ generation parameters

PARAM_CASES = [
    ({"max_new_tokens": 0}, r"max_new_tokens must be >= 1, got 0"),
    ({"max_new_tokens": -5}, r"max_new_tokens must be >= 1, got -5"),
    ({"max_new_tokens": 2.5}, r"max_new_tokens must be an int, got 2\.5"),
    ({"max_new_tokens": "10"}, r"max_new_tokens must be an int, got '10'"),
    ({"max_new_tokens": True}, r"max_new_tokens must be an int, got True"),
    ({"temperature": -0.5}, r"temperature must be a finite number >= 0, got -0\.5"),
    ({"temperature": float("inf")}, r"temperature must be a finite number >= 0, got inf"),
    ({"temperature": "hot"}, r"temperature must be a number, got 'hot'"),
    ({"temperature": True}, r"temperature must be a number, got True"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0\.0"),
    ({"top_p": -0.1}, r"top_p must be in \(0, 1\], got -0\.1"),
    ({"top_p": 1.01}, r"top_p must be in \(0, 1\], got 1\.01"),
    ({"top_p": None}, r"top_p must be a number, got None"),
    ({"top_k": -1}, r"top_k must be >= 0"),
    ({"top_k": "3"}, r"top_k must be an int, got '3'"),
    ({"seed": -1}, r"seed must be in \[0, 2\*\*64\), got -1"),
    ({"seed": 2**64}, r"seed must be in \[0, 2\*\*64\), got 18446744073709551616"),
    ({"seed": 1.5}, r"seed must be an int, got 1\.5"),
    ({"stop": ("",)}, r"stop strings must be non-empty strings, got \(''\,\)"),
    ({"stop": ("ok", 3)}, r"stop strings must be non-empty strings"),
    ({"stop": 5}, r"stop must be a string or a list of strings, got int"),
    ({"stop_token_ids": ["eos"]}, r"stop_token_ids must be a list of ints or None, got \['eos'\]"),
    ({"stop_token_ids": 2}, r"stop_token_ids must be a list of ints or None, got 2"),
    ({"num_draft_tokens": -1}, r"num_draft_tokens must be >= 0, got -1"),
    ({"num_draft_tokens": "4"}, r"num_draft_tokens must be an int or None, got '4'"),
    ({"method": 3}, r"method must be a non-empty string, got 3"),
    ({"timeout_s": 0}, r"timeout_s must be a finite number of seconds > 0 or None, got 0"),
    ({"timeout_s": -2.0}, r"timeout_s must be a finite number of seconds > 0 or None, got -2\.0"),
    ({"timeout_s": "10"}, r"timeout_s must be a finite number of seconds > 0 or None, got '10'"),
]


@pytest.mark.parametrize(("kwargs", "match"), PARAM_CASES, ids=[next(iter(c[0])) + "=" + repr(next(iter(c[0].values())))
                                                                  for c in PARAM_CASES])
def test_generation_params_refuse_bad_values(kwargs, match) -> None:
    with pytest.raises(InvalidRequestError, match=match) as raised:
        GenerationParams(**kwargs)
    assert type(raised.value) is InvalidRequestError


def test_stop_accepts_none_and_a_bare_string() -> None:
    assert GenerationParams(stop=None).stop == ()
    assert GenerationParams(stop="Observation:").stop == ("Observation:",)
    assert merge_stops(["a"], "Observation:") == ["a", "Observation:"]  # a bare string is one stop, not characters
    with pytest.raises(InvalidRequestError, match="stop must be a string or a list of strings, got int"):
        merge_stops(5)


def test_huge_max_tokens_is_capped_at_the_context_window(engine, byte_tokenizer) -> None:
    prompt = list(byte_tokenizer("The weather today", add_special_tokens=False).input_ids)
    result = engine.generate(prompt, GenerationParams(max_new_tokens=10**12, method="ar"))
    assert result.finish_reason == "length" and len(result.token_ids) == WINDOW - len(prompt)


# ================================================================ through ChatHVD.invoke

INVOKE_CASES = [
    # (id, input, call kwargs, error type, message fragment)
    ("empty list", [], {}, InvalidRequestError, r"^messages is empty$"),
    ("input a number", 42, {}, InvalidRequestError,
     r"^input must be a string, a list of messages or a PromptValue, got int$"),
    ("item a number", ["hi", 42], {}, InvalidRequestError, r"^messages\[1\]: Unsupported message type"),
    ("dict without content", [{"role": "user"}], {}, InvalidRequestError,
     r"^messages\[0\]: Message dict must contain 'role' and 'content' keys"),
    ("dict without role", [{"content": "hi"}], {}, InvalidRequestError,
     r"^messages\[0\]: Message dict must contain 'role' and 'content' keys"),
    ("dict of an unknown role", [{"role": "robot", "content": "hi"}], {}, InvalidRequestError,
     r"^messages\[0\]: Unexpected message type: 'robot'"),
    ("ChatMessage of an unknown role", [ChatMessage(role="robot", content="hi")], {}, InvalidRequestError,
     r"messages\[0\] has unsupported role 'robot'"),
    ("image block", [HumanMessage(content=[{"type": "text", "text": "What is it?"},
                                           {"type": "image_url", "image_url": {"url": "http://x/a.png"}}])], {},
     InvalidRequestError, r"messages\[0\]\.content\[1\]: content blocks of type 'image_url' are not supported"),
    ("image block (v1)", [HumanMessage(content=[{"type": "image", "url": "http://x/a.png"}])], {},
     InvalidRequestError, r"messages\[0\]\.content\[0\]: content blocks of type 'image' are not supported"),
    ("over the context window", "x" * 300, {}, ContextLengthError,
     rf"the prompt has \d+ tokens but the model's context window is {WINDOW}: no room for a new token"),
    ("max_tokens 0", "hi", {"max_tokens": 0}, InvalidRequestError, r"max_new_tokens must be >= 1, got 0"),
    ("max_tokens negative", "hi", {"max_tokens": -1}, InvalidRequestError, r"max_new_tokens must be >= 1, got -1"),
    ("max_tokens a float", "hi", {"max_tokens": 8.5}, InvalidRequestError, r"max_new_tokens must be an int, got 8\.5"),
    ("max_tokens a string", "hi", {"max_tokens": "many"}, InvalidRequestError,
     r"max_new_tokens must be an int, got 'many'"),
    ("negative temperature", "hi", {"temperature": -1.0}, InvalidRequestError,
     r"temperature must be a finite number >= 0, got -1\.0"),
    ("temperature a string", "hi", {"temperature": "hot"}, InvalidRequestError,
     r"temperature must be a number, got 'hot'"),
    ("top_p 0", "hi", {"top_p": 0.0}, InvalidRequestError, r"top_p must be in \(0, 1\], got 0\.0"),
    ("top_p above 1", "hi", {"top_p": 1.5}, InvalidRequestError, r"top_p must be in \(0, 1\], got 1\.5"),
    ("top_k a string", "hi", {"top_k": "5"}, InvalidRequestError, r"top_k must be an int, got '5'"),
    ("seed a float", "hi", {"seed": 0.5}, InvalidRequestError, r"seed must be an int, got 0\.5"),
    ("empty stop string", "hi", {"stop": [""]}, InvalidRequestError, r"stop strings must be non-empty strings"),
    ("bare empty stop string", "hi", {"stop": ""}, InvalidRequestError, r"stop strings must be non-empty strings"),
    ("stop a number", "hi", {"stop": 5}, InvalidRequestError, r"stop must be a string or a list of strings, got int"),
    ("tools not a list", "hi", {"tools": "get_weather"}, InvalidRequestError,
     r"^tools must be a list of tool schemas, got str$"),
    ("duplicate tools", "hi", {"tools": [WEATHER, WEATHER]}, InvalidRequestError,
     r"tools\[1\]: duplicate tool name 'get_weather'"),
    ("timeout 0", "hi", {"timeout": 0}, InvalidRequestError,
     r"timeout_s must be a finite number of seconds > 0 or None, got 0"),
    ("unknown call argument", "hi", {"max_new_tokens": 3}, InvalidRequestError,
     r"unsupported call arguments for ChatHVD: \['max_new_tokens'\]"),
]


@pytest.mark.parametrize(
    ("model_input", "kwargs", "error", "match"),
    [case[1:] for case in INVOKE_CASES],
    ids=[case[0] for case in INVOKE_CASES],
)
def test_chathvd_invoke_refuses_bad_requests(llm, model_input, kwargs, error, match) -> None:
    with pytest.raises(error, match=match) as raised:
        llm.invoke(model_input, **kwargs)
    assert type(raised.value) is error


BIND_CASES = [
    ("no name", [_tool(parameters={"type": "object"})], r"tools\[0\]: tool schema has no function name"),
    ("parameters a string", [_tool(name="f", parameters="city")],
     r"tools\[0\]: tool 'f': parameters must be a JSON schema object, got str"),
    ("not convertible", [{"parameters": {}}], r"tools\[0\] cannot be converted to a tool schema: Unsupported function"),
    ("not convertible (number)", [WEATHER, 3], r"tools\[1\] cannot be converted to a tool schema"),
]


@pytest.mark.parametrize(("tools", "match"), [c[1:] for c in BIND_CASES], ids=[c[0] for c in BIND_CASES])
def test_bind_tools_refuses_invalid_schemas_at_bind_time(llm, tools, match) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        llm.bind_tools(tools)


def test_duplicate_tool_names_are_refused_by_the_call(llm) -> None:
    bound = llm.bind_tools([WEATHER, WEATHER])  # LangChain's standard tests bind duplicates: refused at the call
    with pytest.raises(InvalidRequestError, match=r"tools\[1\]: duplicate tool name 'get_weather' \(also tools\[0\]\)"):
        bound.invoke("Weather?")


def test_a_bare_stop_string_is_one_stop_string(scripted) -> None:
    engine = scripted(["Hello"])
    ChatHVD(engine=engine).invoke("hi", stop="Observation:")
    assert engine.requests[-1][1].stop == ("Observation:",)


def test_huge_max_tokens_through_invoke_stops_at_the_window(llm) -> None:
    message = llm.invoke([SystemMessage("s"), HumanMessage("hi")], max_tokens=10**9)
    usage = message.usage_metadata
    assert message.response_metadata["finish_reason"] == "length"
    assert usage["input_tokens"] + usage["output_tokens"] == WINDOW


def test_llama_index_refuses_a_message_that_is_not_a_chat_message(engine) -> None:
    from llama_index.llms.hvd import HVD

    with pytest.raises(InvalidRequestError, match=r"messages\[0\] must be a ChatMessage, got dict"):
        HVD(engine=engine, max_tokens=4).chat([{"role": "user", "content": "hi"}])


# ================================================================ model output: never an exception

BROKEN_CALLS = [
    # (id, what the model writes, expected error fragment, expected name)
    ("bad JSON", '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>', "invalid JSON",
     "get_weather"),
    ("not an object", "<tool_call>\n[1, 2]\n</tool_call>", "tool call is not a JSON object", None),
    ("no name", '<tool_call>\n{"arguments": {}}\n</tool_call>', "missing or invalid function name", None),
    ("arguments a list", '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',
     "arguments must be a JSON object, got list", "get_weather"),
    ("arguments string not JSON", '<tool_call>\n{"name": "get_weather", "arguments": "{city"}\n</tool_call>',
     "arguments string is not valid JSON", "get_weather"),
    ("nested too deeply", "<tool_call>\n" + "[" * 100_000 + "\n</tool_call>", "invalid JSON: nested too deeply", None),
    ("arguments nested too deeply",
     '<tool_call>\n{"name": "get_weather", "arguments": "' + "[" * 100_000 + '"}\n</tool_call>',
     "arguments string is not valid JSON: nested too deeply", "get_weather"),
    ("unterminated", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "unterminated <tool_call> block",
     "get_weather"),
]


@pytest.mark.parametrize(("text", "error", "name"), [c[1:] for c in BROKEN_CALLS], ids=[c[0] for c in BROKEN_CALLS])
def test_malformed_tool_call_json_becomes_an_invalid_tool_call(scripted, text, error, name) -> None:
    engine = scripted(["Checking. ", text])
    message = ChatHVD(engine=engine).bind_tools([WEATHER]).invoke("Weather in Paris?")
    assert isinstance(message, AIMessage)
    assert message.content == "Checking." and message.tool_calls == []
    [bad] = message.invalid_tool_calls
    assert bad["error"].startswith(error) and bad["name"] == name and bad["id"]


# ================================================================ the trace reader


def test_trace_reader_reports_deep_nesting_as_a_format_error(tmp_path) -> None:
    jsonl = tmp_path / "deep.jsonl"
    jsonl.write_text("[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"deep\.jsonl:1: .*nested too deeply"):
        load_trace(jsonl)
    array = tmp_path / "deep.json"
    array.write_text("[\n" + "[" * 100_000, encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"deep\.json:2: invalid JSON array: nested too deeply"):
        load_trace(array)


def test_trace_lines_end_at_newlines_only(tmp_path) -> None:
    # U+2028 and U+0085 are legal unescaped inside JSON strings; str.splitlines would cut there.
    record = {"messages": [{"role": "user", "content": "one\u2028two\x85three"}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(record, ensure_ascii=False) + "\r\n" + json.dumps(record) + "\n", encoding="utf-8")
    trace = load_trace(path)
    assert [c.messages[0]["content"] for c in trace.conversations] == ["one\u2028two\x85three"] * 2
    assert [c.line for c in trace.conversations] == [1, 2]


# ================================================================ the store file


def _saved_store(path) -> bytes:
    store = CacheStore(token_budget=100)
    store.add([1, 2, 3], SpanKind.SYSTEM, "s1")
    store.add([4, 5, 6, 7], SpanKind.TOOL_SCHEMA)
    store.save(path)
    return path.read_bytes()


def _kept_aside(directory, name: str) -> list:
    return sorted(p for p in directory.iterdir() if re.fullmatch(re.escape(name) + r"\.corrupt-\d{8}T\d{6}Z(-\d+)?",
                                                                  p.name))


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_store_file_is_kept_aside_and_the_store_starts_empty(tmp_path, caplog, damage) -> None:
    path = tmp_path / "store.npz"
    good = _saved_store(path)
    bad = good[: len(good) // 2] if damage == "truncated" else os.urandom(64) + b"not a store"
    path.write_bytes(bad)
    with pytest.raises(StoreFormatError, match=r"store\.npz is corrupt or not a store"):
        CacheStore.load(path)
    with caplog.at_level(logging.WARNING, logger="hvd_agents.drafters.cache.store"):
        store = CacheStore.load_or_empty(path, token_budget=50)
    assert len(store) == 0 and store.token_budget == 50
    [kept] = _kept_aside(tmp_path, "store.npz")
    assert kept.read_bytes() == bad  # the original bytes, untouched
    assert not path.exists()
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in record.getMessage() and "corrupt or not a store" in record.getMessage()
    assert f"kept aside as {kept}" in record.getMessage()
    store.add([9, 9], SpanKind.USER)
    store.save(path)  # a later save does not touch the kept file
    assert kept.read_bytes() == bad and len(CacheStore.load(path)) == 1


def test_kept_files_are_never_overwritten(tmp_path) -> None:
    path = tmp_path / "store.npz"
    contents = [b"first garbage", b"second garbage", b"third garbage"]
    for data in contents:
        path.write_bytes(data)
        CacheStore.load_or_empty(path)
    kept = _kept_aside(tmp_path, "store.npz")
    assert sorted(p.read_bytes() for p in kept) == sorted(contents)


def test_a_missing_store_file_gives_an_empty_store_quietly(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        store = CacheStore.load_or_empty(tmp_path / "absent.npz")
    assert len(store) == 0 and not caplog.records and list(tmp_path.iterdir()) == []


def test_a_store_path_that_is_a_directory_is_left_alone(tmp_path, caplog) -> None:
    path = tmp_path / "store.npz"
    path.mkdir()
    with caplog.at_level(logging.WARNING):
        assert len(CacheStore.load_or_empty(path)) == 0
    assert path.is_dir() and "not a regular file" in caplog.text


def _npy(path, array) -> None:
    with open(path, "wb") as fh:  # np.save(path) would add ".npy" to the name
        np.save(fh, array)


def _npz(path, tokens, header) -> None:
    raw = header if isinstance(header, np.ndarray) else np.frombuffer(json.dumps(header).encode(), np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, tokens=tokens, header=raw)


HEADER = {"format": "hvd-agents-store", "version": 1, "token_budget": 10, "clock": 1,
          "spans": [{"length": 3, "kind": "system", "session_id": None, "age": 1}]}

STORE_FILE_CASES = [
    ("a .npy array", lambda p: _npy(p, np.arange(3)), r"not an \.npz \(zip\) file"),
    ("empty file", lambda p: p.write_bytes(b""), r"not an \.npz \(zip\) file"),
    ("string tokens", lambda p: _npz(p, np.array(["a", "b", "c"]), HEADER), r"not a 1-D integer array"),
    ("float tokens", lambda p: _npz(p, np.array([1.0, np.nan, 2.0]), HEADER), r"not a 1-D integer array"),
    ("scalar tokens", lambda p: _npz(p, np.array(5), HEADER), r"not a 1-D integer array"),
    ("tokens past int64", lambda p: _npz(p, np.array([2**64 - 1, 1, 2], dtype=np.uint64), HEADER),
     r"span table and token array do not agree"),
    ("header nested too deeply", lambda p: _npz(p, np.arange(3), np.frombuffer(b"[" * 100_000, np.uint8)),
     r"corrupt or not a store"),
    ("header of floats", lambda p: _npz(p, np.arange(3), np.array([1.5, 2.5])), r"bad header array"),
    ("header not UTF-8", lambda p: _npz(p, np.arange(3), np.frombuffer(b"\xff\xfe", np.uint8)),
     r"corrupt or not a store"),
    ("budget 0", lambda p: _npz(p, np.arange(3), {**HEADER, "token_budget": 0}), r"malformed span table"),
    ("length infinite", lambda p: _npz(p, np.arange(3), {**HEADER, "spans": [{**HEADER["spans"][0],
                                                                              "length": float("inf")}]}),
     r"malformed span table"),
    ("session id a list", lambda p: _npz(p, np.arange(3), {**HEADER, "spans": [{**HEADER["spans"][0],
                                                                                "session_id": [1]}]}),
     r"malformed span table"),
    ("other version", lambda p: _npz(p, np.arange(3), {**HEADER, "version": 2}), r"store format version 2, expected 1"),
]


@pytest.mark.parametrize(("write", "match"), [c[1:] for c in STORE_FILE_CASES], ids=[c[0] for c in STORE_FILE_CASES])
def test_the_store_reader_raises_only_store_format_errors(tmp_path, write, match) -> None:
    path = tmp_path / "store.npz"
    write(path)
    with pytest.raises(StoreFormatError, match=match):
        CacheStore.load(path)
    assert len(CacheStore.load_or_empty(path)) == 0


def test_spans_over_a_smaller_budget_are_left_out_on_load(tmp_path) -> None:
    path = tmp_path / "store.npz"
    _saved_store(path)
    store = CacheStore.load(path, token_budget=3)
    assert [s.length for s in store.spans] == [3]
