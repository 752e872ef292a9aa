"""Fuzzing the server on a loopback port (tiny model): no caller's input gets a 5xx, and the server lives on.

* Schemathesis reads the served ``/openapi.json`` and sends schema-valid and schema-breaking
  requests to every operation, with and without the key; its checks include no 5xx, statuses
  and content types the document declares, bodies that match their schemas, and auth enforced.
* A hypothesis test sends randomized chat requests (odd roles, content shapes, tools, sampling
  fields, surrogates, nesting) and asserts a 2xx or a 4xx in the OpenAI envelope, then a live ``/health``.

Both are bounded (a few dozen examples per operation) so the suite stays within a couple of minutes.
"""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from tests.server_helpers import MODEL, running_server, tiny_engine

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BOUNDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
BOUNDED = settings(max_examples=150, deadline=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def server_url(tiny_model, byte_tokenizer):
    with running_server(tiny_engine(tiny_model, byte_tokenizer), api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def served_schema(server_url):
    return schemathesis.openapi.from_url(f"{server_url}/openapi.json")


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_the_served_schema_holds_under_fuzzing(served_schema, server_url, mode) -> None:
    @BOUNDED
    @given(case=served_schema.as_strategy(generation_mode=mode))
    def fuzz(case) -> None:
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            body["model"] = MODEL  # reach the engine rather than stop at 404 model_not_found
            if case.path.startswith("/api/") and "options" not in body:  # Ollama's bound is an option
                body["options"] = {"num_predict": 4}
            elif not any(key in body for key in BOUNDS):
                body["max_tokens"] = 4  # keep generations short
            for key in BOUNDS:  # schema-valid bodies reach the engine: keep their generations short too
                if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > 4:
                    body[key] = 4
        # Every check but one: a schema cannot say that tool_choice must name one of the tools or that
        # the prompt must fit the context window, so a schema-valid request may rightly get a 400.
        response = case.call_and_validate(headers=AUTH, excluded_checks=[checks.positive_data_acceptance],
                                          timeout=120)  # a shared, loaded machine: not the 10 s default
        assert response.status_code < 500, response.text

    fuzz()
    assert httpx.get(f"{server_url}/health", timeout=60).status_code == 200
    answered = statuses(server_url)
    assert not [key for key in answered if key[1].startswith("5")], answered
    if mode == schemathesis.GenerationMode.POSITIVE:  # the fuzzer reached the engine, not only the checks
        assert answered.get(("/v1/chat/completions", "200"), 0) + answered.get(("/v1/completions", "200"), 0) > 0
    for route in ("/v1/messages", "/v1/messages/count_tokens", "/api/chat", "/api/generate", "/api/show"):
        assert any(key[0] == route for key in answered), f"the fuzzer never reached {route}"


def statuses(url: str) -> dict[tuple[str, str], float]:
    """``hvd_requests_total`` by (endpoint, status)."""
    out = {}
    for line in httpx.get(f"{url}/metrics", headers=AUTH, timeout=60).text.splitlines():
        if line.startswith("hvd_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            fields = dict(part.split("=", 1) for part in labels[len("hvd_requests_total{"):-1].split(","))
            out[(fields["endpoint"].strip('"'), fields["status"].strip('"'))] = float(value)
    return out


# Randomized chat requests: shapes a caller can send, valid or not.
_text = st.one_of(st.text(max_size=40), st.sampled_from(["\ud800", "a\udfffb", "<tool_call>", "<|im_end|>", ""]))
_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), _text),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
                     max_leaves=10)
_part = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                  st.fixed_dictionaries({"type": st.sampled_from(["image_url", "audio", "x"])}), _json)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard", ""])},
    optional={"content": st.one_of(_text, st.none(), st.lists(_part, max_size=3), _json),
              "tool_calls": st.lists(_json, max_size=2), "tool_call_id": _text, "name": _text},
)
_tool = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["get_weather", "", "f"])}, optional={"parameters": _json, "description": _text})}),
    _json,
)
_chat = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, MODEL, MODEL, "gpt-4o"]), "messages": st.lists(_message, max_size=4),
     "max_tokens": st.one_of(st.integers(-2, 6), st.just(2**70))},
    optional={
        "tools": st.lists(_tool, max_size=2),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "get_weather"]), _json),
        "temperature": st.one_of(st.floats(-1, 3), st.just(float("inf")), st.none()),
        "top_p": st.one_of(st.floats(-1, 2), st.none()), "top_k": st.integers(-3, 2**65),
        "seed": st.integers(-(2**65), 2**65), "stop": st.one_of(_text, st.lists(_text, max_size=3), _json),
        "stream": st.booleans(), "stream_options": _json, "n": st.integers(-1, 3),
        "response_format": st.one_of(st.sampled_from([{"type": "json_object"}, {"type": "text"}]), _json),
        "method": st.sampled_from(["hvd", "ar", "pld", "nope", ""]), "num_draft_tokens": st.integers(-2, 2**65),
        "logprobs": _json, "logit_bias": _json, "user": _json, "parallel_tool_calls": _json,
    },
)


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=_chat)
def test_randomized_chat_requests_get_no_5xx(server_url, body) -> None:
    raw = json.dumps(body).encode()  # ASCII: lone surrogates travel as \ud800 escapes, inf as Infinity
    response = httpx.post(f"{server_url}/v1/chat/completions", content=raw, timeout=60,
                          headers={**AUTH, "content-type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["type"] and error["message"]
    elif body.get("stream") is True:
        assert response.text.rstrip().endswith("data: [DONE]")
    assert httpx.get(f"{server_url}/health", timeout=60).status_code == 200
