"""The OpenAI-compatible server on a loopback port, driven by the official ``openai`` client (tiny model).

Greedy output through the server equals ``ChatHVD``'s on the same engine and messages;
errors come in the OpenAI envelope with the right status and field.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from langchain_hvd import ChatHVD

from tests.server_helpers import MODEL, running_server

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three primes."}]


def test_health_and_models(url, client) -> None:
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert [model.id for model in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "hvd-agents"


def test_sync_chat_equals_chat_hvd_greedy(client, engine) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    expected = ChatHVD(engine=engine, max_tokens=12).invoke([("system", "Be brief."), ("human", "Name three primes.")])
    assert reply.choices[0].message.content == expected.content
    assert reply.choices[0].finish_reason == expected.response_metadata["finish_reason"]
    assert reply.usage.prompt_tokens == expected.usage_metadata["input_tokens"]
    assert reply.usage.completion_tokens == expected.usage_metadata["output_tokens"] == 12
    assert reply.id.startswith("chatcmpl-")
    hvd = reply.model_extra["hvd"]
    assert hvd["method"] == "hvd" and hvd["stats"]["new_tokens"] == 12


def test_async_client_and_max_completion_tokens(url, client) -> None:
    async def ask() -> str:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as aclient:
            replies = await asyncio.gather(*[
                aclient.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=7)
                for _ in range(3)
            ])
        return [r.choices[0].message.content for r in replies]

    expected = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=7).choices[0].message.content
    assert asyncio.run(ask()) == [expected] * 3


def test_stream_equals_the_whole_reply_and_reports_usage(client) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}))
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == ["length"]
    usage_chunks = [chunk for chunk in chunks if chunk.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert usage_chunks[0].usage.completion_tokens == 10
    # the same prompt again: its prefix KV is reused and reported as cached tokens
    assert usage_chunks[0].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_text_completions_equal_the_engine(client, engine) -> None:
    from hvd_agents.engine import GenerationParams

    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=9)
    ids = engine.tokenizer("Once upon a time", add_special_tokens=False).input_ids
    assert reply.choices[0].text == engine.generate(ids, GenerationParams(max_new_tokens=9)).text
    streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=9, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == reply.choices[0].text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0]"),
        ({"n": 2}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "messages[0].content[1]"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {
            "type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"stop": ["ok", ""]}, "stop[1]"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": None}, "model"),
        # a boolean field takes a JSON boolean only, as OpenAI's API does: no "yes", "true" or 1
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"parallel_tool_calls": 1}, "parallel_tool_calls"),
        ({"stream": "true"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": "1"}}, "stream_options.include_usage"),
    ],
)
def test_bad_requests_are_400_naming_the_field(url, body, param) -> None:
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize("prompt", [[True, False], [1, True]])
def test_json_booleans_are_not_token_ids(url, prompt) -> None:
    response = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_other_caller_errors(url, client) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 200}])
    assert too_long.value.body["code"] == "context_length_exceeded"
    garbled = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert garbled.status_code == 400 and garbled.json()["error"]["type"] == "invalid_request_error"
    nowhere = httpx.get(f"{url}/v1/nowhere")
    assert nowhere.status_code == 404 and nowhere.json()["error"]["type"] == "not_found_error"


def test_api_key_guards_every_route_but_health(engine) -> None:
    with running_server(engine, api_key="s3cret") as url:
        assert httpx.get(f"{url}/health").status_code == 200
        for path in ("/v1/models", "/metrics"):
            refused = httpx.get(f"{url}{path}", headers={"Authorization": "Bearer wrong"})
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).models.list()
        good = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).usage.completion_tokens == 2


def test_oversized_bodies_are_413(engine) -> None:
    with running_server(engine, max_body_bytes=2000) as url:
        big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}
        response = httpx.post(f"{url}/v1/chat/completions", json=big)
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: refused once the bound is passed
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        chunked = httpx.post(f"{url}/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413
        small = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1})
        assert small.status_code == 200


def test_metrics_count_requests_tokens_and_drafts(url, client) -> None:
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, extra_body={"method": "pld"})
    text = httpx.get(f"{url}/metrics").text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['hvd_requests_total{endpoint="/v1/chat/completions",status="200"}']) >= 1
    assert float(lines["hvd_completion_tokens_total"]) >= 5
    assert float(lines['hvd_accepted_length_bucket{le="+Inf"}']) >= 1
    assert any(key.startswith("hvd_drafted_tokens_total{source=") for key in lines)
    assert float(lines["hvd_prefix_reused_tokens_total"]) >= 0
    assert "# TYPE hvd_accepted_length histogram" in text


def test_queue_slot_is_released_however_a_generation_ends() -> None:
    from hvd_agents.server.errors import APIError
    from hvd_agents.server.queue import GenerationQueue

    queue = GenerationQueue(1)
    started = []

    def make(cancel):
        started.append(True)
        yield 1
        yield 2

    async def scenario() -> list:
        closed_early = queue.submit(make)  # admitted, closed before its first item
        with pytest.raises(APIError):
            queue.submit(make)  # the one slot is taken
        await closed_early.aclose()
        assert queue.pending == 0 and not started
        items = [item async for item in queue.submit(make)]  # run to the end
        assert queue.pending == 0
        partial = queue.submit(make)
        first = await partial.__anext__()
        await partial.aclose()  # left after one item
        assert queue.pending == 0
        return [items, first]

    assert asyncio.run(scenario()) == [[1, 2], 1]
    queue.close()
