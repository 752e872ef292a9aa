"""``POST /v1/responses`` through the official OpenAI SDK, on scripted engines (no real model).

A response is the chat completion of the same conversation (the same prompt tokens, the
same reply), in the Responses shape: output items, the streamed event sequence, forced
function calls, ``previous_response_id`` continued from the bounded store, and a 400
naming the field for everything the server cannot do.
"""

from __future__ import annotations

import json

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents.server.errors import APIError
from hvd_agents.server.responses_store import ResponseStore
from tests.server_helpers import running_server, tiny_engine

MODEL = "SmolLM2-135M-Instruct"
TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_TOOL = {"type": "function", "function": {key: TOOL[key] for key in ("name", "description", "parameters")}}
# a forced call is decoded under the tools' grammar: the model writes it whole (the scripted engine replays it)
CALL_PIECES = ['<tool_call>\n{"name": "get_weather", "arguments": {"city": ', '"Oslo"}', "}\n</tool_call>"]
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
               "response.output_text.done", "response.content_part.done", "response.output_item.done",
               "response.completed"]


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _without_ids(output: list) -> list[dict]:
    return [{key: value for key, value in item.model_dump().items() if key not in ("id", "call_id")} for item in output]


def test_a_response_is_the_chat_completion_of_the_same_conversation(scripted) -> None:
    engine = scripted(["Hello", " there."])
    with running_server(engine) as url:
        client = _client(url)
        response = client.responses.create(model=MODEL, instructions="Be brief.", input="Say hello.")
        chat = client.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}])
    assert engine.requests[0][0] == engine.requests[1][0]  # the same prompt tokens
    assert response.status == "completed" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content == "Hello there."
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].content[0].type == "output_text" and response.output[0].status == "completed"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.instructions == "Be brief." and response.temperature == 0.0


def test_streamed_text_follows_the_documented_event_sequence(scripted) -> None:
    engine = scripted(["Hello", " there."])
    with running_server(engine) as url:
        client = _client(url)
        whole = client.responses.create(model=MODEL, input="Say hello.")
        events = list(client.responses.create(model=MODEL, input="Say hello.", stream=True))
    assert [event.type for event in events] == TEXT_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    done = next(event for event in events if event.type == "response.output_text.done")
    final = events[-1].response
    assert "".join(deltas) == done.text == final.output_text == whole.output_text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert final.status == "completed" and final.usage.output_tokens == whole.usage.output_tokens
    assert _without_ids(final.output) == _without_ids(whole.output)
    added = events[2].item
    assert added.id == final.output[0].id == done.item_id and added.status == "in_progress"


@pytest.mark.parametrize("choice", [{"type": "function", "name": "get_weather"}, "required"])
def test_a_forced_function_call_whole_and_streamed(scripted, choice) -> None:
    tools = [TOOL]
    if choice == "required":  # of two tools: the grammar holds the name to theirs
        tools = [TOOL, {**TOOL, "name": "get_time"}]
    engine = scripted(CALL_PIECES)
    with running_server(engine) as url:
        client = _client(url)
        request = {"model": MODEL, "input": "Weather in Oslo?", "tools": tools, "tool_choice": choice}
        whole = client.responses.create(**request)
        events = list(client.responses.create(**request, stream=True))
    [call] = whole.output
    assert engine.requests[-1][1].constraint.kind == "lark"  # decoded under the call grammar
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Oslo"}
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    done = events[-3]
    assert deltas == done.arguments == call.arguments and done.name == "get_weather"
    assert events[2].item.name == "get_weather" and events[2].item.arguments == ""
    assert _without_ids(events[-1].response.output) == _without_ids(whole.output)


def test_previous_response_id_continues_the_stored_conversation(scripted) -> None:
    engine = scripted(CALL_PIECES)
    tool_choice = {"type": "function", "name": "get_weather"}
    with running_server(engine) as url:
        client = _client(url)
        first = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[TOOL], tool_choice=tool_choice)
        call = first.output[0]
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 C"}
        client.responses.create(model=MODEL, previous_response_id=first.id, input=[result], tools=[TOOL])
        # the same conversation sent whole, as a client without previous_response_id sends it
        client.responses.create(model=MODEL, tools=[TOOL], input=[
            {"role": "user", "content": "Weather in Oslo?"}, call.model_dump(exclude_none=True), result])
        client.chat.completions.create(model=MODEL, tools=[CHAT_TOOL], messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function",
                                                                    "function": {"name": call.name,
                                                                                 "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 18 C"}])
        unstored = client.responses.create(model=MODEL, input="Hi", store=False)
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, previous_response_id=unstored.id, input="Again")
    continued, whole, chat = (engine.requests[index][0] for index in (1, 2, 3))
    assert continued == whole == chat
    assert refused.value.body["param"] == "previous_response_id"
    assert refused.value.body["code"] == "previous_response_not_found"


def test_a_reply_cut_by_max_output_tokens_is_incomplete(scripted) -> None:
    engine = scripted(["Hello", " there"], finish="length")
    with running_server(engine) as url:
        client = _client(url)
        whole = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=2)
        events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=2, stream=True))
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert engine.requests[0][1].max_new_tokens == 2
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice.type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"max_tool_calls": 1}, "max_tool_calls"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"temperature": 3}, "temperature"),
])
def test_what_the_server_cannot_do_is_a_400_naming_the_field(scripted, extra, param) -> None:
    engine = scripted(["never"])
    with running_server(engine) as url, pytest.raises(openai.BadRequestError) as refused:
        _client(url).responses.create(**{"model": MODEL, "input": "Hi", **extra})
    assert refused.value.body["param"] == param, refused.value.body
    assert engine.requests == []


def test_accepted_settings_that_change_nothing(scripted) -> None:
    engine = scripted(["Hi"])
    with running_server(engine) as url:
        response = _client(url).responses.create(
            model=MODEL, input="Hi", include=[], reasoning={"effort": None}, truncation="disabled", store=True,
            metadata={"run": "1"}, text={"format": {"type": "text"}}, service_tier="auto")
    assert response.output_text == "Hi" and response.metadata == {"run": "1"}


# ------------------------------------------------------------------ the store's bound


def test_the_store_evicts_the_least_recently_used_turns_within_its_bytes() -> None:
    store = ResponseStore(max_bytes=300)  # two turns of ~130 bytes fit, not three
    turn = [{"role": "user", "content": "x" * 100}]
    store.put("a", None, turn)
    store.put("b", "a", turn)
    store.history("a")  # a is now used more recently than b
    store.put("c", None, turn)
    assert "b" not in store and "a" in store and "c" in store
    assert store.stored_bytes <= 300
    assert not store.put("huge", None, [{"role": "user", "content": "x" * 400}]) and "huge" not in store


def test_a_chain_whose_older_turn_was_evicted_names_it() -> None:
    store = ResponseStore(max_entries=2)
    store.put("a", None, [{"role": "user", "content": "1"}])
    store.put("b", "a", [{"role": "assistant", "content": "2"}])
    assert [m["content"] for m in store.history("b")] == ["1", "2"]
    store.put("c", "b", [{"role": "user", "content": "3"}])  # evicts a, the least recently used
    with pytest.raises(APIError) as missing:
        store.history("c")
    assert missing.value.param == "previous_response_id" and "'a'" in str(missing.value)
    assert len(store) == 2


def test_the_served_schema_has_the_route_for_the_fuzzer(scripted) -> None:
    """tests/test_server_fuzz.py fuzzes every operation of /openapi.json: /v1/responses is one of them."""
    import httpx

    with running_server(scripted(["Hi"])) as url:
        document = httpx.get(f"{url}/openapi.json", timeout=30).json()
    operation = document["paths"]["/v1/responses"]["post"]
    assert operation["requestBody"]["required"] is True
    assert {"200", "400", "404", "413", "503", "504"} <= set(operation["responses"])
    assert "text/event-stream" in operation["responses"]["200"]["content"]


# ------------------------------------------------------------------ randomized bodies: a 2xx or a 4xx, never a 5xx

_text = st.one_of(st.text(max_size=20), st.sampled_from(["\ud800", "<tool_call>", "<|im_end|>", ""]))
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), _text),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
                     max_leaves=8)
_part = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                                         "text": _text}), _json)
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool", ""])},
                          optional={"type": st.sampled_from(["message", "reasoning", "x"]),
                                    "content": st.one_of(_text, st.lists(_part, max_size=2), _json)}),
    st.fixed_dictionaries({"type": st.just("function_call")},
                          optional={"call_id": _text, "name": _text, "arguments": st.one_of(_text, _json)}),
    st.fixed_dictionaries({"type": st.just("function_call_output")},
                          optional={"call_id": _text, "output": st.one_of(_text, st.lists(_part, max_size=2))}),
    _json,
)
_body = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, MODEL, "gpt-4o"]), "input": st.one_of(_text, st.lists(_item, max_size=4)),
     "max_output_tokens": st.integers(0, 4)},
    optional={"tools": st.lists(st.one_of(st.just(TOOL), _json), max_size=2),
              "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), _json),
              "instructions": st.one_of(_text, _json), "stream": st.booleans(), "store": _json,
              "previous_response_id": st.one_of(_text, _json), "text": _json, "parallel_tool_calls": _json,
              "include": _json, "reasoning": _json, "truncation": _json, "temperature": st.floats(-1, 3)},
)


@pytest.fixture(scope="module")
def tiny_url(tiny_model, byte_tokenizer):
    with running_server(tiny_engine(tiny_model, byte_tokenizer)) as url:
        yield url


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=_body)
def test_randomized_response_requests_get_no_5xx(tiny_url, body) -> None:
    import httpx

    response = httpx.post(f"{tiny_url}/v1/responses", content=json.dumps(body).encode(), timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["type"] and error["message"]
    elif body.get("stream") is True:
        assert "event: response.completed" in response.text or "event: response.incomplete" in response.text
    else:
        assert response.json()["object"] == "response"
