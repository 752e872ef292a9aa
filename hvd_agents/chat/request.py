"""One chat call, framework-neutral: settings + messages + tools -> engine request -> reply pieces.

Both adapters (``langchain_hvd.ChatHVD``, ``llama_index.llms.hvd.HVD``) convert their
framework's types to OpenAI-shape messages and tool schemas, then go through here:

* :class:`ChatSettings` declares the generation settings both adapters expose as
  fields, once: their defaults and docs (an adapter's pydantic field is
  ``Field(**field_kwargs(name))``). ``ChatSettings.from_fields`` reads an adapter's
  values (a call's keyword arguments override the :data:`DECODE_FIELDS`) and
  :meth:`ChatSettings.to_params` turns them into :class:`~hvd_agents.engine.GenerationParams`.
* :func:`build_chat_request` applies ``tool_choice`` (a forced choice pre-fills the
  start of the call and stops at ``</tool_call>``; ``"none"`` stops at ``<tool_call>``)
  and ``response_format`` (JSON mode: the format is asked for at the end of the last
  user message, an object reply is pre-filled with ``{`` and cut after its first
  JSON object), calls :func:`hvd_agents.chat.conversation.prepare` (which registers the
  conversation in the engine's cache store) and returns a :class:`ChatRequest`.
* :func:`stream_reply` runs the request and yields :class:`ReplyPiece` s: content
  deltas (tool-call text held back), then one last piece with the finish reason, the
  parsed tool calls and a :class:`ReplySummary` (usage, method, stats) that each
  adapter places into its framework's response types. Non-streaming calls aggregate
  the same pieces.

Example::

    request = build_chat_request(engine, [{"role": "user", "content": "Weather in Oslo?"}], tools,
                                 settings=ChatSettings(max_tokens=64), tool_choice="required")
    for piece in stream_reply(request):
        print(piece.delta, end="")
    print(piece.parsed.tool_calls, piece.summary.completion_tokens)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.toolcall_stream import ToolCallStreamSplitter, VisibleReply, normalize_tool_choice
from hvd_agents.chat.toolcalls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedOutput,
    forced_call_prefix,
    parse_tool_calls,
    tool_list,
)
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine, GenerationParams, RequestStats, TokenEvent
from hvd_agents.engine.params import DEFAULT_METHOD
from hvd_agents.engine.shared import shared_engine
from hvd_agents.errors import InvalidRequestError
from hvd_agents.structure import PromptStructure

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The model name adapters report when no ``model`` is given (the embedded model)."""

DECODE_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "method", "num_draft_tokens", "timeout")
"""The :class:`ChatSettings` a call's keyword arguments may override."""

JSON_INSTRUCTION = "Respond only with a JSON object."
JSON_KEYS_INSTRUCTION = "Respond only with a JSON object with these keys:"
JSON_SCHEMA_INSTRUCTION = "Respond only with JSON that matches this JSON schema:"


def _setting(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class ChatSettings:
    """The generation settings of a chat model: the one declaration of their defaults and docs.

    Each adapter declares one pydantic field per setting with
    ``Field(**field_kwargs(name))`` (plus its own constraints or alias), so both
    adapters default and document them alike. Values are checked where they are
    used: :meth:`to_params` (and the engine) raise ``InvalidRequestError``.
    """

    model: str | None = _setting(
        None, "Hub id, local model directory or .gguf file; None = the embedded SmolLM2-135M-Instruct."
    )
    device: str | None = _setting(
        None, "'cpu', 'cuda', ...; None picks CUDA when available. Used when the engine is created here."
    )
    draft_model: str | None = _setting(
        None,
        "A smaller model with the same tokenizer that drafts (methods 'model' and 'hvd'); None = the target's "
        "shipped draft head, if any. Used when the engine is created here.",
    )
    method: str = _setting(
        DEFAULT_METHOD,
        "Decoding method: a name in hvd_agents.drafters.available_methods() ('hvd', 'hvd-cache', 'model', 'pld', "
        "'ar') or a drafter added to the injected engine.",
    )
    max_tokens: int = _setting(256, "Most tokens generated per call.")
    temperature: float = _setting(0.0, "Sampling temperature; 0 = greedy.")
    top_p: float | None = _setting(None, "Nucleus sampling mass; None = no cut-off.")
    top_k: int | None = _setting(None, "Top-k cut-off; None = none.")
    seed: int | None = _setting(None, "Sampling seed; None = a fresh one per call.")
    num_draft_tokens: int | None = _setting(
        None, "Most draft tokens verified per step (K); None = the method's default."
    )
    stop: Sequence[str] | None = _setting(None, "Stop strings for every call (merged with a call's own stop).")
    timeout: float | None = _setting(
        None, "Seconds a call may take, waiting for the engine included; past it the call raises "
        "hvd_agents.RequestTimeoutError (a stream keeps what it streamed). None = no limit."
    )

    @classmethod
    def from_fields(cls, source: Any, overrides: Mapping[str, Any] | None = None) -> ChatSettings:
        """The settings of ``source`` (an adapter), with a call's :data:`DECODE_FIELDS` from ``overrides``."""
        overrides = overrides or {}
        return cls(**{
            spec.name: overrides[spec.name] if spec.name in DECODE_FIELDS and spec.name in overrides
            else getattr(source, spec.name)
            for spec in fields(cls)
        })

    def to_params(self, stop: Sequence[str] = ()) -> GenerationParams:
        """The engine parameters (unset optional knobs keep the engine's defaults).

        Args:
            stop: the call's stop strings (``self.stop`` is not added here).

        Raises:
            InvalidRequestError: a value out of range.
        """
        optional = {
            name: getattr(self, name) for name in ("top_p", "top_k", "num_draft_tokens") if getattr(self, name) is not None
        }
        return GenerationParams(
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            method=self.method,
            stop=tuple(stop),
            timeout_s=self.timeout,
            **optional,
        )


SETTING_NAMES = tuple(spec.name for spec in fields(ChatSettings))
"""Names of the :class:`ChatSettings`, in declaration order."""


def field_kwargs(name: str) -> dict[str, Any]:
    """``default`` and ``description`` of setting ``name``, for the adapter's ``Field(...)``.

    Raises:
        KeyError: ``name`` is no :class:`ChatSettings` field.
    """
    spec = ChatSettings.__dataclass_fields__[name]
    return {"default": spec.default, "description": spec.metadata["doc"]}


@dataclass(frozen=True)
class ChatRequest:
    """One prepared engine request and how to read its output.

    Attributes:
        engine: the engine that decodes it.
        structure: the analysed prompt (``structure.prompt_ids`` is the prompt).
        params: the engine parameters.
        prefix: the forced start of the reply (a tool call's opening, ``{``, ...);
            part of the reply, not generated.
        parse_tools: tools were given: ``<tool_call>`` blocks are split out.
        forced_call: the prefix opens a tool call and ``</tool_call>`` is a stop string.
        json_mode: the reply is cut after its first JSON object.
        model_name: the model's name in the reply's metadata.
    """

    engine: Engine
    structure: PromptStructure
    params: GenerationParams
    prefix: str = ""
    parse_tools: bool = False
    forced_call: bool = False
    json_mode: bool = False
    model_name: str = DEFAULT_MODEL_NAME


@dataclass(frozen=True)
class ReplySummary:
    """What the last piece of a reply reports: usage and drafting stats, framework-neutral.

    Attributes:
        model_name: the model's name.
        method: the decoding method.
        finish_reason: ``"stop"`` or ``"length"``.
        prompt_tokens: tokens of the prompt (a forced reply prefix included).
        completion_tokens: tokens generated.
        hvd_stats: :meth:`RequestStats.to_dict` of the engine's stats (empty without stats).
    """

    model_name: str
    method: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    hvd_stats: dict[str, Any]

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def usage(self) -> dict[str, int]:
        """OpenAI-shape usage: ``prompt_tokens``, ``completion_tokens``, ``total_tokens``."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def of(cls, request: ChatRequest, finish_reason: str, stats: RequestStats | None) -> ReplySummary:
        """The summary of ``request``'s reply, which ended with ``finish_reason`` and ``stats``."""
        return cls(
            model_name=request.model_name,
            method=request.params.method,
            finish_reason=finish_reason,
            prompt_tokens=len(request.structure.prompt_ids),
            completion_tokens=stats.new_tokens if stats is not None else 0,
            hvd_stats=stats.to_dict() if stats is not None else {},
        )


@dataclass(frozen=True)
class ReplyPiece:
    """One step of a streamed reply.

    Attributes:
        delta: content that can be shown now (never text of a tool-call block).
        finish_reason: None until the last piece, then ``"stop"`` or ``"length"``.
        parsed: on the last piece of a request with tools: the parse of the whole
            reply (its content equals the concatenated deltas).
        stats: on the last piece: the engine's stats.
        summary: on the last piece: usage, method and stats for the response metadata.
    """

    delta: str
    finish_reason: str | None = None
    parsed: ParsedOutput | None = None
    stats: RequestStats | None = None
    summary: ReplySummary | None = None


def merge_stops(*lists: Sequence[str] | str | None) -> list[str]:
    """Stop strings of several sources, in order, without duplicates (a bare string is one stop string).

    Raises:
        InvalidRequestError: a source that is neither a string nor a list.
    """
    merged: list[str] = []
    for stops in lists:
        if isinstance(stops, str):
            stops = [stops]
        elif stops is not None and not isinstance(stops, Sequence):
            raise InvalidRequestError(f"stop must be a string or a list of strings, got {type(stops).__name__}")
        for stop in stops or ():
            if stop not in merged:
                merged.append(stop)
    return merged


def check_method(method: str, engine: Engine | None) -> None:
    """Refuse an unknown decoding method (an injected engine may add its own drafters).

    Raises:
        InvalidRequestError: the method is neither built in nor known to ``engine``.
    """
    if method in available_methods():
        return
    if engine is None:
        raise InvalidRequestError(
            f"unknown decoding method {method!r}; choose one of {', '.join(available_methods())}"
        )
    engine.drafter(method)  # a drafter added with engine.add_drafter(), or InvalidRequestError


def resolve_engine(
    injected: Engine | None,
    model: str | None,
    device: str | None,
    call_model: str | None = None,
    draft_model: str | None = None,
) -> tuple[Engine, str]:
    """The engine of a call and the model name to report.

    Args:
        injected: the adapter's injected engine, if any.
        model: the adapter's model (hub id, path, ``.gguf``; None = embedded).
        device: the device for engines created here.
        call_model: a per-call model; another model selects another shared engine.
        draft_model: the adapter's draft model for engines created here (None:
            the target's shipped draft head, if any).
    """
    if call_model is not None and call_model != model:
        return shared_engine(call_model, device=device), call_model
    name = model if model is not None else DEFAULT_MODEL_NAME
    if injected is not None:
        return injected, name
    return shared_engine(model, device=device, draft_model=draft_model), name


# -------------------------------------------------------------------- JSON mode


def json_schema_of(response_format: Any) -> Mapping[str, Any] | None:
    """The JSON schema of a ``response_format``, or None for plain JSON mode.

    Accepts ``"json"``, ``{"type": "json_object"}``, a JSON schema, and OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``.

    Raises:
        InvalidRequestError: anything else.
    """
    if response_format == "json":
        return None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_object":
        return None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        inner = response_format.get("json_schema")
        if isinstance(inner, Mapping) and isinstance(inner.get("schema"), Mapping):
            return inner["schema"]
    if isinstance(response_format, Mapping) and response_format:
        return response_format
    raise InvalidRequestError(f"response_format must be 'json' or a JSON schema, got {response_format!r}")


def json_instruction(response_format: Any) -> str:
    """The instruction asking for a JSON reply.

    For an object schema with properties it shows the expected object, each key
    with its description (or type), which small models follow far better than a
    raw JSON schema (they tend to echo the schema); other schemas are shown whole.

    Raises:
        InvalidRequestError: an unsupported ``response_format``.
    """
    schema = json_schema_of(response_format)
    if schema is None:
        return JSON_INSTRUCTION
    properties = schema.get("properties")
    if schema.get("type", "object") == "object" and isinstance(properties, Mapping) and properties:
        shape = {key: _describe(value) for key, value in properties.items()}
        return f"{JSON_KEYS_INSTRUCTION} {json.dumps(shape, ensure_ascii=False)}"
    return f"{JSON_SCHEMA_INSTRUCTION} {json.dumps(schema, ensure_ascii=False)}"


def _describe(prop: Any) -> str:
    if not isinstance(prop, Mapping):
        return "value"
    for key in ("description", "type", "title"):
        if isinstance(prop.get(key), str) and prop[key]:
            return prop[key]
    return "value"


def _json_prefix(response_format: Any) -> str:
    """``{`` when the reply must be a JSON object (pre-filled), else nothing."""
    schema = json_schema_of(response_format)
    return "{" if schema is None or schema.get("type", "object") == "object" else ""


def _with_json_instruction(messages: Sequence[Mapping[str, Any]], response_format: Any) -> list[dict[str, Any]]:
    """Ask for a JSON reply at the end of the last user message (or in a closing system message)."""
    instruction = json_instruction(response_format)
    out = [dict(message) for message in messages]
    if out and out[-1].get("role") == "user":
        content = out[-1].get("content") or ""
        out[-1]["content"] = f"{content}\n\n{instruction}" if content else instruction
    else:
        out.append({"role": "system", "content": instruction})
    return out


# -------------------------------------------------------------------- the request


def build_chat_request(
    engine: Engine,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    settings: ChatSettings,
    tool_choice: Any = None,
    stop: Sequence[str] | None = None,
    session_id: str | None = None,
    prefix: str = "",
    response_format: Any = None,
    model_name: str = DEFAULT_MODEL_NAME,
) -> ChatRequest:
    """Prepare one chat call (registers the conversation in ``engine.cache_store``).

    Args:
        engine: the engine.
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tool schemas.
        settings: the generation settings (``settings.stop`` applies to every call).
        tool_choice: anything :func:`normalize_tool_choice` takes; with tools, a forced
            choice pre-fills the call's start and stops at ``</tool_call>``, ``"none"``
            stops at ``<tool_call>``; without tools it is ignored.
        stop: the call's own stop strings (after ``settings.stop``).
        session_id: the conversation key; None derives it from the first messages.
        prefix: forced start of the reply when no tool call is forced and no
            ``response_format`` is given.
        response_format: JSON mode: ``"json"``, ``{"type": "json_object"}``, a JSON
            schema or ``{"type": "json_schema", "json_schema": {"schema": ...}}``. The
            format is asked for at the end of the last user message; an object reply
            is pre-filled with ``{`` and cut after its first JSON object (unless a
            forced tool call takes precedence).
        model_name: the model's name in the reply's :class:`ReplySummary`.

    Raises:
        InvalidRequestError: bad messages, tools, tool_choice, response_format or settings.
        ContextLengthError: the prompt leaves no room for a new token (refused before
            the conversation is registered).
    """
    tools = tool_list(tools) or None
    choice = normalize_tool_choice(tool_choice)
    stops = merge_stops(settings.stop, stop)
    json_mode = False
    if response_format is not None:
        messages = _with_json_instruction(messages, response_format)
        prefix = _json_prefix(response_format)
        json_mode = prefix == "{"
    forced = bool(tools) and choice not in (None, "none")
    if forced:
        prefix = forced_call_prefix(choice, tools or ())
        stops = merge_stops(stops, [TOOL_CALL_CLOSE])
    elif tools and choice == "none":
        stops = merge_stops(stops, [TOOL_CALL_OPEN])
    params = settings.to_params(stops)
    structure = prepare(engine, messages, tools, session_id=session_id, assistant_prefix=prefix, require_fit=True)
    return ChatRequest(engine, structure, params, prefix, bool(tools), forced, json_mode and not forced, model_name)


def request_events(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[TokenEvent]:
    """The engine's events for ``request``: where every chat reply's decoding starts, for the adapters
    (:func:`stream_reply`) and the server (:func:`~hvd_agents.chat.delta_stream.stream_reply_deltas`) alike.

    The caller closes the iterator when it is done (closing ends the request and releases the
    engine). When ``cancelled`` takes callbacks (:class:`~hvd_agents.chat.async_stream.CancelFlag`)
    and the engine's iterator can be cancelled from another thread (a batching engine's), setting
    the flag ends the request at once, at the end of the step in progress.
    """
    events = request.engine.stream(request.structure.prompt_ids, request.params, structure=request.structure)
    cancel = getattr(events, "cancel", None)  # a batching engine's stream can be ended from another thread
    if cancel is not None and hasattr(cancelled, "add_callback"):
        cancelled.add_callback(cancel)
    return events


def stream_reply(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[ReplyPiece]:
    """Run a request; yield content deltas, then one last piece with calls and the summary.

    Closing this generator, or setting ``cancelled`` (checked after every engine
    event, also while tool-call text is held back), closes the engine's iterator,
    which ends the request and releases the engine (see :func:`request_events`).
    """
    events = request_events(request, cancelled)
    try:
        yield from _pieces(request, events, cancelled)
    finally:
        events.close()


def _pieces(request: ChatRequest, events: Iterator[TokenEvent], cancelled: threading.Event | None) -> Iterator[ReplyPiece]:
    splitter = ToolCallStreamSplitter(request.prefix) if request.parse_tools else None
    content = VisibleReply(request.prefix, request.json_mode) if splitter is None else None
    for event in events:
        if cancelled is not None and cancelled.is_set():
            return
        delta = splitter.push(event.text) if splitter is not None else content.push(event.text)
        if event.finish_reason is None:
            if delta:
                yield ReplyPiece(delta)
            continue
        parsed = None
        if splitter is not None:
            parsed = _parse_reply(request, splitter, event.finish_reason)
            delta += splitter.finish(parsed)
        summary = ReplySummary.of(request, event.finish_reason, event.stats)
        yield ReplyPiece(delta, event.finish_reason, parsed, event.stats, summary)
        return


def _parse_reply(request: ChatRequest, splitter: ToolCallStreamSplitter, finish: str) -> ParsedOutput:
    """Parse the whole reply, closing a forced call that ended at its stop string."""
    reply = splitter.text
    if request.forced_call and finish == "stop" and reply.rfind(TOOL_CALL_OPEN) > reply.rfind(TOOL_CALL_CLOSE):
        splitter.push(TOOL_CALL_CLOSE)  # generation stopped at the stop string "</tool_call>"
    return parse_tool_calls(splitter.text)
