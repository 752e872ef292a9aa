"""Anthropic's and Ollama's client libraries drive the server on the embedded SmolLM2-135M: a forced call,
then an agent loop, as ``tests/test_clients.py`` does for OpenAI's.

Five clients, each streamed and not (pinned in the ``clients`` extra of pyproject.toml):

* the official ``anthropic`` SDK on ``/v1/messages`` (system blocks, a forced tool, the loop with
  ``tool_result``; streamed, the ``input_json_delta`` pieces add up to the final ``input``);
* ``langchain-anthropic``'s ``ChatAnthropic`` in LangChain's ``create_agent``;
* the official ``ollama`` client on ``/api/chat``;
* ``langchain-ollama``'s ``ChatOllama`` in ``create_agent``;
* ``llama-index-llms-ollama``'s ``Ollama`` in a ``FunctionAgent``.

The same two checks per client and mode (**forced call parsed**, **agent loop completes**) and the
same steering as the OpenAI clients: an earlier exchange about London shows the pattern, the first
call of the turn is forced, the answering call forbids calls. Anthropic's clients force and forbid
with ``tool_choice`` (``{"type": "tool", "name"}``, ``{"type": "none"}``). Ollama's API has no
``tool_choice``, so the Ollama clients are given an HTTP transport that adds the server's own
``tool_choice`` field to each ``/api/chat`` body (the tool while the turn has no tool result,
``"none"`` after it): the clients send and read everything else as they do against Ollama. The
``ollama`` client's ``generate`` and ``format`` have their own tests here. The module prints its
table at its end (docs/server.md has one run's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest

from tests.server_helpers import running_server
from tests.test_clients import (
    CHECKS,
    DESCRIPTION,
    EXAMPLE_ANSWER,
    EXAMPLE_ARGS,
    EXAMPLE_QUESTION,
    EXAMPLE_RESULT,
    MAX_TOKENS,
    MODEL,
    PARAMETERS,
    QUESTION,
    SYSTEM,
    Loop,
    get_weather,
)

pytestmark = pytest.mark.real_model

RESULTS: dict[tuple[str, bool, str], str] = {}


def _run_tool(arguments: dict) -> str:
    return get_weather(str(arguments.get("city", "")), str(arguments.get("unit", "celsius")))


# ====================================================================== the official anthropic SDK


class AnthropicSDK:
    """``client.messages.create`` / ``messages.stream`` with ``tool_choice={"type": "tool", "name": ...}``."""

    TOOLS: ClassVar[list[dict]] = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": PARAMETERS}]
    FORCED: ClassVar[dict] = {"type": "tool", "name": "get_weather"}

    def __init__(self, url: str) -> None:
        import anthropic

        self.client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)

    @staticmethod
    def history() -> list[dict]:
        call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": EXAMPLE_ARGS}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": EXAMPLE_RESULT}
        return [{"role": "user", "content": EXAMPLE_QUESTION}, {"role": "assistant", "content": [call]},
                {"role": "user", "content": [result]}, {"role": "assistant", "content": EXAMPLE_ANSWER},
                {"role": "user", "content": QUESTION}]

    def reply(self, messages: list[dict], tool_choice: dict, stream: bool):
        request = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages, "tools": self.TOOLS,
                   "tool_choice": tool_choice, "system": [{"type": "text", "text": SYSTEM,
                                                           "cache_control": {"type": "ephemeral"}}]}
        if not stream:
            return self.client.messages.create(**request)
        pieces: dict[int, str] = {}
        with self.client.messages.stream(**request) as events:
            for event in events:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    pieces[event.index] = pieces.get(event.index, "") + event.delta.partial_json
            message = events.get_final_message()
        for index, block in enumerate(message.content):  # the streamed pieces add up to the final input
            if block.type == "tool_use":
                assert json.loads(pieces[index]) == block.input, (pieces[index], block.input)
        return message

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        message = self.reply(self.history(), self.FORCED, stream)
        assert message.stop_reason == "tool_use", message.stop_reason
        return [(block.name, block.input) for block in message.content if block.type == "tool_use"]

    def agent_loop(self, stream: bool) -> Loop:
        messages, ran = self.history(), []
        for tool_choice in (self.FORCED, {"type": "none"}):
            message = self.reply(messages, tool_choice, stream)
            calls = [block for block in message.content if block.type == "tool_use"]
            if not calls:
                return Loop(ran, "".join(block.text for block in message.content if block.type == "text"))
            messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True)
                                                              for block in message.content]})
            ran += [(call.name, call.input) for call in calls]
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": _run_tool(call.input)} for call in calls]})
        raise AssertionError(f"the loop did not end: calls {ran}")


# ====================================================================== LangChain: ChatAnthropic + create_agent


def _langchain_history() -> list:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    call = {"name": "get_weather", "args": EXAMPLE_ARGS, "id": "call_1", "type": "tool_call"}
    return [SystemMessage(SYSTEM), HumanMessage(EXAMPLE_QUESTION), AIMessage("", tool_calls=[call]),
            ToolMessage(EXAMPLE_RESULT, tool_call_id="call_1"), AIMessage(EXAMPLE_ANSWER), HumanMessage(QUESTION)]


def _langchain_tool():
    from langchain_core.tools import StructuredTool

    return StructuredTool.from_function(get_weather, description=DESCRIPTION)


def _langchain_agent_loop(model, forced: Any, none: Any) -> Loop:
    """``create_agent`` over ``model``, its middleware forcing the call (``forced``) until the result is in, then
    forbidding calls (``none``), as tests/test_clients.py steers ``ChatOpenAI``."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    @wrap_model_call
    def steer(request, handler):
        last_human = max(i for i, m in enumerate(request.messages) if isinstance(m, HumanMessage))
        answered = any(isinstance(m, ToolMessage) for m in request.messages[last_human:])
        return handler(request.override(tool_choice=none if answered else forced))

    agent = create_agent(model, tools=[_langchain_tool()], middleware=[steer])
    messages = agent.invoke({"messages": _langchain_history()}, {"recursion_limit": 8})["messages"]
    turn = messages[max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage)):]
    calls = [(c["name"], c["args"]) for m in turn if isinstance(m, AIMessage) for c in m.tool_calls]
    assert isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls
    return Loop(calls, messages[-1].text)


class LangChainAnthropic:
    """``ChatAnthropic(base_url=...)``: ``bind_tools(tool_choice="get_weather")``; ``create_agent`` steered by
    middleware (``{"type": "none"}`` for the answer)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _model(self, stream: bool):
        from langchain_anthropic import ChatAnthropic

        return ChatAnthropic(base_url=self.url, api_key="unused", model=MODEL, temperature=0, max_tokens=MAX_TOKENS,
                             max_retries=0, streaming=stream)

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        message = self._model(stream).bind_tools([_langchain_tool()], tool_choice="get_weather").invoke(
            _langchain_history())
        return [(call["name"], call["args"]) for call in message.tool_calls]

    def agent_loop(self, stream: bool) -> Loop:
        return _langchain_agent_loop(self._model(stream), "get_weather", {"type": "none"})


# ====================================================================== Ollama: the transport that steers


def _steered_body(content: bytes) -> bytes:
    """An ``/api/chat`` body with the server's ``tool_choice``: the tool until the turn has a result, then none."""
    body = json.loads(content)
    if body.get("tools"):
        answered = body["messages"][-1].get("role") == "tool"
        body["tool_choice"] = "none" if answered else "get_weather"
    return json.dumps(body).encode()


class _Steer(httpx.HTTPTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/chat":
            request = httpx.Request(request.method, request.url, headers={
                k: v for k, v in request.headers.items() if k.lower() != "content-length"},
                content=_steered_body(request.read()))
        return super().handle_request(request)


class _AsyncSteer(httpx.AsyncHTTPTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/chat":
            request = httpx.Request(request.method, request.url, headers={
                k: v for k, v in request.headers.items() if k.lower() != "content-length"},
                content=_steered_body(await request.aread()))
        return await super().handle_async_request(request)


def _ollama_history() -> list[dict]:
    call = {"function": {"name": "get_weather", "arguments": EXAMPLE_ARGS}}
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": EXAMPLE_QUESTION},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": EXAMPLE_RESULT, "tool_name": "get_weather"},
            {"role": "assistant", "content": EXAMPLE_ANSWER}, {"role": "user", "content": QUESTION}]


class OllamaClient:
    """``ollama.Client(host=...).chat`` with the tool as a Python function; the loop by hand."""

    def __init__(self, url: str) -> None:
        import ollama

        self.client = ollama.Client(host=url, transport=_Steer())

    def reply(self, messages: list[dict], stream: bool):
        request = {"model": MODEL, "messages": messages, "tools": [get_weather], "options": {
            "temperature": 0, "num_predict": MAX_TOKENS}}
        if not stream:
            return self.client.chat(**request).message
        content, calls = "", []
        for chunk in self.client.chat(**request, stream=True):
            content += chunk.message.content or ""
            calls += chunk.message.tool_calls or []
        return {"content": content, "tool_calls": calls}

    def _calls(self, message) -> list:
        return list((message["tool_calls"] if isinstance(message, dict) else message.tool_calls) or ())

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        return [(call.function.name, dict(call.function.arguments))
                for call in self._calls(self.reply(_ollama_history(), stream))]

    def agent_loop(self, stream: bool) -> Loop:
        messages, ran = _ollama_history(), []
        for _ in range(2):
            message = self.reply(messages, stream)
            calls = self._calls(message)
            content = message["content"] if isinstance(message, dict) else message.content
            if not calls:
                return Loop(ran, content)
            messages.append({"role": "assistant", "content": content, "tool_calls": [
                {"function": {"name": call.function.name, "arguments": dict(call.function.arguments)}}
                for call in calls]})
            for call in calls:
                ran.append((call.function.name, dict(call.function.arguments)))
                messages.append({"role": "tool", "content": _run_tool(dict(call.function.arguments)),
                                 "tool_name": call.function.name})
        raise AssertionError(f"the loop did not end: calls {ran}")


class LangChainOllama:
    """``ChatOllama(base_url=...)`` in ``create_agent``; the steering transport forces and forbids the calls
    (ChatOllama sends no ``tool_choice``). ChatOllama always asks for NDJSON lines: its no-stream mode is
    LangChain's ``invoke``, its stream mode ``stream``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _model(self, stream: bool):
        from langchain_ollama import ChatOllama

        return ChatOllama(base_url=self.url, model=MODEL, temperature=0, num_predict=MAX_TOKENS,
                          disable_streaming=not stream, sync_client_kwargs={"transport": _Steer()},
                          async_client_kwargs={"transport": _AsyncSteer()})

    def forced_call(self, stream: bool) -> list[tuple[str, Any]]:
        model = self._model(stream).bind_tools([_langchain_tool()])
        if stream:
            message = None
            for chunk in model.stream(_langchain_history()):
                message = chunk if message is None else message + chunk
        else:
            message = model.invoke(_langchain_history())
        return [(call["name"], call["args"]) for call in message.tool_calls]

    def agent_loop(self, stream: bool) -> Loop:
        return _langchain_agent_loop(self._model(stream), None, None)


class LlamaIndexOllama:
    """LlamaIndex's ``Ollama`` in a ``FunctionAgent``; the steering transport forces and forbids the calls."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _llm(self):
        import ollama
        from llama_index.llms.ollama import Ollama

        return Ollama(model=MODEL, base_url=self.url, temperature=0, context_window=8192, request_timeout=300,
                      additional_kwargs={"num_predict": MAX_TOKENS},
                      client=ollama.Client(host=self.url, transport=_Steer(), timeout=300),
                      async_client=ollama.AsyncClient(host=self.url, transport=_AsyncSteer(), timeout=300))

    @staticmethod
    def _history() -> list:
        from llama_index.core.llms import ChatMessage

        call = {"function": {"name": "get_weather", "arguments": EXAMPLE_ARGS}}
        return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=EXAMPLE_QUESTION),
                ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [call]}),
                ChatMessage(role="tool", content=EXAMPLE_RESULT, additional_kwargs={"tool_name": "get_weather"}),
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
            for response in llm.stream_chat_with_tools([tool], chat_history=history):
                pass
        else:
            response = llm.chat_with_tools([tool], chat_history=history)
        calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
        return [(call.tool_name, call.tool_kwargs) for call in calls]

    def agent_loop(self, stream: bool) -> Loop:
        from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

        agent = FunctionAgent(tools=[self._tool()], llm=self._llm(), streaming=stream)

        async def run() -> Loop:
            handler = agent.run(user_msg=QUESTION, chat_history=self._history(), max_iterations=4)
            calls = [(event.tool_name, event.tool_kwargs) async for event in handler.stream_events()
                     if isinstance(event, ToolCallResult)]
            result = await handler
            return Loop(calls, str(result.response.content or ""))

        return asyncio.run(run())


CLIENTS = {  # test id: (the table's row, the driver)
    "anthropic": ("anthropic SDK, messages", AnthropicSDK),
    "langchain-anthropic": ("langchain-anthropic ChatAnthropic (create_agent)", LangChainAnthropic),
    "ollama": ("ollama client, chat", OllamaClient),
    "langchain-ollama": ("langchain-ollama ChatOllama (create_agent)", LangChainOllama),
    "llama-index-ollama": ("llama-index Ollama (FunctionAgent)", LlamaIndexOllama),
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
        header = ["client"] + [f"{mode}: {check}" for mode in ("no stream", "stream") for check in CHECKS]
        reporter.write_line("| " + " | ".join(header) + " |")
        reporter.write_line("|" + "---|" * len(header))
        for row, _ in CLIENTS.values():
            cells = [RESULTS.get((row, stream, check), "-") for stream in (False, True) for check in CHECKS]
            reporter.write_line(f"| {row} | " + " | ".join(cells) + " |")


@pytest.mark.parametrize("stream", [False, True], ids=["no-stream", "stream"])
@pytest.mark.parametrize("client_id", list(CLIENTS))
def test_forced_call_parsed(url, client_id, stream) -> None:
    row, driver = CLIENTS[client_id]
    RESULTS[(row, stream, CHECKS[0])] = "FAIL"
    calls = driver(url).forced_call(stream)
    assert calls, "no tool call came back"
    name, arguments = calls[0]
    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert name == "get_weather" and isinstance(arguments, dict), calls
    RESULTS[(row, stream, CHECKS[0])] = "pass"


@pytest.mark.parametrize("stream", [False, True], ids=["no-stream", "stream"])
@pytest.mark.parametrize("client_id", list(CLIENTS))
def test_agent_loop_completes(url, client_id, stream) -> None:
    row, driver = CLIENTS[client_id]
    RESULTS[(row, stream, CHECKS[1])] = "FAIL"
    loop = driver(url).agent_loop(stream)
    assert loop.calls and loop.calls[0][0] == "get_weather", loop
    assert loop.answer.strip(), loop
    RESULTS[(row, stream, CHECKS[1])] = "pass"


def test_anthropic_count_tokens_and_errors(url) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    counted = client.messages.count_tokens(model=MODEL, messages=AnthropicSDK.history(), tools=AnthropicSDK.TOOLS)
    used = client.messages.create(model=MODEL, max_tokens=1, messages=AnthropicSDK.history(),
                                  tools=AnthropicSDK.TOOLS).usage
    assert counted.input_tokens == used.input_tokens + used.cache_read_input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "word " * 9000}])
    assert too_long.value.body["error"]["message"].startswith("prompt is too long")


def test_ollama_generate_and_format(url) -> None:
    import ollama

    client = ollama.Client(host=url)
    whole = client.generate(model=MODEL, prompt="Say hello.", options={"num_predict": 8, "temperature": 0})
    streamed = "".join(chunk.response for chunk in client.generate(
        model=MODEL, prompt="Say hello.", options={"num_predict": 8, "temperature": 0}, stream=True))
    assert whole.response and streamed == whole.response and whole.eval_count <= 8
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reply = client.chat(model=MODEL, format=schema, options={"num_predict": 32, "temperature": 0},
                        messages=[{"role": "user", "content": "Name a city in France."}])
    assert isinstance(json.loads(reply.message.content), dict)
