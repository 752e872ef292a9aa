"""The request bodies the server accepts, and their checks.

Pydantic models check types and ranges (a failure is a 400 naming the field, see
:func:`validation_error`); :meth:`ChatCompletionRequest.check` and
:meth:`CompletionRequest.check` refuse, naming the field, what the server cannot do
rather than ignoring it: ``n`` > 1, log-probabilities, penalties, ``logit_bias``,
non-text content, a ``tool_choice`` naming no tool. Unknown fields are ignored, as
the OpenAI SDK adds new ones over time.

Defaults follow the project, not OpenAI, where they differ: ``temperature`` defaults
to 0 (greedy, as ``ChatHVD`` and the engine), so the same messages give the same reply
through every front end; ``max_tokens`` defaults to the rest of the context window,
as OpenAI's does.

HVD's own knobs ride along as extra fields (``extra_body`` in the OpenAI SDK):
``top_k``, ``method`` (the decoding method) and ``num_draft_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from hvd_agents.chat.render import unsupported_part
from hvd_agents.chat.reply_options import ReplyOptions, check_reply_options
from hvd_agents.chat.settings import ChatSettings
from hvd_agents.chat.toolcalls import check_unicode
from hvd_agents.errors import InvalidRequestError
from hvd_agents.server.errors import APIError, invalid, param_of
from hvd_agents.server.request_schemas import (
    CHAT_MESSAGES,
    CHAT_TOOL_CHOICE,
    CHAT_TOOLS,
    EMPTY_OBJECT,
    FALSE,
    METHOD,
    NO_LOGPROBS,
    NO_SUFFIX,
    ONLY_ONE,
    PROMPT,
    RESPONSE_FORMAT,
    STOP,
    ZERO,
)

# Roles of the OpenAI API that the chat template knows under another name.
_ROLE_ALIASES = {"developer": "system"}
# Seeds are below this: the request's torch.Generator takes 64-bit seeds (an exclusive bound,
# so that the OpenAPI document, whose numbers are floats, states it exactly).
SEED_LIMIT = 2**64


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage."""

    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Annotated[str | list[str] | None, STOP] = None
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: Annotated[int | None, ONLY_ONE] = Field(None, ge=1)
    logprobs: Annotated[Any, NO_LOGPROBS] = None
    presence_penalty: Annotated[float | None, ZERO] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Annotated[float | None, ZERO] = Field(None, ge=-2.0, le=2.0)
    logit_bias: Annotated[dict[str, float] | None, EMPTY_OBJECT] = None
    # HVD's extensions
    top_k: int | None = Field(None, ge=0)
    method: Annotated[str | None, METHOD] = None
    num_draft_tokens: int | None = Field(None, ge=0)

    def stops(self) -> list[str]:
        """The stop strings as a list."""
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        for index, stop in enumerate(stops):
            if not stop:
                raise invalid("stop strings must be non-empty", "stop" if isinstance(self.stop, str) else f"stop[{index}]")
        return stops

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _check_unsupported(self) -> None:
        if self.n not in (None, 1):
            raise invalid("only n=1 is supported: one choice per request", "n")
        if self.logprobs not in (None, False, 0):
            raise invalid("log-probabilities are not supported", "logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise invalid(f"{name} is not supported (it would change the model's distribution)", name)
        if self.logit_bias:
            raise invalid("logit_bias is not supported", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options is only allowed with stream=true", "stream_options")

    def settings(self, max_tokens: int | None, default_method: str, context_window: int,
                 timeout: float | None = None) -> ChatSettings:
        """The generation settings (``max_tokens`` None: the rest of the context window; ``timeout``: the
        server's per-request deadline)."""
        return ChatSettings(
            method=self.method or default_method,
            max_tokens=max_tokens if max_tokens is not None else context_window,
            temperature=self.temperature if self.temperature is not None else 0.0,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            num_draft_tokens=self.num_draft_tokens,
            timeout=timeout,
        )


class ChatCompletionRequest(_Sampling):
    """The body of ``POST /v1/chat/completions``."""

    messages: Annotated[list[dict[str, Any]], CHAT_MESSAGES] = Field(min_length=1)
    tools: Annotated[list[dict[str, Any]] | None, CHAT_TOOLS] = None
    tool_choice: Annotated[str | dict[str, Any] | None, CHAT_TOOL_CHOICE] = None
    parallel_tool_calls: StrictBool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: Annotated[dict[str, Any] | None, RESPONSE_FORMAT] = None
    top_logprobs: Annotated[int | None, ZERO] = None

    def check(self) -> ReplyOptions:
        """Refuse what the server cannot do, naming the field.

        Returns:
            ``tool_choice`` and ``response_format`` as the chat layer checked them
            (:func:`~hvd_agents.chat.reply_options.check_reply_options`, the one check),
            for :func:`~hvd_agents.chat.request.build_chat_request`.

        Raises:
            APIError: a 400 naming the field.
        """
        self._check_unsupported()
        if self.top_logprobs:
            raise invalid("log-probabilities are not supported", "top_logprobs")
        for index, tool in enumerate(self.tools or ()):
            _check_tool(index, tool)
        response_format = self.response_format_value()
        try:
            options = check_reply_options(self.tools, self.tool_choice, response_format)
        except InvalidRequestError as exc:
            raise invalid(str(exc), param_of(str(exc)) or "tool_choice") from exc  # an unsupported value
        if options.tool_choice not in (None, "none") and not self.tools:
            raise invalid("tool_choice forces a tool call, but no tools were given", "tool_choice")
        self.stops()
        return options

    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``, else None."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat layer takes them (``developer`` is ``system``; text-only content)."""
        out = []
        for index, message in enumerate(self.messages):
            message = dict(message)
            role = message.get("role")
            if isinstance(role, str) and role in _ROLE_ALIASES:
                message["role"] = _ROLE_ALIASES[role]
            message["content"] = _text_content(index, message.get("content"))
            out.append(message)
        return out

    def response_format_value(self) -> Mapping[str, Any] | None:
        """``response_format`` in the chat layer's terms (OpenAI's wire shapes translated); None for text."""
        fmt = self.response_format
        if fmt is None or fmt.get("type") == "text":
            return None
        if fmt.get("type") == "json_object":
            return {"type": "json_object"}
        if fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema")
            if not isinstance(inner, Mapping):
                raise invalid("response_format.json_schema must be an object", "response_format.json_schema")
            schema = inner.get("schema")
            if schema is None:
                return {"type": "json_object"}
            if not isinstance(schema, Mapping):
                raise invalid("response_format.json_schema.schema must be an object",
                              "response_format.json_schema.schema")
            return {"type": "json_schema", "json_schema": {"schema": dict(schema)}}
        raise invalid(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {fmt.get('type')!r}",
                      "response_format.type")

    def stops_with_calls(self) -> list[str]:
        """The stop strings; with ``parallel_tool_calls=false`` also the end of the first call."""
        stops = self.stops()
        if self.tools and self.parallel_tool_calls is False:
            stops.append("</tool_call>")
        return stops


class CompletionRequest(_Sampling):
    """The body of ``POST /v1/completions`` (one prompt: text, or token ids)."""

    # strict: JSON booleans are not token ids (lax mode would read true as 1)
    prompt: Annotated[str | list[str] | list[Annotated[StrictInt, Field(ge=0)]], PROMPT] = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)
    echo: Annotated[StrictBool, FALSE] = False
    suffix: Annotated[str | None, NO_SUFFIX] = None
    best_of: Annotated[int | None, ONLY_ONE] = None

    def check(self) -> None:
        """Refuse what the server cannot do, naming the field.

        Raises:
            APIError: a 400 naming the field.
        """
        self._check_unsupported()
        if self.echo:
            raise invalid("echo is not supported", "echo")
        if self.suffix:
            raise invalid("suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise invalid("only best_of=1 is supported", "best_of")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise invalid("one prompt per request", "prompt")
        if isinstance(self.prompt, list) and not self.prompt:
            raise invalid("prompt is empty", "prompt")
        prompt = self.prompt_value()
        if isinstance(prompt, str):
            try:
                check_unicode("prompt", prompt)
            except InvalidRequestError as exc:
                raise invalid(str(exc), "prompt") from exc
        self.stops()

    def prompt_value(self) -> str | list[int]:
        """The prompt text, or its token ids."""
        if isinstance(self.prompt, list) and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return self.prompt


def _check_tool(index: int, tool: Mapping[str, Any]) -> None:
    if tool.get("type", "function") != "function":
        raise invalid(f"only function tools are supported, got {tool.get('type')!r}", f"tools[{index}].type")
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise invalid("a tool needs a 'function' object", f"tools[{index}].function")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise invalid("a function needs a non-empty name", f"tools[{index}].function.name")


def _text_content(index: int, content: Any) -> Any:
    """Content as the chat template takes it: a string, None, or text parts; other parts are refused."""
    if not isinstance(content, Sequence) or isinstance(content, str):
        return content
    parts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            raise invalid(unsupported_part(kind), f"messages[{index}].content[{number}]")
        parts.append({"type": "text", "text": part.get("text")})
    return parts


def validation_error(exc: ValidationError | Any) -> APIError:
    """A 400 for the first error pydantic (or FastAPI) found in a body, naming its field."""
    errors = exc.errors()
    if not errors:
        return invalid("invalid request body")
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return invalid(f"the body is not valid JSON: {first.get('msg')}")
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not _is_type_tag(part):
            param += f".{part}" if param else str(part)
    return invalid(f"{param or 'body'}: {first.get('msg')}", param or None)


def _is_type_tag(part: Any) -> bool:
    """Pydantic's union-branch labels in an error location (``str``, ``list[str]``, ...)."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or part.startswith("function-"))

