"""LangChain's standard integration suite on ``ChatOpenAI(base_url=<the server>)``, embedded SmolLM2-135M.

The same suite ``ChatHVD`` passes in-process (integrations/langchain-hvd), here through the
OpenAI-compatible server and LangChain's own OpenAI client: messages, streaming, usage
(streamed too), stop sequences, tool calls, structured output and JSON mode over HTTP. The
server runs on a loopback port for the module (the engine of ``real_engine``, loaded once).
The tests overridden below are expected failures, each with the reason the 135M model
fails it; docs/server.md lists them.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

from tests.server_helpers import running_server

MODEL = "SmolLM2-135M-Instruct"
SERVER: dict[str, str] = {}
SCHEMA_ECHO = ("SmolLM2-135M, forced to start a {tool} call (tool_choice={choice!r}), writes the tool's JSON schema "
               "as the arguments instead of argument values, so no valid call is parsed")


@pytest.fixture(scope="module", autouse=True)
def server(real_engine) -> Iterator[str]:
    with running_server(real_engine) as url:
        SERVER["url"] = url
        yield url
    SERVER.clear()


@pytest.mark.real_model
class TestChatOpenAIOnTheServer(ChatModelIntegrationTests):
    """The standard integration suite, greedy, 48 tokens a call (as ``ChatHVD``'s)."""

    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict:
        # An async HTTP client per model: each coroutine test runs in an event loop of its own, and
        # ChatOpenAI's default async client is shared per base URL, its pooled connections bound to
        # the loop of the test that opened them ("Event loop is closed" in the next test).
        return {"base_url": f"{SERVER['url']}/v1", "api_key": "unused", "model": MODEL, "temperature": 0,
                "max_tokens": 48, "max_retries": 0, "stream_usage": True, "http_async_client": httpx.AsyncClient()}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return False

    # ------------------------------------------------------------------ the model's failures, one by one
    # The server renders the same prompt as ChatHVD (one chat pipeline), so greedy decoding writes the
    # same replies as in ChatHVD's run of this suite (integrations/langchain-hvd).

    @pytest.mark.xfail(reason=SCHEMA_ECHO.format(tool="magic_function", choice="any"), strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_tool_calling(self, model: BaseChatModel) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=SCHEMA_ECHO.format(tool="magic_function", choice="any"), strict=False)
    async def test_tool_calling_async(self, model: BaseChatModel) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=(
        "SmolLM2-135M answers 'Hello!' under tool_choice='any' and tool_choice='magic_function' by echoing the "
        "tool schemas instead of argument values: no valid call"), strict=False)
    def test_tool_choice(self, model: BaseChatModel) -> None:
        super().test_tool_choice(model)

    @pytest.mark.xfail(reason=(
        "SmolLM2-135M, forced into a call of magic_function_no_args, copies the format placeholder of the "
        "system prompt ('{\"name\": <function-name>, ...}') instead of the name: invalid JSON"), strict=False)
    def test_tool_calling_with_no_arguments(self, model: BaseChatModel) -> None:
        super().test_tool_calling_with_no_arguments(model)

    @pytest.mark.xfail(reason=(
        "SmolLM2-135M, forced into a call, puts the customer's name in the function name ('你好啊集团' "
        "instead of 'unicode_customer') and a schema fragment in the arguments"), strict=False)
    def test_unicode_tool_call_integration(
        self, model: BaseChatModel, *, tool_choice: str | None = None, force_tool_call: bool = True
    ) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice, force_tool_call=force_tool_call)

    @pytest.mark.xfail(reason=(
        "without a forced tool_choice SmolLM2-135M answers 'What is the weather in San Francisco, CA?' in prose "
        "instead of calling get_weather (tests/test_clients.py runs steered agent loops that it follows)"),
        strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=(
        "ChatOpenAI turns a pydantic v1 schema into a forced call of a Joke tool; SmolLM2-135M writes "
        "{'name': 'Joke', 'description': 'A cat is a cat. ...', 'type': 'cat'} as its arguments, "
        "neither setup nor punchline"), strict=False)
    def test_structured_output_pydantic_2_v1(self, model: BaseChatModel) -> None:
        super().test_structured_output_pydantic_2_v1(model)

    @pytest.mark.xfail(reason=(
        "asked for the setup of a joke without the punchline, SmolLM2-135M nests the punchline inside the setup "
        "({'setup': {'punchline': ...}}), which does not validate as Joke"), strict=False)
    def test_structured_output_optional_param(self, model: BaseChatModel) -> None:
        super().test_structured_output_optional_param(model)

    @pytest.mark.xfail(reason=(
        "in JSON mode SmolLM2-135M answers the joke prompt with nested {'setup': {'setup': ...}} objects that "
        "never close within max_tokens; the OpenAI SDK then raises LengthFinishReasonError"), strict=False)
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)
