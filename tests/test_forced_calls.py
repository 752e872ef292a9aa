"""Forced and automatic tool calls that hold: decoded under the grammar of the declared tools.

A forced ``tool_choice`` (``"required"``, ``"any"``, a tool name) makes the reply exactly one
call in the model's own syntax to a declared tool, with arguments valid against that tool's
schema; ``"auto"`` lets the model answer in text, and a call it opens is a valid one. The tiny
random model writes anything, so a valid call shows the grammar, not the model's skill; the
scripted engine (which ignores the grammar) shows how the reply pipeline reads a call that
does not parse, as a reply cut by ``max_tokens`` leaves it.
"""


import json
from typing import Literal

import jsonschema
import openai
import pytest
from langchain_hvd import ChatHVD
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.hvd import HVD

from hvd_agents import Engine
from tests.server_helpers import IM_END_ID, running_server
from tests.tiny import make_tiny_llama

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def tool(name: str, key: str, value: dict) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"{name} tool.",
        "parameters": {"type": "object", "properties": {key: value}, "required": [key]}}}


# bounded values: the random model never ends a string or a number by itself
WEATHER = tool("get_weather", "city", {"type": "string", "maxLength": 8})
SEARCH = tool("search", "n", {"type": "integer", "minimum": 0, "maximum": 99})
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}


@pytest.fixture(scope="module")
def long_engine(byte_tokenizer) -> Engine:
    """An engine on a tiny random model with room for the tools' system block (the byte tokenizer's prompts are long)."""
    return Engine(make_tiny_llama(len(byte_tokenizer), seed=7, max_positions=2048), byte_tokenizer,
                  eos_token_ids=(IM_END_ID,), draft_head=None)


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def assert_valid(name: str, arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, {**SCHEMAS[name], "additionalProperties": False})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice, names", [("required", {"get_weather", "search"}), ("search", {"search"})])
def test_a_forced_call_is_one_valid_call_to_a_declared_tool(long_engine, stream, choice, names) -> None:
    with running_server(long_engine) as url:
        reply = client_of(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, SEARCH],
                                                       tool_choice=choice, max_tokens=200, stream=stream)
        chunks = list(reply) if stream else []
    if stream:
        deltas = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
        calls = [(deltas[0].function.name, "".join(c.function.arguments for c in deltas))]
        finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    else:
        calls = [(c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls]
        finish = reply.choices[0].finish_reason
    assert len(calls) == 1 and calls[0][0] in names and finish == "tool_calls"
    assert_valid(*calls[0])


@pytest.mark.parametrize("method", ["ar", "pld", "hvd"])
def test_chat_hvd_forced_calls_are_valid_and_lossless(long_engine, method) -> None:
    llm = ChatHVD(engine=long_engine, max_tokens=200, method=method)
    message = llm.bind_tools([WEATHER, SEARCH], tool_choice="required").invoke("Weather?")
    assert len(message.tool_calls) == 1 and not message.invalid_tool_calls
    assert_valid(message.tool_calls[0]["name"], message.tool_calls[0]["args"])
    one = llm.bind_tools([SEARCH], tool_choice="any").invoke("Weather?")
    assert [call["name"] for call in one.tool_calls] == ["search"]
    reference = ChatHVD(engine=long_engine, max_tokens=200, method="ar").bind_tools(
        [WEATHER, SEARCH], tool_choice="required").invoke("Weather?")
    assert (message.content, message.tool_calls[0]["name"], message.tool_calls[0]["args"]) == \
        (reference.content, reference.tool_calls[0]["name"], reference.tool_calls[0]["args"])


def test_auto_answers_in_text_or_in_valid_calls(long_engine) -> None:
    llm = ChatHVD(engine=long_engine, max_tokens=120, method="hvd").bind_tools([WEATHER, SEARCH])
    for question in ("Weather?", "What is the weather in Paris?", "Search for 3"):
        message = llm.invoke(question)
        assert not message.invalid_tool_calls or message.response_metadata["finish_reason"] == "length"
        for call in message.tool_calls:
            assert_valid(call["name"], call["args"])
        assert "<tool_call>" not in message.content


def get_weather(city: Literal["Paris", "Oslo"]) -> str:  # bounded: the random model never ends a free string
    """Weather of a city."""
    return "sunny"


def search(n: Literal[1, 2, 3]) -> str:
    """Search the web."""
    return "found"


def test_llama_index_tool_required_is_a_valid_call(long_engine) -> None:
    llm = HVD(engine=long_engine, max_tokens=200)
    tools = [FunctionTool.from_defaults(get_weather), FunctionTool.from_defaults(search)]
    response = llm.chat_with_tools(tools, chat_history=[ChatMessage(role="user", content="Weather?")],
                                   tool_required=True)
    calls = llm.get_tool_calls_from_response(response)
    assert len(calls) == 1 and calls[0].tool_name in ("get_weather", "search")
    assert calls[0].tool_kwargs in ({"city": "Paris"}, {"city": "Oslo"}, {"n": 1}, {"n": 2}, {"n": 3})


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_that_does_not_parse_comes_back_as_content(scripted, stream) -> None:
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": ', "Paris", " is sunny"], finish="stop")
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
    assert content == '<tool_call>\n{"name": "get_weather", "arguments": Paris is sunny'
    assert calls == [] and finish == ["invalid_tool_call"]
    assert engine.requests[-1][1].constraint is not None  # the request was sent under the call grammar


def test_the_adapters_report_a_forced_call_that_does_not_parse_as_invalid(scripted) -> None:
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": Paris is sunny}\n</tool_call>'],
                      finish="stop")
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
    # cut by max_tokens inside its arguments: the grammar holds what was written, not an unwritten end
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'], finish="length")
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
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>' in \
        engine.tokenizer.decode(engine.requests[-1][0])
    assert "messages[1].tool_calls[0].function.arguments is not valid JSON" in caplog.text
