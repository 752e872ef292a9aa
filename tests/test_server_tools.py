"""Tool calls, JSON formats, sessions, disconnects and the bounded queue, over HTTP (scripted replies).

The scripted engine replays chosen text pieces, one engine step each, so the tests can
say exactly what the model "wrote" and check how the server shapes it.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.server_helpers import client_of, running_server

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def prompt_text(engine, index: int = -1) -> str:
    return engine.tokenizer.decode(engine.requests[index][0])


def test_forced_tool_choice_streams_the_arguments(scripted) -> None:
    # nothing is pre-filled: the model writes the whole call, under the call grammar (the scripted engine ignores it)
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": ', '"Par', 'is"',
                       "}}\n</tool_call>"], finish="stop")
    with running_server(engine) as url:
        client = client_of(url)
        forced = {"type": "function", "function": {"name": "get_weather"}}
        whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=forced)
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=forced,
                                                     stream=True))
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    params = engine.requests[-1][1]
    assert prompt_text(engine).endswith("<|im_start|>assistant\n")
    assert params.constraint.kind == "lark" and '"get_weather"' in params.constraint.source
    assert "</tool_call>" not in params.stop  # the grammar ends the reply
    calls = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_") and calls[0].type == "function"
    assert all(len(chunk.choices[0].delta.tool_calls or ()) <= 1 for chunk in chunks if chunk.choices)
    pieces = [call.function.arguments for call in calls]
    # as the steps wrote them, not all at the end; the first step's piece rides with the name (one entry per call)
    assert pieces == ['{"city": ', '"Par', 'is"', "}"]
    assert "".join(pieces) == message.tool_calls[0].function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_auto_tool_call_with_content_and_two_calls(scripted) -> None:
    text = ('Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    engine = scripted([text[i : i + 7] for i in range(0, len(text), 7)], finish="stop")
    with running_server(engine) as url:
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    message = reply.choices[0].message
    assert message.content == "Checking."
    assert [json.loads(c.function.arguments)["city"] for c in message.tool_calls] == ["Paris", "Rome"]
    assert len({c.id for c in message.tool_calls}) == 2
    assert engine.requests[-1][1].stop == ()  # auto: nothing forced, nothing cut


def test_tool_choice_none_and_parallel_calls_off_set_stops(scripted) -> None:
    engine = scripted(["Sunny."], finish="stop")
    with running_server(engine) as url:
        client = client_of(url)
        none = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none")
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], parallel_tool_calls=False)
    assert none.choices[0].message.content == "Sunny." and none.choices[0].finish_reason == "stop"
    assert "<tool_call>" in engine.requests[0][1].stop
    assert "</tool_call>" in engine.requests[1][1].stop


def test_json_schema_reply_is_cut_after_its_object(scripted) -> None:
    # the model writes the whole object, '{' included; what an engine that ignores the grammar adds is cut
    engine = scripted(['{"name": "Ann", ', '"age": 7}', " and more text"], finish="stop")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    with running_server(engine) as url:
        reply = client_of(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A person."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert reply.choices[0].message.content == '{"name": "Ann", "age": 7}'
    prompt = prompt_text(engine)
    assert "Respond only with a JSON object with these keys" in prompt and prompt.endswith("<|im_start|>assistant\n")
    constraint = engine.requests[-1][1].constraint
    assert constraint.kind == "json_schema" and constraint.schema()["properties"] == schema["properties"]


def test_sessions_come_from_the_header_or_the_user_field(scripted) -> None:
    engine = scripted(["ok"], finish="stop")
    with running_server(engine) as url:
        client = client_of(url)
        client.chat.completions.create(model=MODEL, messages=ASK, extra_headers={"X-Session-ID": "thread-7"})
        client.chat.completions.create(model=MODEL, messages=ASK, user="alice")
        client.chat.completions.create(model=MODEL, messages=ASK)
    sessions = [structure.session_id for _, _, structure in engine.requests]
    assert sessions[:2] == ["thread-7", "alice"]
    assert sessions[2] not in ("thread-7", "alice") and sessions[2]  # derived from the messages


def test_a_disconnected_stream_stops_its_generation(scripted) -> None:
    engine = scripted(["x"] * 400, finish="length", delay=0.01)  # 4 s if it ran to the end
    with running_server(engine) as url:
        body = {"model": MODEL, "messages": ASK, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
        _wait_for(lambda: engine.closed == 1)
        emitted = engine.emitted
        time.sleep(0.2)
        assert engine.emitted == emitted < 100 and engine.completed == 0
        metrics = httpx.get(f"{url}/metrics").text
    assert "hvd_requests_cancelled_total 1" in metrics


def test_a_client_that_gives_up_on_a_whole_reply_stops_its_generation(scripted) -> None:
    engine = scripted(["x"] * 400, finish="length", delay=0.01)
    with running_server(engine) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=0.3)
        _wait_for(lambda: engine.closed == 1)
        assert engine.emitted < 200 and engine.completed == 0


def test_a_full_queue_answers_503_with_retry_after(scripted) -> None:
    engine = scripted(["x"] * 100, finish="length", delay=0.01)
    with running_server(engine, max_pending=1) as url:
        body = {"model": MODEL, "messages": ASK, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # the first request holds the only slot
            refused = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": ASK})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1" and refused.json()["error"]["code"] == "queue_full"
        _wait_for(lambda: engine.closed == 1)
        again = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": ASK})
        assert again.status_code == 200  # the slot is free once the first client left


def test_requests_run_one_at_a_time(scripted) -> None:
    engine = scripted(["a", "b", "c"], finish="stop", delay=0.02)
    active, most = [0], [0]
    stream = engine.stream

    def counting_stream(*args, **kwargs):
        active[0] += 1
        most[0] = max(most[0], active[0])
        try:
            yield from stream(*args, **kwargs)
        finally:
            active[0] -= 1

    engine.stream = counting_stream
    replies = []
    with running_server(engine) as url:
        def ask() -> None:
            replies.append(httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": ASK}).json())

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert [reply["choices"][0]["message"]["content"] for reply in replies] == ["abc"] * 4
    assert most[0] == 1 and engine.closed == 4


def test_health_is_503_while_the_model_loads(scripted) -> None:
    loaded = threading.Event()
    engine = scripted(["ok"], finish="stop")

    def load():
        loaded.wait(10)
        return engine

    with running_server(None, load=load) as url:
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and health.json() == {"status": "loading"} and health.headers["retry-after"]
        early = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": ASK})
        assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading"
        loaded.set()
        _wait_for(lambda: httpx.get(f"{url}/health").status_code == 200)
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK)
    assert reply.choices[0].message.content == "ok"


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_openai_like_reassembles_a_streamed_call_whole(scripted) -> None:
    """LlamaIndex's OpenAI client reads one tool-call entry per chunk: the name and the first argument
    text of one decode step must come in one entry, or the arguments lose their start."""
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    def get_weather(city: str) -> str:
        """Weather of a city."""
        return "sunny"

    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}', "}\n</tool_call>"],
                      finish="stop")
    with running_server(engine) as url:
        llm = OpenAILike(model=MODEL, api_base=f"{url}/v1", api_key="unused", is_chat_model=True,
                         is_function_calling_model=True, context_window=512, max_retries=0)
        tool = FunctionTool.from_defaults(get_weather)
        last = None
        for last in llm.stream_chat_with_tools([tool], chat_history=[ChatMessage(role="user", content="Paris?")],
                                               tool_required=True):
            pass
    calls = llm.get_tool_calls_from_response(last, error_on_no_tool_call=True)
    assert [(call.tool_name, call.tool_kwargs) for call in calls] == [("get_weather", {"city": "Paris"})]
