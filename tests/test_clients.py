"""Real client libraries drive the server on the embedded SmolLM2-135M: a forced call, then an agent loop.

Five client libraries, each streamed and not (pinned in the ``clients`` extra of pyproject.toml):

* the official ``openai`` SDK on chat completions and on the Responses API,
* ``langchain-openai``'s ``ChatOpenAI`` in LangChain's ``create_agent``, on chat completions and
  (``use_responses_api=True``) on the Responses API,
* ``llama-index``'s ``OpenAILike`` in a ``FunctionAgent``,
* ``openai-agents``' ``Agent`` (the Responses API, the SDK's default).

Two checks per client and mode: **forced call parsed** (the client forces a call to the one
declared tool the way it does so itself, and reads back a call of that tool whose arguments
are a JSON object of its parameters) and **agent loop completes** (forced call -> the tool
runs -> its result goes back -> the model answers in text, the loop ends). The 135M model
cannot choose tools freely, so it is steered as the examples steer it: an earlier exchange
about London shows the pattern, the first call of the turn is forced, the answering call
forbids tools (``tool_choice="none"``). The checks are about the protocol, not the
model's answers. The module prints the table client x {stream, no stream} x {check} at
its end (docs/server.md has one run's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from tests.server_helpers import running_server

pytestmark = pytest.mark.real_model

MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS = 64
SYSTEM = "You are a helpful assistant that uses tools to answer questions. Be concise and exact."
EXAMPLE_QUESTION = "What's the weather like in London today?"
EXAMPLE_ARGS = {"city": "London", "unit": "celsius"}
EXAMPLE_RESULT = json.dumps({"city": "London", "temperature": 14, "unit": "celsius", "condition": "partly cloudy"})
EXAMPLE_ANSWER = "It is 14 degrees celsius and partly cloudy in London."
QUESTION = "And what's the weather like in Paris today?"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "description": "The city."},
                                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
              "required": ["city"]}
DESCRIPTION = "Get the current weather for a city."
CHECKS = ("forced call parsed", "agent loop completes")
RESULTS: dict[tuple[str, bool, str], str] = {}


def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather for a city."""
    return json.dumps({"city": city, "temperature": {"Paris": 18, "London": 14}.get(city, 21), "unit": unit,
                       "condition": "partly cloudy"})


@dataclasses.dataclass
class Loop:
    """What an agent loop did: the calls it ran (name, arguments) and its final answer."""

    calls: list[tuple[str, dict]]
    answer: str


def _run_tool(arguments: dict) -> str:
    """The tool on the arguments it declares (the model may add others or miss one: that is the model's)."""
    return get_weather(str(arguments.get("city", "")), str(arguments.get("unit", "celsius")))


def _arguments(text: str | dict) -> dict:
    """A call's arguments as the client got them: JSON object text (or the object a client parsed)."""
    arguments = json.loads(text) if isinstance(text, str) else text
    assert isinstance(arguments, dict), f"arguments are not a JSON object: {text!r}"
    return arguments


# ====================================================================== the official openai SDK


def _chat_history() -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": json.dumps(EXAMPLE_ARGS)}}
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": EXAMPLE_QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": EXAMPLE_RESULT},
            {"role": "assistant", "content": EXAMPLE_ANSWER}, {"role": "user", "content": QUESTION}]


def _responses_history() -> list[dict]:
    return [{"role": "user", "content": EXAMPLE_QUESTION},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": json.dumps(EXAMPLE_ARGS)},
            {"type": "function_call_output", "call_id": "call_1", "output": EXAMPLE_RESULT},
            {"role": "assistant", "content": EXAMPLE_ANSWER}, {"role": "user", "content": QUESTION}]


class OpenAIChat:
    """``client.chat.completions.create`` with ``tool_choice="required"`` (one tool: that tool)."""

    TOOLS: ClassVar[list[dict]] = [{"type": "function", "function": {
        "name": "get_weather", "description": DESCRIPTION, "parameters": PARAMETERS}}]

    def __init__(self, url: str) -> None:
        import openai

        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def _reply(self, messages: list[dict], tool_choice: str, stream: bool) -> tuple[str, list[tuple[str, str]]]:
        request = {"model": MODEL, "messages": messages, "tools": self.TOOLS, "tool_choice": tool_choice,
                   "max_tokens": MAX_TOKENS, "temperature": 0}
        if not stream:
            message = self.client.chat.completions.create(**request).choices[0].message
            return message.content or "", [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
        content, calls = "", {}
        for chunk in self.client.chat.completions.create(**request, stream=True):  # one entry per index, as OpenAI
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            for call in (delta.tool_calls or ()) if delta else ():
                name, arguments = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
        return content, [calls[index] for index in sorted(calls)]

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        return self._reply(_chat_history(), "required", stream)[1]

    def agent_loop(self, stream: bool) -> Loop:
        messages, ran = _chat_history(), []
        for tool_choice in ("required", "none"):
            content, calls = self._reply(messages, tool_choice, stream)
            if not calls:
                return Loop(ran, content)
            messages.append({"role": "assistant", "content": content or None, "tool_calls": [
                {"id": f"call_{len(ran) + n}", "type": "function", "function": {"name": name, "arguments": args}}
                for n, (name, args) in enumerate(calls)]})
            for n, (name, args) in enumerate(calls):
                ran.append((name, _arguments(args)))
                messages.append({"role": "tool", "tool_call_id": f"call_{len(ran) - 1}",
                                 "content": _run_tool(_arguments(args))})
        raise AssertionError(f"the loop did not end: calls {ran}")


class OpenAIResponses(OpenAIChat):
    """``client.responses.create`` with a named ``tool_choice``; the loop continues by ``previous_response_id``."""

    TOOLS: ClassVar[list[dict]] = [{"type": "function", "name": "get_weather", "description": DESCRIPTION,
                                    "parameters": PARAMETERS}]
    FORCED: ClassVar[dict] = {"type": "function", "name": "get_weather"}

    def _respond(self, stream: bool, **request: Any):
        request = {"model": MODEL, "tools": self.TOOLS, "max_output_tokens": MAX_TOKENS, "temperature": 0,
                   "instructions": SYSTEM, **request}
        if not stream:
            return self.client.responses.create(**request)
        final = None
        for event in self.client.responses.create(**request, stream=True):
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        assert final is not None, "the stream had no response.completed event"
        return final

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        response = self._respond(stream, input=_responses_history(), tool_choice=self.FORCED)
        return [(item.name, item.arguments) for item in response.output if item.type == "function_call"]

    def agent_loop(self, stream: bool) -> Loop:
        response = self._respond(stream, input=_responses_history(), tool_choice=self.FORCED)
        calls = [item for item in response.output if item.type == "function_call"]
        ran = [(call.name, _arguments(call.arguments)) for call in calls]
        outputs = [{"type": "function_call_output", "call_id": call.call_id,
                    "output": _run_tool(_arguments(call.arguments))} for call in calls]
        answer = self._respond(stream, input=outputs, previous_response_id=response.id, tool_choice="none")
        assert not [item for item in answer.output if item.type == "function_call"], "a call under tool_choice=none"
        return Loop(ran, answer.output_text)


# ====================================================================== LangChain: ChatOpenAI + create_agent


class LangChainOpenAI:
    """``ChatOpenAI(base_url=...)``: ``bind_tools(tool_choice="get_weather")``; ``create_agent`` steered by middleware."""

    def __init__(self, url: str) -> None:
        self.url = url

    RESPONSES_API = False

    def _model(self, stream: bool):
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(base_url=f"{self.url}/v1", api_key="unused", model=MODEL, temperature=0,
                          max_tokens=MAX_TOKENS, max_retries=0, streaming=stream,
                          use_responses_api=self.RESPONSES_API)

    @staticmethod
    def _history() -> list:
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

        call = {"name": "get_weather", "args": EXAMPLE_ARGS, "id": "call_1", "type": "tool_call"}
        return [SystemMessage(SYSTEM), HumanMessage(EXAMPLE_QUESTION), AIMessage("", tool_calls=[call]),
                ToolMessage(EXAMPLE_RESULT, tool_call_id="call_1"), AIMessage(EXAMPLE_ANSWER), HumanMessage(QUESTION)]

    @staticmethod
    def _tool():
        from langchain_core.tools import StructuredTool

        return StructuredTool.from_function(get_weather, description=DESCRIPTION)

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        message = self._model(stream).bind_tools([self._tool()], tool_choice="get_weather").invoke(self._history())
        return [(call["name"], call["args"]) for call in message.tool_calls]

    def agent_loop(self, stream: bool) -> Loop:
        from langchain.agents import create_agent
        from langchain.agents.middleware import wrap_model_call
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

        @wrap_model_call
        def steer(request, handler):  # force the call until its result is in, then forbid calls
            last_human = max(i for i, m in enumerate(request.messages) if isinstance(m, HumanMessage))
            answered = any(isinstance(m, ToolMessage) for m in request.messages[last_human:])
            return handler(request.override(tool_choice="none" if answered else "get_weather"))

        agent = create_agent(self._model(stream), tools=[self._tool()], middleware=[steer])
        messages = agent.invoke({"messages": self._history()}, {"recursion_limit": 8})["messages"]
        turn = messages[max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage)):]
        calls = [(c["name"], c["args"]) for m in turn if isinstance(m, AIMessage) for c in m.tool_calls]
        assert isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls
        return Loop(calls, messages[-1].text)


class LangChainOpenAIResponses(LangChainOpenAI):
    """The same, with ``ChatOpenAI(use_responses_api=True)``: the model calls go to ``/v1/responses``."""

    RESPONSES_API = True


# ====================================================================== LlamaIndex: OpenAILike + FunctionAgent


class LlamaIndexOpenAILike:
    """``OpenAILike`` in a ``FunctionAgent`` (``initial_tool_choice``); ``chat_with_tools(tool_required=True)``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _llm(self):
        from llama_index.llms.openai_like import OpenAILike

        class Steered(OpenAILike):
            """Forbids calls once the turn has a tool result (the answering call), as the examples steer."""

            # tool_required is named: LlamaIndex passes it on only to a signature that names it
            def _prepare_chat_with_tools(self, tools, user_msg=None, chat_history=None, tool_required=False,
                                         **kwargs):
                if chat_history and chat_history[-1].role.value == "tool":
                    kwargs["tool_choice"] = "none"
                return super()._prepare_chat_with_tools(tools, user_msg=user_msg, chat_history=chat_history,
                                                        tool_required=tool_required, **kwargs)

        return Steered(model=MODEL, api_base=f"{self.url}/v1", api_key="unused", is_chat_model=True,
                       is_function_calling_model=True, context_window=8192, temperature=0, max_tokens=MAX_TOKENS,
                       max_retries=0)

    @staticmethod
    def _history() -> list:
        from llama_index.core.llms import ChatMessage

        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                 "arguments": json.dumps(EXAMPLE_ARGS)}}
        return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=EXAMPLE_QUESTION),
                ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [call]}),
                ChatMessage(role="tool", content=EXAMPLE_RESULT, additional_kwargs={"tool_call_id": "call_1"}),
                ChatMessage(role="assistant", content=EXAMPLE_ANSWER)]

    @staticmethod
    def _tool():
        from llama_index.core.tools import FunctionTool

        return FunctionTool.from_defaults(get_weather, description=DESCRIPTION)

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        from llama_index.core.llms import ChatMessage

        llm, tool = self._llm(), self._tool()
        history = [*self._history(), ChatMessage(role="user", content=QUESTION)]
        if stream:
            response = None
            for response in llm.stream_chat_with_tools([tool], chat_history=history, tool_required=True):
                pass
        else:
            response = llm.chat_with_tools([tool], chat_history=history, tool_required=True)
        calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
        return [(call.tool_name, call.tool_kwargs) for call in calls]

    def agent_loop(self, stream: bool) -> Loop:
        from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

        agent = FunctionAgent(tools=[self._tool()], llm=self._llm(), streaming=stream,
                              initial_tool_choice="get_weather")

        async def run() -> Loop:
            handler = agent.run(user_msg=QUESTION, chat_history=self._history(), max_iterations=4)
            calls = [(event.tool_name, event.tool_kwargs) async for event in handler.stream_events()
                     if isinstance(event, ToolCallResult)]
            result = await handler
            return Loop(calls, str(result.response.content or ""))

        return asyncio.run(run())


# ====================================================================== openai-agents: Agent over the Responses API


class OpenAIAgents:
    """``agents.Agent`` on ``OpenAIResponsesModel`` (``tool_choice="required"``), ``Runner.run`` / ``run_streamed``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _agent(self, tool_choice: str | None):
        from agents import Agent, AgentHooks, ModelSettings, OpenAIResponsesModel, function_tool, set_tracing_disabled
        from openai import AsyncOpenAI

        set_tracing_disabled(True)  # the SDK would export traces to OpenAI

        class Steer(AgentHooks):
            """Forbids calls once the tool ran (the answering call), as the examples steer."""

            async def on_tool_end(self, context, agent, tool, result) -> None:
                agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")

        client = AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        tool = function_tool(get_weather, description_override=DESCRIPTION)
        return Agent(name="weather", instructions=SYSTEM, model=model, tools=[tool], hooks=Steer(),
                     model_settings=ModelSettings(tool_choice=tool_choice, temperature=0, max_tokens=MAX_TOKENS),
                     reset_tool_choice=False)

    def _run(self, agent, stream: bool):
        from agents import Runner

        async def run():
            if not stream:
                return await Runner.run(agent, _responses_history(), max_turns=4)
            result = Runner.run_streamed(agent, _responses_history(), max_turns=4)
            async for _ in result.stream_events():
                pass
            return result

        return asyncio.run(run())

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        from agents import StopAtTools

        agent = self._agent("required")
        agent.tool_use_behavior = StopAtTools(stop_at_tool_names=["get_weather"])  # the call, not the loop
        result = self._run(agent, stream)
        return [(item.raw_item.name, item.raw_item.arguments) for item in result.new_items
                if item.type == "tool_call_item"]

    def agent_loop(self, stream: bool) -> Loop:
        result = self._run(self._agent("required"), stream)
        calls = [(item.raw_item.name, _arguments(item.raw_item.arguments)) for item in result.new_items
                 if item.type == "tool_call_item"]
        return Loop(calls, str(result.final_output or ""))


CLIENTS = {  # test id: (the table's row, the driver)
    "openai-chat": ("openai SDK, chat completions", OpenAIChat),
    "openai-responses": ("openai SDK, responses", OpenAIResponses),
    "langchain": ("langchain-openai ChatOpenAI (create_agent)", LangChainOpenAI),
    "langchain-responses": ("langchain-openai ChatOpenAI, use_responses_api (create_agent)",
                            LangChainOpenAIResponses),
    "llama-index": ("llama-index OpenAILike (FunctionAgent)", LlamaIndexOpenAILike),
    "openai-agents": ("openai-agents Agent (responses)", OpenAIAgents),
}


# ====================================================================== the checks and the table


@pytest.fixture(scope="module")
def url(real_engine) -> Iterator[str]:
    with running_server(real_engine) as base:
        yield base


@pytest.fixture(scope="module", autouse=True)
def table(request) -> Iterator[None]:
    """Writes the table of this module's results at its end (also under output capture)."""
    RESULTS.clear()
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not RESULTS:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write_line("")
        for line in result_table(RESULTS):
            reporter.write_line(line)


def result_table(results: dict[tuple[str, bool, str], str]) -> list[str]:
    """The markdown table client x {no stream, stream} x {forced call parsed, agent loop completes}."""
    columns = [(stream, check) for stream in (False, True) for check in CHECKS]
    lines = ["| client | " + " | ".join(f"{'stream' if s else 'no stream'}: {c}" for s, c in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for client, (row, _) in CLIENTS.items():
        cells = [results.get((client, stream, check), "not run") for stream, check in columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


@contextlib.contextmanager
def recorded(client: str, stream: bool, check: str) -> Iterator[None]:
    RESULTS[(client, stream, check)] = "FAIL"
    yield
    RESULTS[(client, stream, check)] = "pass"


def _check_call(name: str, arguments: Any) -> dict:
    """A call of the declared tool whose arguments are a JSON object (which keys the model wrote is its own)."""
    assert name == "get_weather", f"a call of {name!r}, not of the declared tool"
    return _arguments(arguments)


@pytest.mark.parametrize("stream", [False, True], ids=["no-stream", "stream"])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_forced_call_is_parsed(url, client, stream) -> None:
    with recorded(client, stream, CHECKS[0]):
        calls = CLIENTS[client][1](url).forced_call(stream)
        assert len(calls) == 1, f"expected one call, got {calls}"
        _check_call(*calls[0])


@pytest.mark.parametrize("stream", [False, True], ids=["no-stream", "stream"])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_the_agent_loop_completes(url, client, stream) -> None:
    with recorded(client, stream, CHECKS[1]):
        loop = CLIENTS[client][1](url).agent_loop(stream)
        assert loop.calls, "the loop ran no tool"
        for name, arguments in loop.calls:
            _check_call(name, arguments)
        assert loop.answer.strip(), "the loop ended without an answer"
