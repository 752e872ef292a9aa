"""``HVD``: a LlamaIndex function-calling LLM over an hvd-agents engine.

A thin adapter, the LlamaIndex twin of ``langchain_hvd.ChatHVD``: every call turns
the LlamaIndex messages into OpenAI-shape dicts and goes through
:func:`hvd_agents.chat.request.build_chat_request` (which calls
:func:`hvd_agents.chat.conversation.prepare`: the prompt is rendered and its system prompt,
tool schemas and prior turns are registered in the engine's cache store for the
conversation) and :func:`hvd_agents.chat.delta_stream.stream_reply_deltas`, the one reply
pipeline of hvd-agents (the server's and LangChain's too). Decoding, drafting, stop strings
and tool-call parsing all live in hvd-agents.

* One streaming core (:meth:`HVD._stream`); ``chat`` returns its last response and
  the async forms run it in a worker thread that feeds an asyncio queue
  (:func:`hvd_agents.chat.async_stream.iterate_in_thread`), so the event loop never
  blocks; cancelling the consuming task closes the engine's iterator.
* Tool calls are Hermes ``<tool_call>`` blocks in the reply, decoded under the tools'
  grammar (:mod:`hvd_agents.chat.constraints`: a forced ``tool_choice`` is exactly one
  call to one of the tools, or to the named one, with arguments valid against that tool's
  schema, its ``</tool_call>`` included). While streaming, the text
  outside the blocks is streamed; the calls are aggregated, and the last response's
  message holds the content and one ``ToolCallBlock`` per call. A call that does not
  parse goes to ``additional_kwargs["invalid_tool_calls"]`` (id, name, text, error),
  never into a ``ToolSelection``: ``get_tool_calls_from_response`` names it when the
  reply has no valid call.
* JSON mode (``json_mode=True``, as in LlamaIndex's Ollama LLM, or a call's
  ``response_format="json"`` / JSON schema, as in its OpenAI LLM) is the neutral
  layer's: the format is asked for in the last user message, the reply is decoded under
  the schema's grammar (any JSON object without one) and cut after its first JSON object.
* The engine is injected (``engine=``) or created lazily on first use with
  :func:`hvd_agents.engine.shared.shared_engine`: constructing an ``HVD`` loads nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import closing
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.generic_utils import (
    achat_to_completion_decorator,
    astream_chat_to_completion_decorator,
    chat_to_completion_decorator,
    stream_chat_to_completion_decorator,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import Field, model_validator
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.llms.hvd._convert import reply_message, to_openai_messages, tool_schemas, tool_selections

from hvd_agents.chat.async_stream import iterate_in_thread
from hvd_agents.chat.delta_stream import CollectedReply, ReplyDelta, stream_reply_deltas
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.chat.reply_options import normalize_tool_choice
from hvd_agents.chat.request import (
    DECODE_FIELDS,
    DEFAULT_MODEL_NAME,
    ChatRequest,
    ChatSettings,
    build_chat_request,
    check_method,
    field_kwargs,
    resolve_engine,
)
from hvd_agents.engine import Engine
from hvd_agents.errors import InvalidRequestError

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

logger = logging.getLogger(__name__)

# Per-call keyword arguments (``chat(messages, **kwargs)``) that a call understands.
_CALL_KWARGS = frozenset({*DECODE_FIELDS, "tools", "tool_choice", "stop", "session_id", "model", "response_format"})

ToolChoicePolicy = Callable[[Sequence[ChatMessage]], Any]
"""A function of a call's messages that returns its ``tool_choice``."""


class HVD(FunctionCallingLLM):
    """LLM running locally on hvd-agents (lossless speculative decoding), with function calling.

    Example:
        ```python
        from llama_index.llms.hvd import HVD

        llm = HVD(max_tokens=128)        # embedded SmolLM2-135M-Instruct, loaded on first use
        llm.complete("Name three primes.").text
        response = llm.chat_with_tools([weather_tool], user_msg="Weather in Paris?", tool_required=True)
        llm.get_tool_calls_from_response(response)   # [ToolSelection(tool_name="get_weather", ...)]
        HVD(json_mode=True).complete("A city and its country, as JSON.").text   # '{"city": ...}'
        llm.chat(messages, response_format={"type": "object", "properties": {"city": {"type": "string"}}})
        ```

    Greedy output (``temperature=0``, the default) is token for token the model's
    plain greedy output, whatever the ``method``; sampled output keeps the model's
    distribution. ``response.raw["hvd_stats"]`` reports what drafting did.
    """

    # The generation settings: defaults and descriptions from hvd_agents.chat.request.ChatSettings.
    model: str | None = Field(**field_kwargs("model"))
    method: str = Field(**field_kwargs("method"))
    max_tokens: int = Field(**field_kwargs("max_tokens"), gt=0)
    temperature: float = Field(**field_kwargs("temperature"), ge=0.0)
    top_p: float | None = Field(**field_kwargs("top_p"))
    top_k: int | None = Field(**field_kwargs("top_k"))
    seed: int | None = Field(**field_kwargs("seed"))
    num_draft_tokens: int | None = Field(**field_kwargs("num_draft_tokens"))
    device: str | None = Field(**field_kwargs("device"))
    draft_model: str | None = Field(**field_kwargs("draft_model"))
    context_window: int | None = Field(
        default=None, description="Reported context window; None = the model's (loads the model on first use)."
    )
    stop: list[str] | None = Field(**field_kwargs("stop"))
    timeout: float | None = Field(**field_kwargs("timeout"))
    json_mode: bool = Field(
        default=False,
        description=(
            "Reply with a JSON object: the request for one is added to the last user message, the reply is "
            "decoded under the grammar of a JSON object and cut after the object. A call's response_format "
            "('json' or a JSON schema) takes precedence."
        ),
    )
    tool_choice: Any = Field(
        default=None,
        description=(
            "tool_choice of calls with tools that set none: None/'auto', 'none', 'required', a tool name, "
            "or a function of the call's messages returning one of these."
        ),
    )
    reply_prefix: str | Callable[[Sequence[ChatMessage]], str] = Field(
        default="",
        description=(
            "Forced start of replies that are neither forced tool calls nor JSON (e.g. 'Thought:' for ReAct), "
            "or a function of the call's messages returning it."
        ),
    )
    session_id: str | None = Field(
        default=None, description="Conversation key for the cache store; None derives it from the first messages."
    )
    engine: Engine | None = Field(default=None, exclude=True, description="An engine to use instead of a shared one.")

    @model_validator(mode="after")
    def _check_fields(self) -> HVD:
        check_method(self.method, self.engine)
        if not callable(self.tool_choice):
            normalize_tool_choice(self.tool_choice)  # refuse a bad value now
        return self

    @classmethod
    def class_name(cls) -> str:
        return "HVD"

    @property
    def model_name(self) -> str:
        """``model`` or the embedded model's name."""
        return self.model if self.model is not None else DEFAULT_MODEL_NAME

    @property
    def metadata(self) -> LLMMetadata:
        """Context window (the model's, unless ``context_window`` is set) and ``num_output`` = ``max_tokens``."""
        context_window = self.context_window
        if context_window is None:
            context_window = resolve_engine(self.engine, self.model, self.device, None, self.draft_model)[0].context_window
        return LLMMetadata(
            context_window=context_window,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model_name,
        )

    # ---------------------------------------------------------------- tools

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The ``chat`` arguments for a call with tools.

        ``tool_required=True`` forces a call (``tool_choice="required"``); an explicit
        ``tool_choice`` (e.g. ``FunctionAgent(initial_tool_choice=...)``) wins over it;
        with neither, the ``tool_choice`` field applies.
        """
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str) else user_msg)
        call = {"messages": messages, "tools": tool_schemas(tools), **kwargs}
        if tool_required and call.get("tool_choice") is None:
            call["tool_choice"] = "required"
        return call

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Keep only the first call unless ``allow_parallel_tool_calls``."""
        if not allow_parallel_tool_calls:
            calls = [block for block in response.message.blocks if isinstance(block, ToolCallBlock)]
            for extra in calls[1:]:
                response.message.blocks.remove(extra)
        return response

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The response's calls (its ``ToolCallBlock`` s) as ``ToolSelection`` s.

        Raises:
            ValueError: no valid call and ``error_on_no_tool_call`` (the message names
                the parse errors of invalid calls, if any).
        """
        selections = tool_selections(response.message)
        if not selections and error_on_no_tool_call:
            invalid = response.message.additional_kwargs.get("invalid_tool_calls") or []
            errors = "; ".join(f"{bad['name']}: {bad['error']}" for bad in invalid)
            raise ValueError("Expected at least one tool call, but got 0" + (f" (invalid calls: {errors})" if errors else ""))
        return selections

    # ---------------------------------------------------------------- chat

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return _final(list(self._stream(messages, kwargs)))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return _final([response async for response in self._astream(messages, kwargs)])

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return self._astream(messages, kwargs)

    # ---------------------------------------------------------------- completion (a user message)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return chat_to_completion_decorator(self.chat)(prompt, **kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return stream_chat_to_completion_decorator(self.stream_chat)(prompt, **kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await achat_to_completion_decorator(self.achat)(prompt, **kwargs)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        return await astream_chat_to_completion_decorator(self.astream_chat)(prompt, **kwargs)

    # ---------------------------------------------------------------- the core

    def _stream(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], cancelled: threading.Event | None = None
    ) -> Iterator[ChatResponse]:
        """The streaming core: one response per content delta, the last one with calls and stats."""
        request = self._prepare_request(messages, kwargs)
        yield from _responses(stream_reply_deltas(request, cancelled))

    async def _astream(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> AsyncIterator[ChatResponse]:
        """The streaming core in a worker thread (preparation and model loading included)."""
        async for response in iterate_in_thread(lambda cancelled: self._stream(messages, kwargs, cancelled)):
            yield response

    def _prepare_request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatRequest:
        """Messages and call arguments to a prepared engine request."""
        unknown = sorted(set(kwargs) - _CALL_KWARGS)
        if unknown:
            raise InvalidRequestError(f"unsupported call arguments for HVD: {unknown}")
        engine, model_name = resolve_engine(
            self.engine, self.model, self.device, kwargs.get("model"), self.draft_model
        )
        choice = kwargs.get("tool_choice")
        if choice is None:  # not set for this call (LlamaIndex passes None explicitly)
            choice = self.tool_choice
        if callable(choice):
            choice = choice(messages)
        prefix = self.reply_prefix(messages) if callable(self.reply_prefix) else self.reply_prefix
        response_format = kwargs.get("response_format")
        if response_format is None and self.json_mode:
            response_format = "json"
        return build_chat_request(
            engine,
            to_openai_messages(messages),
            kwargs.get("tools") or None,
            settings=ChatSettings.from_fields(self, kwargs),
            tool_choice=choice,
            stop=kwargs.get("stop"),
            session_id=kwargs.get("session_id") or self.session_id,
            prefix=prefix,
            response_format=response_format,
            model_name=model_name,
        )


# -------------------------------------------------------------------- helpers


def _responses(deltas: Generator[ReplyDelta, None, None]) -> Iterator[ChatResponse]:
    """The reply's deltas as chat responses, each with its content delta and the content so far.

    The calls are aggregated: the last response's message holds them. Closing this generator
    closes ``deltas`` (hence the engine's iterator).
    """
    reply = CollectedReply()
    with closing(deltas):
        for delta in deltas:
            reply.add(delta)
            if delta.summary is not None:
                yield _last_response(delta, delta.summary, reply)
            elif delta.prose:
                message = ChatMessage(role=MessageRole.ASSISTANT, content=reply.prose)
                yield ChatResponse(message=message, delta=delta.prose)


def _last_response(delta: ReplyDelta, summary: ReplySummary, reply: CollectedReply) -> ChatResponse:
    """The last response: the whole message (text and tool-call blocks); the summary in ``raw``.

    ``raw["finish_reason"]`` is the reply's (``"tool_calls"`` after a call, ``"invalid_tool_call"``
    when a forced call did not parse), as the server reports it.
    """
    usage = summary.usage()
    raw = {
        "model": summary.model_name,
        "method": summary.method,
        "finish_reason": delta.finish_reason,
        "usage": usage,
        "hvd_stats": summary.hvd_stats,
    }
    message = reply_message(reply.prose, reply.parsed())
    return ChatResponse(message=message, delta=delta.prose, raw=raw, additional_kwargs=dict(usage))


def _final(responses: list[ChatResponse]) -> ChatResponse:
    """The non-streaming response: the last streamed one (it holds the whole message)."""
    if not responses:  # the core always yields a last response
        raise RuntimeError("generation produced no output")
    last = responses[-1]
    return ChatResponse(message=last.message, raw=last.raw, additional_kwargs=last.additional_kwargs)
