"""The server on the embedded SmolLM2-135M: a forced tool call over HTTP is a valid call, equal to ChatHVD's.

The conversation is the adapters' agent example (an earlier two-tool turn about London,
then the question about Paris), sent in OpenAI shape: assistant ``tool_calls`` and
``tool`` messages go through the server's request path into the same prompt ``ChatHVD``
renders, so the greedy replies must be the same, call for call.
"""

from __future__ import annotations

import json

import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_hvd import ChatHVD
from langchain_hvd._convert import to_openai_messages

from tests.agent_tools import QUESTION, SYSTEM, get_local_time, get_weather
from tests.server_helpers import running_server

pytestmark = pytest.mark.real_model

TOOLS = [convert_to_openai_tool(get_weather), convert_to_openai_tool(get_local_time)]


def _conversation() -> list:
    def call(name: str, args: dict, call_id: str) -> dict:
        return {"name": name, "args": args, "id": call_id, "type": "tool_call"}

    return [
        SystemMessage(SYSTEM),
        HumanMessage("What's the weather like in London today, and what time is it there?"),
        AIMessage("", tool_calls=[call("get_weather", {"city": "London", "unit": "celsius"}, "call_1")]),
        ToolMessage(json.dumps({"city": "London", "temperature": 14, "unit": "celsius",
                                "condition": "partly cloudy"}), tool_call_id="call_1"),
        AIMessage("", tool_calls=[call("get_local_time", {"city": "London"}, "call_2")]),
        ToolMessage(json.dumps({"city": "London", "time": "09:30"}), tool_call_id="call_2"),
        AIMessage("It is 14 degrees celsius and partly cloudy in London, and the local time is 09:30."),
        HumanMessage(QUESTION),
    ]


def test_forced_tool_call_over_http_equals_chat_hvd(real_engine) -> None:
    messages = to_openai_messages(_conversation())
    with running_server(real_engine) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        request = {"model": "SmolLM2-135M-Instruct", "messages": messages, "tools": TOOLS,
                   "tool_choice": "required", "max_tokens": 64, "temperature": 0}
        reply = client.chat.completions.create(**request)
        stream = list(client.chat.completions.create(**request, stream=True))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert [(name, args["city"]) for name, args in calls] == [("get_weather", "Paris")]
    # streamed in pieces: the first carries the name with the first arguments text, one entry per chunk
    pieces = [c.function.arguments for chunk in stream if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()]
    assert len(pieces) >= 2 and "".join(pieces) == choice.message.tool_calls[0].function.arguments

    expected = ChatHVD(engine=real_engine, max_tokens=64).bind_tools(TOOLS, tool_choice="required").invoke(
        _conversation())
    assert calls == [(call["name"], call["args"]) for call in expected.tool_calls]
    assert (choice.message.content or "") == expected.content
    assert reply.usage.completion_tokens == expected.usage_metadata["output_tokens"]
    assert reply.usage.prompt_tokens == expected.usage_metadata["input_tokens"]
