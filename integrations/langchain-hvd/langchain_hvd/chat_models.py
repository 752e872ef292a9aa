"""``ChatHVD``: a LangChain chat model over an hvd-agents engine.

A thin adapter: every call converts the LangChain messages to OpenAI-shape dicts,
passes them with the bound tool schemas to :func:`hvd_agents.chat.conversation.prepare`
(which renders the prompt and registers its structure in the engine's cache store
for the conversation), and streams :meth:`hvd_agents.Engine.stream`. Decoding,
drafting, stop strings and tool-call parsing all live in hvd-agents.

* One streaming core (:meth:`ChatHVD._stream`); ``_generate`` aggregates it.
  ``_astream`` / ``_agenerate`` run the same core in a worker thread that feeds an
  asyncio queue, so the event loop never blocks; cancelling the consuming task
  sets a flag on which the worker closes the engine's iterator (which ends the
  request and releases the engine's lock).
* The reply is hvd-agents' one reply pipeline,
  :func:`hvd_agents.chat.delta_stream.stream_reply_deltas` (the server's too): each
  decode step becomes a chunk with its content and its ``tool_call_chunks`` (Hermes
  ``<tool_call>`` blocks read as they are generated: a call's id and name, then its
  argument text, as ``langchain-openai`` streams OpenAI's), so a tool call streams
  before the last chunk; the aggregated stream equals the non-streaming message. A
  call that does not parse ends in ``invalid_tool_calls``, its error in
  ``response_metadata["invalid_tool_call_errors"]`` (and on ``invoke``'s message).
* The engine is injected (``engine=``) or created lazily on the first call with
  :func:`hvd_agents.engine.shared.shared_engine` (one per model and device per
  process): constructing a ``ChatHVD`` loads nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCallChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticToolsParser
from langchain_core.output_parsers.pydantic import PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.runnables.config import RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, model_validator

from hvd_agents.chat.async_stream import iterate_in_thread
from hvd_agents.chat.delta_stream import ReplyDelta, stream_reply_deltas
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.chat.reply_options import check_reply_options
from hvd_agents.chat.request import (
    DECODE_FIELDS,
    DEFAULT_MODEL_NAME,
    ChatRequest,
    ChatSettings,
    build_chat_request,
    check_method,
    field_kwargs,
    merge_stops,
    resolve_engine,
)
from hvd_agents.chat.toolcalls import normalize_tool, tool_list
from hvd_agents.engine import Engine
from hvd_agents.errors import HVDError, InvalidRequestError
from langchain_hvd._convert import ToolCallChunks, first_line, input_error, to_openai_messages

logger = logging.getLogger(__name__)

PROVIDER = "hvd"

# Per-call keyword arguments (``invoke(..., **kwargs)`` / ``bind``) that a call understands.
_CALL_KWARGS = frozenset({*DECODE_FIELDS, "tools", "tool_choice", "response_format", "model", "session_id"})
# Passed by LangChain itself on some paths; they carry nothing for this backend.
_IGNORED_KWARGS = frozenset({"ls_structured_output_format", "stream"})


class ChatHVD(BaseChatModel):
    """Chat model running locally on hvd-agents (lossless speculative decoding).

    Example:
        ```python
        from langchain_hvd import ChatHVD

        llm = ChatHVD(max_tokens=128)          # embedded SmolLM2-135M-Instruct, loaded on first use
        llm.invoke("Name three primes.").content
        llm.bind_tools([get_weather], tool_choice="required").invoke("Weather in Paris?").tool_calls
        ```

    Greedy output (``temperature=0``, the default) is token for token the model's
    plain greedy output, whatever the ``method``; sampled output keeps the model's
    distribution. ``response_metadata["hvd_stats"]`` reports what drafting did.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    # The generation settings: defaults and descriptions from hvd_agents.chat.request.ChatSettings.
    model: str | None = Field(**field_kwargs("model"))
    method: str = Field(**field_kwargs("method"))
    max_tokens: int = Field(**field_kwargs("max_tokens"))
    temperature: float = Field(**field_kwargs("temperature"))
    top_p: float | None = Field(**field_kwargs("top_p"))
    top_k: int | None = Field(**field_kwargs("top_k"))
    seed: int | None = Field(**field_kwargs("seed"))
    num_draft_tokens: int | None = Field(**field_kwargs("num_draft_tokens"))
    device: str | None = Field(**field_kwargs("device"))
    draft_model: str | None = Field(**field_kwargs("draft_model"))
    stop: list[str] | None = Field(**field_kwargs("stop"), alias="stop_sequences")
    timeout: float | None = Field(**field_kwargs("timeout"))
    engine: Engine | None = Field(default=None, exclude=True, repr=False)
    """An engine to use instead of ``shared_engine(model, device=device)``."""

    @model_validator(mode="after")
    def _check_method(self) -> ChatHVD:
        check_method(self.method, self.engine)
        return self

    # ---------------------------------------------------------------- LangChain metadata

    @property
    def _llm_type(self) -> str:
        return "hvd"

    @property
    def model_name(self) -> str:
        """The model's name in metadata: ``model`` or the embedded model's name."""
        return self.model if self.model is not None else DEFAULT_MODEL_NAME

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "method": self.method,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "num_draft_tokens": self.num_draft_tokens,
            "device": self.device,
            "stop": self.stop,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        model = kwargs.get("model")
        params = LangSmithParams(
            ls_provider=PROVIDER,
            ls_model_name=model if isinstance(model, str) else self.model_name,
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        if merged := merge_stops(self.stop, stop):
            params["ls_stop"] = merged
        return params

    # ---------------------------------------------------------------- tools and structured output

    def bind_tools(
        self,
        tools: Sequence[Mapping[str, Any] | type | Callable | BaseTool],
        *,
        tool_choice: Any = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (anything ``convert_to_openai_tool`` takes) to the model.

        Args:
            tools: the tools.
            tool_choice: ``None`` / ``"auto"`` (the model decides), ``"none"`` (no call:
                generation stops at ``<tool_call>``), ``"any"`` / ``"required"`` / ``True``
                (exactly one call to one of the tools), a tool name or
                ``{"type": "function", "function": {"name": ...}}`` (that tool). Every call is
                decoded under the tools' grammar: its name is a bound tool's and its arguments
                are valid against that tool's schema.
            strict: True marks every tool ``strict``: a schema keyword that cannot be
                enforced is refused (naming it) instead of ignored.
            parallel_tool_calls: accepted for API compatibility; a forced choice
                yields one call, otherwise the model may write several.
            **kwargs: further call arguments to bind.

        Raises:
            InvalidRequestError: a tool that cannot be converted to a schema, an
                invalid schema (no name, ``parameters`` not an object schema), an
                unsupported ``tool_choice`` or one naming no bound tool (checked now).
                Two tools of one name are refused by the call (LangChain's standard
                tests bind a model and its own JSON schema together).
        """
        formatted = []
        for index, tool in enumerate(tool_list(tools)):
            try:
                formatted.append(convert_to_openai_tool(tool, strict=strict))
            except (ValueError, TypeError, NotImplementedError) as exc:
                raise InvalidRequestError(
                    f"tools[{index}] cannot be converted to a tool schema: {first_line(exc)}"
                ) from exc
        for index, schema in enumerate(formatted):  # each schema now; duplicate names at the call
            try:
                normalize_tool(schema)
            except InvalidRequestError as exc:
                raise InvalidRequestError(f"tools[{index}]: {exc}") from exc
        choice = check_reply_options(formatted, tool_choice).tool_choice  # a named choice is checked now
        if choice not in (None, "none") and not formatted:
            raise InvalidRequestError(f"tool_choice {tool_choice!r} needs at least one tool")
        return super().bind(tools=formatted, tool_choice=choice, **kwargs)

    def with_structured_output(
        self,
        schema: Mapping[str, Any] | type | None = None,
        *,
        method: Literal["function_calling", "json_schema", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Mapping[str, Any] | Any]:
        """A runnable that returns output shaped like ``schema``.

        Args:
            schema: a Pydantic class (v2 or v1; the output is an instance), a TypedDict,
                a JSON schema or an OpenAI tool schema (the output is a dict).
            method: ``"json_schema"`` (default): the reply is decoded under the schema's
                grammar (the expected object, each key with its description, is also asked
                for at the end of the last user message); ``"function_calling"``: the schema
                is bound as the only tool and the call is forced by name
                (``tool_choice=<name>``), its arguments (valid against the schema) are the
                output; ``"json_mode"``: any JSON object (describe the format in the prompt).
            include_raw: return ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``
                instead of raising on a parsing error.
            strict: True refuses a schema keyword that cannot be enforced (naming it);
                otherwise such keywords are ignored and the rest enforced.

        Raises:
            ValueError: an unknown ``method`` or argument, or no ``schema`` where one is needed.
        """
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        if method not in ("function_calling", "json_schema", "json_mode"):
            raise ValueError(f"unknown method {method!r}: use 'function_calling', 'json_schema' or 'json_mode'")
        if schema is None and method != "json_mode":
            raise ValueError(f"schema must be given for method={method!r}")
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        output_parser: Runnable
        if method == "function_calling":
            tool_name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=tool_name, strict=strict, ls_structured_output_format=ls_format)
            if is_pydantic:
                output_parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
            else:
                output_parser = JsonOutputKeyToolsParser(key_name=tool_name, first_tool_only=True)
        else:
            response_format = "json" if method == "json_mode" else {"type": "json_schema", "json_schema": {
                "name": ls_format["schema"].__name__ if is_pydantic else "output", "strict": bool(strict),
                "schema": convert_to_json_schema(schema)}}
            llm = self.bind(response_format=response_format, ls_structured_output_format=ls_format)
            output_parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
        if include_raw:
            parser_assign = RunnablePassthrough.assign(
                parsed=itemgetter("raw") | output_parser, parsing_error=lambda _: None
            )
            parser_none = RunnablePassthrough.assign(parsed=lambda _: None)
            parser_with_fallback = parser_assign.with_fallbacks([parser_none], exception_key="parsing_error")
            return RunnableMap(raw=llm) | parser_with_fallback
        return llm | output_parser

    # ---------------------------------------------------------------- entry points
    # The public entry points only add the conversation key: a direct call's
    # ``config={"configurable": {"thread_id": ...}}`` does not reach ``_stream``
    # otherwise (inside chains and LangGraph nodes it is read from the context).

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        return super().invoke(input, config, stop=stop, **_with_thread_session(config, kwargs))

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        return await super().ainvoke(input, config, stop=stop, **_with_thread_session(config, kwargs))

    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        return super().stream(input, config, stop=stop, **_with_thread_session(config, kwargs))

    def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, *, stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        return super().astream(input, config, stop=stop, **_with_thread_session(config, kwargs))

    def _convert_input(self, model_input: LanguageModelInput) -> PromptValue:
        """LangChain's input conversion; an input it refuses raises :class:`InvalidRequestError`.

        LangChain raises ``ValueError`` / ``NotImplementedError`` for a list item that is
        no message (a number, a dict without ``role`` or ``content``, an unknown role);
        the error names the item's index and the reason.
        """
        try:
            return super()._convert_input(model_input)
        except HVDError:
            raise
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise input_error(model_input, exc) from exc

    # ---------------------------------------------------------------- generation

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return _aggregate(self._stream(messages, stop=stop, run_manager=run_manager, **kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # LangChain reports each chunk to the callbacks (on_llm_new_token) itself.
        session_id = kwargs.pop("session_id", None) or _thread_id(run_manager)
        request = self._prepare_request(messages, stop, session_id, kwargs)
        yield from _chunks(stream_reply_deltas(request))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chunks = [chunk async for chunk in self._astream(messages, stop=stop, run_manager=run_manager, **kwargs)]
        return _aggregate(chunks)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """The streaming core in a worker thread; chunks arrive through an asyncio queue.

        The worker prepares the request (tokenization, model loading on first use)
        and runs the engine; the loop only awaits the queue. When the consuming
        task is cancelled (or stops iterating), the worker sees the flag after the
        current decode step, closes the engine iterator and exits; this coroutine
        waits for that, so the engine's lock is free when it returns.
        """
        session_id = kwargs.pop("session_id", None) or _thread_id(run_manager)

        def work(cancelled: threading.Event) -> Iterator[ChatGenerationChunk]:
            request = self._prepare_request(messages, stop, session_id, kwargs)
            yield from _chunks(stream_reply_deltas(request, cancelled))

        async for chunk in iterate_in_thread(work):
            yield chunk

    # ---------------------------------------------------------------- the core

    def _prepare_request(
        self,
        messages: Sequence[BaseMessage],
        stop: list[str] | None,
        session_id: str | None,
        kwargs: dict[str, Any],
    ) -> ChatRequest:
        """Messages and call arguments to a prepared engine request."""
        call = {key: value for key, value in kwargs.items() if key not in _IGNORED_KWARGS}
        unknown = sorted(set(call) - _CALL_KWARGS)
        if unknown:
            raise InvalidRequestError(f"unsupported call arguments for ChatHVD: {unknown}")
        engine, model_name = resolve_engine(
            self.engine, self.model, self.device, call.get("model"), self.draft_model
        )
        return build_chat_request(
            engine,
            to_openai_messages(messages),
            call.get("tools") or None,
            settings=ChatSettings.from_fields(self, call),
            tool_choice=call.get("tool_choice"),
            stop=stop,
            session_id=session_id,
            response_format=call.get("response_format"),
            model_name=model_name,
        )


# -------------------------------------------------------------------- helpers


def _chunks(deltas: Generator[ReplyDelta, None, None]) -> Iterator[ChatGenerationChunk]:
    """The reply's deltas as chunks (content and tool-call chunks); the last one carries usage and metadata.

    Closing this generator closes ``deltas`` (hence the engine's iterator).
    """
    calls = ToolCallChunks()
    with closing(deltas):
        for delta in deltas:
            tool_call_chunks = calls.of(delta)
            if delta.summary is not None:
                yield _last_chunk(delta, delta.summary, tool_call_chunks, calls.errors)
            elif delta.prose or tool_call_chunks:
                message = AIMessageChunk(content=delta.prose, tool_call_chunks=tool_call_chunks)
                yield ChatGenerationChunk(message=message)


def _last_chunk(
    delta: ReplyDelta, summary: ReplySummary, tool_call_chunks: list[ToolCallChunk], errors: dict[str, str]
) -> ChatGenerationChunk:
    """The last chunk: the summary placed into LangChain's usage and response metadata.

    Its ``finish_reason`` is the reply's (``"tool_calls"`` after a call, ``"invalid_tool_call"``
    when a forced call did not parse), as the server reports it.
    """
    usage = UsageMetadata(
        input_tokens=summary.prompt_tokens, output_tokens=summary.completion_tokens, total_tokens=summary.total_tokens
    )
    metadata = {
        "model_name": summary.model_name,
        "model_provider": PROVIDER,
        "finish_reason": delta.finish_reason,
        "method": summary.method,
        "hvd_stats": summary.hvd_stats,
    }
    if errors:  # by call id; chunk aggregation cannot carry InvalidToolCall.error
        metadata["invalid_tool_call_errors"] = dict(errors)
    message = AIMessageChunk(
        content=delta.prose,
        tool_call_chunks=tool_call_chunks,
        usage_metadata=usage,
        response_metadata=metadata,
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info={"finish_reason": delta.finish_reason})


def _aggregate(chunks: Iterator[ChatGenerationChunk] | list[ChatGenerationChunk]) -> ChatResult:
    """The non-streaming result: the sum of the chunks, as an ``AIMessage``.

    The one difference from summing the chunks yourself: invalid tool calls carry
    their parse error (chunk aggregation re-derives them without one; the errors are
    also in ``response_metadata["invalid_tool_call_errors"]``).
    """
    total: ChatGenerationChunk | None = None
    for chunk in chunks:
        total = chunk if total is None else total + chunk
    if total is None:  # the core always yields a last chunk
        raise RuntimeError("generation produced no output")
    chunk_message = total.message
    errors = chunk_message.response_metadata.get("invalid_tool_call_errors", {})
    invalid = [
        {**bad, "error": errors.get(bad.get("id"), bad.get("error"))} for bad in chunk_message.invalid_tool_calls
    ]
    message = AIMessage(
        content=chunk_message.content,
        additional_kwargs=chunk_message.additional_kwargs,
        response_metadata=chunk_message.response_metadata,
        usage_metadata=chunk_message.usage_metadata,
        tool_calls=chunk_message.tool_calls,
        invalid_tool_calls=invalid,
        id=chunk_message.id,
    )
    return ChatResult(generations=[ChatGeneration(message=message, generation_info=total.generation_info)])


def _with_thread_session(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus ``session_id`` from ``config["configurable"]["thread_id"]``, when given."""
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if thread is None or kwargs.get("session_id") is not None:
        return kwargs
    return {**kwargs, "session_id": str(thread)}


def _thread_id(run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None) -> str | None:
    """The conversation key: ``configurable.thread_id`` of the current run (LangGraph), if any.

    Read from the runnable config in context (set inside chains and LangGraph
    nodes), else from the run's metadata (where LangGraph also copies it).
    """
    thread = ensure_config().get("configurable", {}).get("thread_id")
    if thread is None and run_manager is not None:
        thread = (run_manager.metadata or {}).get("thread_id")
    return None if thread is None else str(thread)
