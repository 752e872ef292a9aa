"""Forced tool calls that hold: the name kept to the declared tools, over HTTP and in both adapters.

The scripted engine says exactly what the model "wrote" (one script per engine call: a
forced call among several tools decodes its name first, then the call); the tiny random
model writes anything, so a name it decodes shows the constraint, not the model's skill.
"""

from __future__ import annotations

import json

import openai
import pytest
from langchain_hvd import ChatHVD
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.hvd import HVD

from tests.scripted import ScriptsEngine
from tests.server_helpers import running_server, tiny_engine

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def tool(name: str, key: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"{name} tool.",
        "parameters": {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}}}


WEATHER, SEARCH = tool("get_weather", "city"), tool("search", "query")
# bare schemas: the byte tokenizer's prompts must fit the tiny model's 512 positions
BARE = [{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "search"}}]


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def prompt_text(engine, index: int = -1) -> str:
    return engine.tokenizer.decode(engine.requests[index][0])


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_one_tool_is_that_tool(tiny_model, byte_tokenizer, stream) -> None:
    engine = ScriptsEngine(tiny_model, byte_tokenizer, [['{"city": "Paris"}', "}"]])
    with running_server(engine) as url:
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                       tool_choice="required", stream=stream)
        if stream:
            chunks = list(reply)
    assert prompt_text(engine).endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    if stream:
        calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        name, arguments = calls[0].function.name, "".join(c.function.arguments for c in calls)
    else:
        name, arguments = reply.choices[0].message.tool_calls[0].function.name, \
            reply.choices[0].message.tool_calls[0].function.arguments
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Paris"})


def test_required_among_several_tools_keeps_the_name_to_them(tiny_model, byte_tokenizer) -> None:
    # the model invents a name ("Paris"): decoding stops there and the call is decoded with a declared name
    engine = ScriptsEngine(tiny_model, byte_tokenizer, [['{"name": "Par', 'is", "arguments": {}}'],
                                                        ['"Paris"}', "}"]])
    with running_server(engine) as url:
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, SEARCH],
                                                       tool_choice="required")
    assert prompt_text(engine, 0).endswith("<|im_start|>assistant\n<tool_call>\n")
    # the restarted call starts with the name and the schema's first required key
    assert prompt_text(engine, 1).endswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": ')
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert reply.choices[0].finish_reason == "tool_calls"


def test_a_written_name_that_is_declared_is_kept_as_written(tiny_model, byte_tokenizer) -> None:
    engine = ScriptsEngine(tiny_model, byte_tokenizer, [['{"name": "sea', 'rch", "arguments": {"query": "x"}}']])
    with running_server(engine) as url:
        chunks = list(client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, SEARCH],
                                                              tool_choice="required", stream=True))
    calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "search" and "".join(c.function.arguments for c in calls) == '{"query": "x"}'
    assert len(engine.requests) == 1  # one decoding: the model's own reply


def names_of(message) -> list[str]:
    return [call["name"] for call in message.tool_calls] + [call["name"] for call in message.invalid_tool_calls]


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_chat_hvd_keeps_a_random_models_forced_name_to_the_tools(tiny_model, byte_tokenizer, method) -> None:
    engine = tiny_engine(tiny_model, byte_tokenizer)
    llm = ChatHVD(engine=engine, max_tokens=12, method=method)
    message = llm.bind_tools(BARE, tool_choice="required").invoke("Weather?")
    assert names_of(message) and set(names_of(message)) <= {"get_weather", "search"}
    one = llm.bind_tools(BARE[1:], tool_choice="any").invoke("Weather?")
    assert names_of(one) == ["search"]


def test_forced_names_are_lossless(tiny_model, byte_tokenizer) -> None:
    """The name phase decodes like any request: greedy output is the same whatever the method."""
    engine = tiny_engine(tiny_model, byte_tokenizer)
    replies = [ChatHVD(engine=engine, max_tokens=16, method=method).bind_tools(BARE, tool_choice="required")
               .invoke("Weather?") for method in ("ar", "pld")]
    ar, pld = [(m.content, names_of(m), m.tool_calls, [c["args"] for c in m.invalid_tool_calls]) for m in replies]
    assert ar == pld


def test_llama_index_tool_required_keeps_the_name_to_the_tools(tiny_model, byte_tokenizer) -> None:
    def get_weather(city: str) -> str:
        """Weather of a city."""
        return "sunny"

    def search(query: str) -> str:
        """Search the web."""
        return "found"

    engine = ScriptsEngine(tiny_model, byte_tokenizer, [["Paris"], ['"Paris"}', "}"]])
    llm = HVD(engine=engine, max_tokens=12)
    tools = [FunctionTool.from_defaults(get_weather), FunctionTool.from_defaults(search)]
    response = llm.chat_with_tools(tools, chat_history=[ChatMessage(role="user", content="Weather?")],
                                   tool_required=True)
    calls = llm.get_tool_calls_from_response(response)
    assert [(call.tool_name, call.tool_kwargs) for call in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_that_does_not_parse_comes_back_as_content(scripted, stream) -> None:
    engine = scripted(["Paris", " is sunny"], finish="stop")  # the engine stops at "</tool_call>"
    with running_server(engine) as url:
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                       tool_choice="get_weather", stream=stream)
        chunks = list(reply) if stream else []
    if stream:
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        content, calls = reply.choices[0].message.content, reply.choices[0].message.tool_calls or []
        finish = [reply.choices[0].finish_reason]
    assert content == '<tool_call>\n{"name": "get_weather", "arguments": Paris is sunny</tool_call>'
    assert calls == [] and finish == ["invalid_tool_call"]


def test_a_forced_call_with_broken_arguments_says_so(scripted) -> None:
    engine = scripted(['{"city": Paris}', "}"], finish="stop")
    with running_server(engine) as url:
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                                       tool_choice="get_weather")
    assert reply.choices[0].message.tool_calls[0].function.arguments == '{"city": Paris}'  # as written
    assert reply.choices[0].finish_reason == "invalid_tool_call"


def test_the_adapters_report_a_forced_call_that_does_not_parse_as_invalid(scripted) -> None:
    engine = scripted(["Paris", " is sunny"], finish="stop")
    message = ChatHVD(engine=engine).bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Paris?")
    assert message.tool_calls == [] and [bad["name"] for bad in message.invalid_tool_calls] == ["get_weather"]
    assert "invalid JSON" in message.invalid_tool_calls[0]["error"]
    llm = HVD(engine=engine)
    response = llm.chat_with_tools([FunctionTool.from_defaults(fn=lambda city: city, name="get_weather",
                                                               description="Weather of a city.")],
                                   chat_history=[ChatMessage(role="user", content="Weather?")], tool_required=True)
    invalid = response.message.additional_kwargs["invalid_tool_calls"]
    assert [bad["name"] for bad in invalid] == ["get_weather"] and "invalid JSON" in invalid[0]["error"]


def test_a_truncated_call_the_server_wrote_is_accepted_back(scripted, caplog) -> None:
    engine = scripted(['{"city": "Par'], finish="length")  # cut by max_tokens inside its arguments
    with running_server(engine) as url:
        client = client_of(url)
        first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="get_weather",
                                               max_tokens=4)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "length" and call.function.arguments == '{"city": "Par'
        history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "error: the arguments were cut short"}]
        with caplog.at_level("WARNING", logger="hvd_agents.chat.render"):
            again = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER])
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>' in prompt_text(engine)
    assert "messages[1].tool_calls[0].function.arguments is not valid JSON" in caplog.text
