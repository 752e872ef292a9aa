"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``, ``/api/version``) over HTTP,
driven by the official ``ollama`` client.

Scripted replies show the shapes (NDJSON lines, tool calls with object arguments, ``done``
lines, errors); the prompts the engine receives show that the routes are the chat completions
pipeline (the same prompt for the same conversation, ``format`` as ``response_format``).
"""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.server_helpers import MODEL, client_of, running_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def prompt_text(engine, index: int = -1) -> str:
    return engine.tokenizer.decode(engine.requests[index][0])


def test_chat_whole_and_streamed(scripted) -> None:
    engine = scripted(["Sunny ", "and ", "warm."], finish="stop")
    with running_server(engine) as url:
        client = ollama.Client(host=url)
        whole = client.chat(model=MODEL, messages=ASK, stream=False)
        lines = list(client.chat(model=f"{MODEL}:latest", messages=ASK, stream=True))
        raw = httpx.post(f"{url}/api/chat", json={"model": MODEL, "messages": ASK})  # streams by default
        client_of(url).chat.completions.create(model=MODEL, messages=ASK)
    assert whole.message.content == "Sunny and warm." and whole.done and whole.done_reason == "stop"
    assert whole.prompt_eval_count == len(engine.requests[0][0]) and whole.eval_count > 0
    assert [line.message.content for line in lines] == ["Sunny ", "and ", "warm.", ""]
    assert [line.done for line in lines] == [False, False, False, True]
    assert lines[-1].eval_count == whole.eval_count
    assert raw.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line)["done"] for line in raw.text.splitlines()] == [False, False, False, True]
    assert len({prompt_text(engine, index) for index in range(4)}) == 1  # the chat completion's prompt


def test_tool_calls_in_ollamas_shape(scripted) -> None:
    engine = scripted([CALL_TEXT[i : i + 9] for i in range(0, len(CALL_TEXT), 9)], finish="stop")
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_weather"}, {"role": "user", "content": "And Paris?"}]
    with running_server(engine) as url:
        client = ollama.Client(host=url)
        whole = client.chat(model=MODEL, messages=history, tools=[WEATHER])
        lines = list(client.chat(model=MODEL, messages=history, tools=[WEATHER], stream=True))
    assert whole.message.content == "Sure."
    assert [(call.function.name, call.function.arguments) for call in whole.message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    streamed = [call for line in lines for call in line.message.tool_calls or ()]
    assert [(call.function.name, call.function.arguments) for call in streamed] == [("get_weather", {"city": "Paris"})]
    assert "".join(line.message.content for line in lines) == "Sure."
    assert lines[-1].done and lines[-1].done_reason == "stop"
    prompt = prompt_text(engine, 0)
    assert '{"name": "get_weather", "arguments": {"city": "Rome"}}' in prompt and "18 C" in prompt


def test_format_is_the_chat_routes_response_format(scripted) -> None:
    # the model writes the whole object, '{' included; what an engine that ignores the grammar adds is cut
    engine = scripted(['{"name": "Ann", ', '"age": 7}', " and more"], finish="stop")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    person = [{"role": "user", "content": "A person."}]
    with running_server(engine) as url:
        client = ollama.Client(host=url)
        structured = client.chat(model=MODEL, messages=person, format=schema)
        client_of(url).chat.completions.create(model=MODEL, messages=person, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        client.chat(model=MODEL, messages=person, format="json")
        client_of(url).chat.completions.create(model=MODEL, messages=person, response_format={"type": "json_object"})
        generated = client.generate(model=MODEL, prompt="A person.", format=schema)
    assert structured.message.content == generated.response == '{"name": "Ann", "age": 7}'
    assert prompt_text(engine, 0) == prompt_text(engine, 1) == prompt_text(engine, 4)
    assert prompt_text(engine, 2) == prompt_text(engine, 3) != prompt_text(engine, 0)
    constraints = [params.constraint for _, params, _ in engine.requests]
    # format is decoded under the same grammar as the chat route's response_format: the schema, or any object
    assert constraints[0] == constraints[1] == constraints[4]
    assert constraints[0].kind == "json_schema" and constraints[0].schema()["properties"] == schema["properties"]
    assert constraints[2] == constraints[3] and constraints[2].schema() == {"type": "object"}


def test_options_map_to_the_generation_settings(scripted) -> None:
    engine = scripted(["ok"], finish="stop")
    with running_server(engine) as url:
        client = ollama.Client(host=url)
        client.chat(model=MODEL, messages=ASK, keep_alive="5m", think=False, options={
            "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 11, "num_predict": 7, "stop": ["cold"],
            "num_ctx": 4096, "repeat_penalty": 1.1})
        client.chat(model=MODEL, messages=ASK, options={"num_predict": -1})
    params = engine.requests[0][1]
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.5, 0.9, 5, 11)
    assert params.max_new_tokens == 7 and params.stop == ("cold",)
    assert engine.requests[1][1].max_new_tokens > 1000 and engine.requests[1][1].temperature == 0.0


def test_generate_templated_raw_and_empty(scripted) -> None:
    engine = scripted(["Once ", "upon."], finish="length")
    with running_server(engine) as url:
        client = ollama.Client(host=url)
        templated = client.generate(model=MODEL, prompt="Tell a story.", system="Be brief.")
        lines = list(client.generate(model=MODEL, prompt="Tell a story.", system="Be brief.", stream=True))
        raw = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"num_predict": 2})
        loaded = client.generate(model=MODEL, prompt="")
        client_of(url).chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell a story."}])
    assert templated.response == "Once upon." and templated.done_reason == "length"
    assert [line.response for line in lines] == ["Once ", "upon.", ""] and lines[-1].done
    assert prompt_text(engine, 0) == prompt_text(engine, 3)  # generate's template is the chat route's
    assert prompt_text(engine, 2) == "Once upon a time" and raw.response == "Once upon."
    assert loaded.done_reason == "load" and len(engine.requests) == 4  # an empty prompt generates nothing


def test_tags_show_and_version(url) -> None:
    client = ollama.Client(host=url)
    assert [model.model for model in client.list().models] == [MODEL]
    shown = client.show(MODEL)
    assert "tools" in shown.capabilities and shown.modelinfo["general.context_length"] > 0
    assert httpx.get(f"{url}/api/version").json()["version"]
    with pytest.raises(ollama.ResponseError) as unknown:
        client.show("llama3")
    assert unknown.value.status_code == 404


@pytest.mark.parametrize(("path", "body", "fragment"), [
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, "images are not supported"),
    ("/api/chat", {"messages": ASK, "format": "yaml"}, "format"),
    ("/api/chat", {"messages": []}, "messages"),
    ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/api/chat", {"messages": ASK, "options": {"temperature": 9}}, "options.temperature"),
    ("/api/generate", {"prompt": "x", "images": ["AAAA"]}, "images"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, "context"),
])
def test_errors_in_ollamas_shape(url, path, body, fragment) -> None:
    response = httpx.post(f"{url}{path}", json={"model": MODEL, "stream": False, **body})
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and fragment in response.json()["error"]


def test_client_errors_and_the_key(engine) -> None:
    with running_server(engine, api_key="sekrit") as url:
        with pytest.raises(ollama.ResponseError) as denied:
            ollama.Client(host=url).chat(model=MODEL, messages=ASK)
        assert denied.value.status_code == 401 and "API key" in denied.value.error
        keyed = ollama.Client(host=url, headers={"Authorization": "Bearer sekrit"})
        with pytest.raises(ollama.ResponseError) as unknown:
            keyed.chat(model="llama3", messages=ASK)
        assert unknown.value.status_code == 404 and "llama3" in unknown.value.error
        with pytest.raises(ollama.ResponseError) as too_long:
            keyed.chat(model=MODEL, messages=[{"role": "user", "content": "word " * 4000}], stream=False)
        assert too_long.value.status_code == 400 and "context window" in too_long.value.error
        assert keyed.chat(model=MODEL, messages=ASK, options={"num_predict": 2}).done


def test_tool_choice_extension(scripted) -> None:
    # nothing is pre-filled: the model writes the whole call, under the call grammar (the scripted engine ignores it)
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": ', '"Paris"}}\n</tool_call>'],
                      finish="stop")
    with running_server(engine) as url:
        forced = httpx.post(f"{url}/api/chat", json={"model": MODEL, "messages": ASK, "tools": [WEATHER],
                                                     "tool_choice": "get_weather", "stream": False}).json()
        refused = httpx.post(f"{url}/api/chat", json={"model": MODEL, "messages": ASK, "tool_choice": "required"})
    assert forced["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    params = engine.requests[-1][1]
    assert prompt_text(engine).endswith("<|im_start|>assistant\n")
    assert params.constraint.kind == "lark" and '"get_weather"' in params.constraint.source
    assert "</tool_call>" not in params.stop  # the grammar ends the reply
    assert refused.status_code == 400 and "no tools" in refused.json()["error"]
