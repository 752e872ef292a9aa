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

    @pytest.mark.xfail(reason=(
        "forced into a unicode_customer call, SmolLM2-135M names the customer right but writes a description "
        "('A Chinese technology company that specializes in creating ...') that runs past the suite's "
        "max_tokens of 48: the call is cut, so none is parsed; the grammar keeps it valid, not short"), strict=False)
    def test_unicode_tool_call_integration(
        self, model: BaseChatModel, *, tool_choice: str | None = None, force_tool_call: bool = True
    ) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice, force_tool_call=force_tool_call)

    @pytest.mark.xfail(reason=(
        "with tool_choice='auto' SmolLM2-135M answers 'What is the weather in San Francisco, CA?' in prose "
        "instead of opening a call: the lazy grammar holds a call once opened, it cannot make the model open one"), strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=(
        "ChatOpenAI turns a pydantic v1 schema into a forced Joke call; SmolLM2-135M writes a setup that "
        "repeats 'A cat is a cat,' past the suite's max_tokens of 48: the call is cut, so none is parsed"), strict=False)
    def test_structured_output_pydantic_2_v1(self, model: BaseChatModel) -> None:
        super().test_structured_output_pydantic_2_v1(model)

    @pytest.mark.xfail(reason=(
        "SmolLM2-135M's cat joke runs past the suite's max_tokens of 48 under ChatOpenAI's schema for an "
        "optional punchline: the reply is cut (LengthFinishReasonError), valid JSON up to the cut"), strict=False)
    def test_structured_output_optional_param(self, model: BaseChatModel) -> None:
        super().test_structured_output_optional_param(model)

    @pytest.mark.xfail(reason=(
        "in JSON mode SmolLM2-135M writes a setup that repeats 'the cat was having a cat-themed party, and' "
        "past the suite's max_tokens of 48: the grammar keeps the object valid but cannot end a string the "
        "model keeps writing, so the reply is cut"), strict=False)
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)
