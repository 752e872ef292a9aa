"""The server under hostile input (tiny model): every caller's mistake is a 4xx in the OpenAI envelope,
a bug is a 500 that is counted, logged once and leaves the connection usable, huge prompts are refused
before they are tokenized and leave no memory behind, the key is checked before the body is read, and
``/openapi.json`` declares what the server really answers."""

from __future__ import annotations

import functools
import json
import logging
import socket
import sys
import threading

import httpx
import pytest

from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.engine import Engine
from tests.helpers import IM_END_ID
from tests.server_helpers import MODEL, running_server

# generous: the first generation measures the tiny model's cost profile, and the machine may be busy
post = functools.partial(httpx.post, timeout=120)
get = functools.partial(httpx.get, timeout=120)
MESSAGES = [{"role": "user", "content": "Name three primes."}]


def metric(url: str, name: str) -> float:
    lines = dict(line.rsplit(" ", 1) for line in get(f"{url}/metrics").text.splitlines()
                 if line and not line.startswith("#"))
    return float(lines.get(name, 0))


def rss_mb() -> float:
    """Resident memory of this process now (Linux)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_a_seed_past_64_bits_is_400(url, route, stream) -> None:
    body = {"model": MODEL, "max_tokens": 2, "stream": stream, "seed": 2**64}
    body.update({"messages": MESSAGES} if route.endswith("chat/completions") else {"prompt": "hi"})
    response = post(f"{url}{route}", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "seed" and "18446744073709551616" in error["message"]
    assert post(f"{url}{route}", json={**body, "seed": 2**64 - 1}).status_code == 200  # the largest is fine


@pytest.mark.parametrize("prompt", ['"a\\ud800b"', '["\\udfff"]'])
def test_a_lone_surrogate_in_a_completion_prompt_is_400(url, prompt) -> None:
    raw = f'{{"model": "{MODEL}", "prompt": {prompt}, "max_tokens": 2}}'.encode()
    response = post(f"{url}/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and "not valid Unicode" in error["message"]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and "planted bug" in str(record.exc_info[1]):
            self.errors.append(record)


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on ``sock`` and read its whole (Content-Length) answer."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    return int(head.split()[1]), body


def test_a_bug_is_a_counted_500_logged_once_on_a_connection_that_stays_usable(engine, monkeypatch) -> None:
    def planted(*args, **kwargs):
        raise RuntimeError("planted bug")

    monkeypatch.setattr("hvd_agents.server.jobs.build_chat_request", planted)
    records = _Records()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        with running_server(engine) as url:
            host, port = url.removeprefix("http://").split(":")
            body = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 2}).encode()
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                status, answer = _exchange(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                           b"Content-Type: application/json\r\nContent-Length: "
                                           + str(len(body)).encode() + b"\r\n\r\n" + body)
                assert status == 500
                assert json.loads(answer)["error"]["type"] == "server_error"
                status, answer = _exchange(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection
                assert status == 200 and json.loads(answer) == {"status": "ok"}
            assert metric(url, 'hvd_requests_total{endpoint="/v1/chat/completions",status="500"}') == 1
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    assert len(records.errors) == 1, [record.name for record in records.errors]


class _CountingCalls:
    """Counts the tokenizer's calls on texts longer than ``size`` (class-level, so every tokenizer use is seen)."""

    def __init__(self, monkeypatch, tokenizer, size: int) -> None:
        self.calls = 0
        original = type(tokenizer).__call__

        def counting(tok, text=None, *args, **kwargs):
            if isinstance(text, str) and len(text) > size:
                self.calls += 1
            return original(tok, text, *args, **kwargs)

        monkeypatch.setattr(type(tokenizer), "__call__", counting)


def test_huge_prompts_are_refused_before_they_are_tokenized(url, engine, monkeypatch) -> None:
    counter = _CountingCalls(monkeypatch, engine.tokenizer, 100_000)
    huge = "word " * 60_000  # 300,000 characters: far over the 512-token window, whatever the tokenizer
    chat = post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": huge}]})
    completion = post(f"{url}/v1/completions", json={"model": MODEL, "prompt": huge})
    ids = post(f"{url}/v1/completions", json={"model": MODEL, "prompt": [65] * 100_000})
    for response, param in ((chat, "messages"), (completion, "prompt"), (ids, "prompt")):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "context_length_exceeded"
        assert response.json()["error"]["param"] == param
    assert counter.calls == 0
    many = post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": ""}] * 600})
    assert many.status_code == 400 and many.json()["error"]["code"] == "context_length_exceeded"


def test_whitespace_is_not_counted_in_the_cheap_bound() -> None:
    from hvd_agents.server.sizing import WHITESPACE

    assert WHITESPACE == "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())


def test_a_long_preparation_does_not_hold_up_queued_generations(url, monkeypatch) -> None:
    from hvd_agents.server import jobs

    release, entered = threading.Event(), threading.Event()
    original = jobs.build_chat_request

    def slow(*args, **kwargs):
        entered.set()
        release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(jobs, "build_chat_request", slow)
    answers = []
    chat = threading.Thread(target=lambda: answers.append(post(
        f"{url}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2}, timeout=120)))
    chat.start()
    try:
        assert entered.wait(60)
        completion = post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                                timeout=120)
        assert completion.status_code == 200 and not release.is_set()  # served while the chat is being prepared
    finally:
        release.set()
        chat.join(120)
    assert answers[0].status_code == 200


def test_refused_huge_prompts_leave_no_memory_behind(url) -> None:
    big = "lorem ipsum dolor sit amet " * 80_000  # 2.2 MB
    statuses = [post(f"{url}/v1/chat/completions", timeout=120,
                           json={"model": MODEL, "messages": [{"role": "user", "content": big}]}).status_code]
    before = rss_mb()
    for route, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": big}]}),
                        ("/v1/completions", {"prompt": big})] * 3:
        statuses.append(post(f"{url}{route}", json={"model": MODEL, **body}, timeout=120).status_code)
    growth = rss_mb() - before
    assert statuses == [400] * 7
    assert growth < 60, f"resident memory grew {growth:.0f} MB over six refused 2.2 MB prompts"


def test_a_span_over_the_store_budget_is_not_a_caller_error(tiny_model, byte_tokenizer) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(IM_END_ID,), cache_store=CacheStore(token_budget=100))
    with running_server(engine) as url:
        fits = post(f"{url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 2,
                                                               "messages": [{"role": "user", "content": "ab " * 100}]})
        assert fits.status_code == 200, fits.text  # 300 tokens: over the store's budget, inside the window
        too_long = post(f"{url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 2,
                                                                   "messages": [{"role": "user", "content": "a" * 600}]})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["code"] == "context_length_exceeded"


def test_the_key_is_checked_before_the_body_is_read(engine) -> None:
    with running_server(engine, api_key="s3cret", max_body_bytes=2000) as url:
        headers = {"content-type": "application/json"}
        garbled = post(f"{url}/v1/chat/completions", content=b"{not json", headers=headers)
        assert garbled.status_code == 401 and garbled.json()["error"]["code"] == "invalid_api_key"
        big = post(f"{url}/v1/chat/completions", content=b"x" * 5000, headers=headers)
        assert big.status_code == 401
        assert get(f"{url}/v1/nowhere").status_code == 401
        keyed = post(f"{url}/v1/chat/completions", content=b"{not json",
                           headers={**headers, "Authorization": "Bearer s3cret"})
        assert keyed.status_code == 400
        assert get(f"{url}/openapi.json").status_code == 200  # open, like /health


def test_the_openapi_document_declares_what_the_server_answers(engine) -> None:
    with running_server(engine, api_key="s3cret") as url:
        response = get(f"{url}/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert "422" not in json.dumps(document) and "HTTPValidationError" not in json.dumps(document)
    paths = document["paths"]
    for route in ("/v1/chat/completions", "/v1/completions"):
        operation = paths[route]["post"]
        assert set(operation["responses"]) == {"200", "400", "401", "404", "413", "503", "504"}
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        assert operation["security"] == [{"bearer": []}, {"apiKey": []}]
        assert "messages" in json.dumps(document["components"]["schemas"])
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert set(paths["/health"]["get"]["responses"]) == {"200", "503"} and "security" not in paths["/health"]["get"]
    assert "404" in paths["/v1/models/{model_id}"]["get"]["responses"]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}
    for route, error in (("/v1/messages", "AnthropicError"), ("/api/chat", "OllamaError")):
        operation = paths[route]["post"]
        assert operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(error)
    assert "application/x-ndjson" in paths["/api/chat"]["post"]["responses"]["200"]["content"]
    seed = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["seed"]
    integer = next(option for option in seed["anyOf"] if option.get("type") == "integer")
    assert integer["minimum"] == 0 and integer["exclusiveMaximum"] == 2**64


def test_freed_memory_goes_back_to_the_system_after_a_large_preparation() -> None:
    from hvd_agents.server.memory import release_free_memory

    blocks = [bytearray(4096) for _ in range(50_000)]  # ~200 MB in small pieces, then freed
    del blocks
    before = rss_mb()
    assert release_free_memory()  # glibc (the suite runs on Linux)
    assert rss_mb() <= before
