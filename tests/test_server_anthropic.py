"""Anthropic's Messages API (``/v1/messages``) over HTTP, driven by the official ``anthropic`` SDK.

Scripted replies show how the server shapes what the model "wrote" (content blocks, streamed
events, stop reasons, usage); the tiny engine shows that the route is the chat completions
pipeline (the same greedy reply, the same prompt) and that Claude Code's billing header does not
break prefix reuse across requests.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from hvd_agents.server.anthropic_input import strip_billing_header
from hvd_agents.server.errors import APIError
from tests.server_helpers import MODEL, client_of, running_server

WEATHER = {"name": "get_weather", "description": "Weather of a city.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FORCED = {"type": "tool", "name": "get_weather"}
# Claude Code's first system block: its cch value changes with every request
BILLING = "x-anthropic-billing-header: cc_version=2.1.36.abc; cc_entrypoint=cli; cch={};"


def anthropic_of(url: str, **kwargs) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs)


def prompt_text(engine, index: int = -1) -> str:
    return engine.tokenizer.decode(engine.requests[index][0])


def test_a_forced_tool_call_whole_and_streamed(scripted) -> None:
    # nothing is pre-filled: the model writes the whole call, under the call grammar (the scripted engine ignores it)
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": ', '"Par', 'is"',
                       "}}\n</tool_call>"], finish="stop")
    with running_server(engine) as url:
        client = anthropic_of(url)
        whole = client.messages.create(model=MODEL, max_tokens=32, messages=ASK, tools=[WEATHER], tool_choice=FORCED)
        with client.messages.stream(model=MODEL, max_tokens=32, messages=ASK, tools=[WEATHER],
                                    tool_choice=FORCED) as stream:
            events = list(stream)
            final = stream.get_final_message()
        raw = httpx.post(f"{url}/v1/messages", json={"model": MODEL, "max_tokens": 32, "messages": ASK,
                                                     "tools": [WEATHER], "tool_choice": FORCED, "stream": True})
    assert whole.stop_reason == "tool_use" and whole.id.startswith("msg_")
    assert [(block.type, block.name, block.input) for block in whole.content] == [
        ("tool_use", "get_weather", {"city": "Paris"})]
    params = engine.requests[-1][1]
    assert prompt_text(engine).endswith("<|im_start|>assistant\n")
    assert params.constraint.kind == "lark" and '"get_weather"' in params.constraint.source
    assert "</tool_call>" not in params.stop  # the grammar ends the reply
    kinds = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert kinds == ["message_start", "content_block_start", "ping", *["content_block_delta"] * 4,
                     "content_block_stop", "message_delta", "message_stop"]
    assert raw.headers["content-type"].startswith("text/event-stream")
    pieces = [event.delta.partial_json for event in events if event.type == "content_block_delta"]
    assert pieces == ['{"city": ', '"Par', 'is"', "}"]  # as the steps wrote them
    assert json.loads("".join(pieces)) == final.content[0].input == whole.content[0].input
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == whole.usage.output_tokens > 0


def test_text_then_two_calls_and_tool_choice_auto(scripted) -> None:
    text = ('Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    engine = scripted([text[i : i + 7] for i in range(0, len(text), 7)], finish="stop")
    with running_server(engine) as url:
        client = anthropic_of(url)
        whole = client.messages.create(model=MODEL, max_tokens=99, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "auto"})
        with client.messages.stream(model=MODEL, max_tokens=99, messages=ASK, tools=[WEATHER]) as stream:
            starts = [event.content_block.type for event in stream if event.type == "content_block_start"]
            final = stream.get_final_message()
    assert [block.type for block in whole.content] == ["text", "tool_use", "tool_use"]
    assert whole.content[0].text == "Checking."
    assert [block.input["city"] for block in whole.content[1:]] == ["Paris", "Rome"]
    assert starts == ["text", "tool_use", "tool_use"]  # the whitespace between calls makes no block
    assert [block.input for block in final.content[1:]] == [block.input for block in whole.content[1:]]
    assert engine.requests[0][1].stop == ()  # auto: nothing forced, nothing cut


def test_stop_reasons_and_stop_settings(scripted) -> None:
    engine = scripted(["Sunny ", "and warm."], finish="stop")
    with running_server(engine) as url:
        client = anthropic_of(url)
        plain = client.messages.create(model=MODEL, max_tokens=9, messages=ASK)
        stopped = client.messages.create(model=MODEL, max_tokens=9, messages=ASK, stop_sequences=["cold"],
                                         extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5})
        client.messages.create(model=MODEL, max_tokens=9, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"})
        client.messages.create(model=MODEL, max_tokens=9, messages=ASK, tools=[WEATHER],
                               tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert plain.stop_reason == "end_turn" and plain.content[0].text == "Sunny and warm."
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "cold")
    params = engine.requests[1][1]
    assert params.stop == ("cold",) and params.max_new_tokens == 9
    assert (params.temperature, params.top_p, params.top_k) == (0.5, 0.9, 5)
    none, any_one = engine.requests[2][1], engine.requests[3][1]
    assert "<tool_call>" in none.stop and none.constraint is None  # none: generation stops where a call would start
    assert "</tool_call>" in any_one.stop  # any, one call at most
    # any forces one call through its grammar, not through the prompt
    assert any_one.constraint.kind == "lark" and '"get_weather"' in any_one.constraint.source
    assert engine.requests[3][0] == engine.requests[2][0]


def test_max_tokens_and_usage(scripted) -> None:
    engine = scripted(["a", "b", "c"], finish="length")
    with running_server(engine) as url:
        client = anthropic_of(url)
        whole = client.messages.create(model=MODEL, max_tokens=3, messages=ASK)
        with client.messages.stream(model=MODEL, max_tokens=3, messages=ASK) as stream:
            final = stream.get_final_message()
    assert whole.stop_reason == final.stop_reason == "max_tokens"
    prompt = len(engine.requests[0][0])
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == prompt
    assert whole.usage.output_tokens == 3 and whole.usage.cache_creation_input_tokens == 0
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt
    assert whole.model_extra["hvd"]["stats"]["new_tokens"] == 3


def test_system_blocks_tool_results_and_the_billing_header(scripted) -> None:
    engine = scripted(["It is 18 C."], finish="stop")
    system = [{"type": "text", "text": BILLING.format("1a2b3")},
              {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    messages = [*ASK,
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                  {"type": "text", "text": "Let me check."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                              "content": [{"type": "text", "text": "service down"}],
                                              "cache_control": {"type": "ephemeral"}},
                                             {"type": "text", "text": "Try again?"}]}]
    with running_server(engine) as url:
        anthropic_of(url).messages.create(model=MODEL, max_tokens=9, system=system, messages=messages,
                                          tools=[WEATHER], metadata={"user_id": "user_7"},
                                          thinking={"type": "enabled", "budget_tokens": 1024},
                                          extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"})
        client_of(url).chat.completions.create(model=MODEL, max_tokens=9, tools=[{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city.", "parameters": WEATHER["input_schema"]}}],
            messages=[{"role": "system", "content": "You are terse."}, *ASK,
                      {"role": "assistant", "content": "Let me check.", "tool_calls": [
                          {"id": "toolu_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                      {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: service down"},
                      {"role": "user", "content": "Try again?"}])
    prompt = prompt_text(engine, 0)
    assert "billing" not in prompt and "cch" not in prompt and "You are terse." in prompt
    assert "Error: service down" in prompt and "hm" not in prompt.split("Let me check.")[0][-5:]
    assert prompt == prompt_text(engine, 1)  # the chat completion of the same conversation
    assert engine.requests[0][2].session_id == "user_7"


@pytest.mark.parametrize(("system", "expected"), [
    (BILLING.format("1a2b3") + "\nYou are Claude Code.", "You are Claude Code."),
    (BILLING.format("ffff0"), ""),
    ("You are terse.", "You are terse."),
    ("Quote: x-anthropic-billing-header: cch=1;", "Quote: x-anthropic-billing-header: cch=1;"),
])
def test_strip_billing_header(system: str, expected: str) -> None:
    assert strip_billing_header(system) == expected


def test_claude_codes_requests_share_their_prefix(engine) -> None:
    """Two requests of one conversation whose billing headers differ: the second reuses the first's prefix."""
    system = [None, {"type": "text", "text": "You are a coding agent. Answer in one line."}]
    messages = [{"role": "user", "content": "List the files."}]
    with running_server(engine) as url:
        client = anthropic_of(url)
        system[0] = {"type": "text", "text": BILLING.format("1a2b3")}
        first = client.messages.create(model=MODEL, max_tokens=4, system=system, messages=messages)
        system[0] = {"type": "text", "text": BILLING.format("9f8e7")}
        messages += [{"role": "assistant", "content": first.content[0].text},
                     {"role": "user", "content": "Now the tests."}]
        second = client.messages.create(model=MODEL, max_tokens=4, system=system, messages=messages)
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    # everything up to the first reply is reused (the reply's own last token may be recomputed)
    assert second.usage.cache_read_input_tokens >= prompt
    assert second.model_extra["hvd"]["stats"]["reused_prefix_tokens"] == second.usage.cache_read_input_tokens


def test_greedy_message_equals_the_chat_completion(url) -> None:
    system = "Be brief."
    message = anthropic_of(url).messages.create(model=MODEL, max_tokens=12, system=system,
                                                messages=[{"role": "user", "content": "Name three primes."}])
    chat = client_of(url).chat.completions.create(model=MODEL, max_tokens=12, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Name three primes."}])
    assert message.content[0].text == chat.choices[0].message.content
    assert message.usage.output_tokens == chat.usage.completion_tokens
    counted = anthropic_of(url).messages.count_tokens(model=MODEL, system=system, messages=[
        {"role": "user", "content": "Name three primes."}])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_count_tokens_with_tools(scripted) -> None:
    with running_server(scripted(["ok"])) as url:
        client = anthropic_of(url)
        bare = client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens
        with_tools = client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER]).input_tokens
        used = client.messages.create(model=MODEL, max_tokens=1, messages=ASK, tools=[WEATHER]).usage
    assert 0 < bare < with_tools
    assert used.input_tokens + used.cache_read_input_tokens == with_tools


@pytest.mark.parametrize(("body", "fragment"), [
    ({"messages": ASK}, "max_tokens"),
    ({"messages": ASK, "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}], "max_tokens": 5},
     "messages[0].content[0]: images are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]}], "max_tokens": 5}, "documents"),
    ({"messages": ASK, "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools[0].type"),
    ({"messages": ASK, "max_tokens": 5, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "nope"),
    ({"messages": ASK, "max_tokens": 5, "tool_choice": {"type": "any"}}, "no tools"),
    ({"messages": [{"role": "tool", "content": "x"}], "max_tokens": 5}, "messages[0].role"),
    ({"messages": [*ASK, {"role": "system", "content": [{"type": "image"}]}], "max_tokens": 5},
     "messages[1].content[0]: images"),
])
def test_invalid_requests_in_anthropic_shape(url, body, fragment) -> None:
    response = httpx.post(f"{url}/v1/messages", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert fragment in error["error"]["message"]


def test_sdk_errors_and_keys(engine) -> None:
    with running_server(engine, api_key="sekrit") as url:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            anthropic_of(url, api_key="wrong").messages.create(model=MODEL, max_tokens=2, messages=ASK)
        assert denied.value.body["error"]["type"] == "authentication_error"
        assert anthropic_of(url, api_key="sekrit").messages.create(model=MODEL, max_tokens=2, messages=ASK).content
        bearer = anthropic.Anthropic(base_url=url, auth_token="sekrit", max_retries=0)  # Authorization: Bearer
        assert bearer.messages.count_tokens(model=MODEL, messages=ASK).input_tokens > 0
        keyed = anthropic_of(url, api_key="sekrit")
        with pytest.raises(anthropic.NotFoundError) as unknown:
            keyed.messages.create(model="claude-sonnet-4-5", max_tokens=2, messages=ASK)
        assert unknown.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.BadRequestError) as too_long:
            keyed.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "word " * 4000}])
        assert too_long.value.body["error"]["type"] == "invalid_request_error"
        assert too_long.value.body["error"]["message"].startswith("prompt is too long: the prompt has")
        # OpenAI routes keep OpenAI's envelope
        assert httpx.get(f"{url}/v1/models").json()["error"]["code"] == "invalid_api_key"


def test_error_types_follow_the_status() -> None:
    busy = APIError(503, "the server is busy", "server_error", None, "queue_full")
    assert busy.anthropic_body() == {"type": "error", "error": {"type": "overloaded_error",
                                                                "message": "the server is busy"}}
    assert APIError(504, "slow", "server_error").anthropic_body()["error"]["type"] == "timeout_error"
    assert APIError(413, "big").anthropic_body()["error"]["type"] == "request_too_large"
    assert APIError(500, "bug", "server_error").anthropic_body()["error"]["type"] == "api_error"


def test_a_full_queue_is_overloaded(scripted) -> None:
    engine = scripted(["x"] * 100, finish="length", delay=0.01)
    with running_server(engine, max_pending=1) as url:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 100, "stream": True}
        with httpx.stream("POST", f"{url}/v1/messages", json=body) as running:
            lines = running.iter_lines()
            assert next(lines) == "event: message_start"
            refused = httpx.post(f"{url}/v1/messages", json={**body, "stream": False})
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["type"] == "overloaded_error"


def test_structured_output_is_the_chat_routes_response_format(scripted) -> None:
    # the model writes the whole object, '{' included; what an engine that ignores the grammar adds is cut
    engine = scripted(['{"name": "Ann", ', '"age": 7}', " and more text"], finish="stop")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    person = [{"role": "user", "content": "A person."}]
    with running_server(engine) as url:
        message = anthropic_of(url).messages.create(model=MODEL, max_tokens=30, messages=person, output_config={
            "format": {"type": "json_schema", "schema": schema}, "effort": "low"})
        client_of(url).chat.completions.create(model=MODEL, max_tokens=30, messages=person, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert message.content[0].text == '{"name": "Ann", "age": 7}'
    assert prompt_text(engine, 0) == prompt_text(engine, 1) and prompt_text(engine, 0).endswith("assistant\n")
    constraint = engine.requests[0][1].constraint
    assert constraint == engine.requests[1][1].constraint  # the same grammar as the chat route's response_format
    assert constraint.kind == "json_schema" and constraint.schema()["properties"] == schema["properties"]


def test_system_messages_in_the_conversation(scripted) -> None:
    """Claude Code sends system messages among the turns: each is a system message where it stands."""
    engine = scripted(["ok"], finish="stop")
    note = "Available agent types: none."
    with running_server(engine, api_key="k") as url:
        anthropic_of(url, api_key="k").messages.create(model=MODEL, max_tokens=4, messages=[
            *ASK, {"role": "system", "content": [{"type": "text", "text": note}]}])
        client_of(url).with_options(api_key="k").chat.completions.create(model=MODEL, max_tokens=4, messages=[
            *ASK, {"role": "system", "content": note}])
        root = httpx.head(f"{url}/")  # where Claude Code probes the server: open, like /health
    assert prompt_text(engine, 0) == prompt_text(engine, 1) and note in prompt_text(engine, 0)
    assert root.status_code == 200
