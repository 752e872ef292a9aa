"""One chat call, framework-neutral: options + messages + tools -> engine request -> reply pieces.

Both adapters (``langchain_hvd.ChatHVD``, ``llama_index.llms.hvd.HVD``) convert their
framework's types to OpenAI-shape messages and tool schemas, then go through here:

* :class:`DecodeOptions` holds the decoding knobs the adapters expose (``max_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``seed``, ``method``, ``num_draft_tokens``) and
  turns them into :class:`~hvd_agents.engine.GenerationParams`.
* :func:`build_chat_request` applies ``tool_choice`` (a forced choice pre-fills the
  start of the call and stops at ``</tool_call>``; ``"none"`` stops at ``<tool_call>``),
  calls :func:`hvd_agents.chat.conversation.prepare` (which registers the conversation in
  the engine's cache store) and returns a :class:`ChatRequest`.
* :func:`stream_reply` runs the request and yields :class:`ReplyPiece` s: content
  deltas (tool-call text held back), then one last piece with the finish reason, the
  parsed tool calls and the stats. Non-streaming calls aggregate the same pieces.

Example::

    request = build_chat_request(engine, [{"role": "user", "content": "Weather in Oslo?"}], tools,
                                 options=DecodeOptions(max_tokens=64), tool_choice="required")
    for piece in stream_reply(request):
        print(piece.delta, end="")
    print(piece.parsed.tool_calls)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.conversation import prepare
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine, GenerationParams, RequestStats, TokenEvent
from hvd_agents.engine.params import DEFAULT_METHOD
from hvd_agents.engine.shared import shared_engine
from hvd_agents.errors import InvalidRequestError
from hvd_agents.structure import PromptStructure
from hvd_agents.chat.toolcall_stream import JsonObjectScanner, ToolCallStreamSplitter, normalize_tool_choice
from hvd_agents.chat.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParsedOutput, forced_call_prefix, parse_tool_calls

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The model name adapters report when no ``model`` is given (the embedded model)."""

DECODE_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "method", "num_draft_tokens")
"""Names of :class:`DecodeOptions` fields: adapter fields and per-call keyword arguments."""


@dataclass(frozen=True)
class DecodeOptions:
    """The decoding knobs of one call, as the adapters name them.

    Attributes:
        max_tokens: most tokens generated.
        temperature: 0 = greedy.
        top_p: nucleus mass; None = the engine's default.
        top_k: top-k cut-off; None = the engine's default.
        seed: sampling seed; None = a fresh one.
        method: decoding method (a name in ``available_methods()`` or a drafter
            added to the engine).
        num_draft_tokens: most draft tokens verified per step; None = the engine's default.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    method: str = DEFAULT_METHOD
    num_draft_tokens: int | None = None

    @classmethod
    def from_fields(cls, defaults: Any, overrides: Mapping[str, Any]) -> DecodeOptions:
        """Options from an object's attributes (``defaults``), overridden per call by ``overrides``."""
        return cls(**{name: overrides.get(name, getattr(defaults, name)) for name in DECODE_FIELDS})

    def to_params(self, stop: Sequence[str] = ()) -> GenerationParams:
        """The engine parameters (unset optional knobs keep the engine's defaults).

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
            **optional,
        )


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
    """

    engine: Engine
    structure: PromptStructure
    params: GenerationParams
    prefix: str = ""
    parse_tools: bool = False
    forced_call: bool = False
    json_mode: bool = False


@dataclass(frozen=True)
class ReplyPiece:
    """One step of a streamed reply.

    Attributes:
        delta: content that can be shown now (never text of a tool-call block).
        finish_reason: None until the last piece, then ``"stop"`` or ``"length"``.
        parsed: on the last piece of a request with tools: the parse of the whole
            reply (its content equals the concatenated deltas).
        stats: on the last piece: the engine's stats.
    """

    delta: str
    finish_reason: str | None = None
    parsed: ParsedOutput | None = None
    stats: RequestStats | None = None


def merge_stops(*lists: Sequence[str] | None) -> list[str]:
    """Stop strings of several sources, in order, without duplicates."""
    merged: list[str] = []
    for stops in lists:
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


def build_chat_request(
    engine: Engine,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    options: DecodeOptions,
    tool_choice: Any = None,
    stop: Sequence[str] | None = None,
    session_id: str | None = None,
    prefix: str = "",
    json_mode: bool = False,
) -> ChatRequest:
    """Prepare one chat call (registers the conversation in ``engine.cache_store``).

    Args:
        engine: the engine.
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tool schemas.
        options: decoding knobs.
        tool_choice: anything :func:`normalize_tool_choice` takes; with tools, a forced
            choice pre-fills the call's start and stops at ``</tool_call>``, ``"none"``
            stops at ``<tool_call>``; without tools it is ignored.
        stop: stop strings.
        session_id: the conversation key; None derives it from the first messages.
        prefix: forced start of the reply when no tool call is forced.
        json_mode: cut the reply after its first JSON object (when no call is forced).

    Raises:
        InvalidRequestError: bad messages, tools, tool_choice or options.
    """
    tools = list(tools) if tools else None
    choice = normalize_tool_choice(tool_choice)
    stops = merge_stops(stop)
    forced = bool(tools) and choice not in (None, "none")
    if forced:
        prefix = forced_call_prefix(choice, tools or ())
        stops = merge_stops(stops, [TOOL_CALL_CLOSE])
    elif tools and choice == "none":
        stops = merge_stops(stops, [TOOL_CALL_OPEN])
    params = options.to_params(stops)
    structure = prepare(engine, messages, tools, session_id=session_id, assistant_prefix=prefix)
    return ChatRequest(engine, structure, params, prefix, bool(tools), forced, json_mode and not forced)


def stream_reply(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[ReplyPiece]:
    """Run a request; yield content deltas, then one last piece with calls and stats.

    Closing this generator, or setting ``cancelled`` (checked after every engine
    event, also while tool-call text is held back), closes the engine's iterator,
    which ends the request and releases the engine.
    """
    events = request.engine.stream(request.structure.prompt_ids, request.params, structure=request.structure)
    try:
        yield from _pieces(request, events, cancelled)
    finally:
        events.close()


def _pieces(request: ChatRequest, events: Iterator[TokenEvent], cancelled: threading.Event | None) -> Iterator[ReplyPiece]:
    splitter = ToolCallStreamSplitter(request.prefix) if request.parse_tools else None
    scanner = JsonObjectScanner() if request.json_mode else None
    text = ""  # the reply so far (prefix included) when not splitting tool calls
    shown = 0  # characters of ``text`` emitted
    pending = request.prefix if splitter is None else ""
    for event in events:
        if cancelled is not None and cancelled.is_set():
            return
        if splitter is not None:
            delta = splitter.push(event.text)
        else:
            new, pending = pending + event.text, ""
            text += new
            end = scanner.push(new) if scanner is not None else None
            visible = text if end is None else text[:end]
            delta, shown = visible[shown:], len(visible)
        if event.finish_reason is None:
            if delta:
                yield ReplyPiece(delta)
            continue
        parsed = None
        if splitter is not None:
            parsed = _parse_reply(request, splitter, event.finish_reason)
            delta += splitter.finish(parsed)
        yield ReplyPiece(delta, event.finish_reason, parsed, event.stats)
        return


def _parse_reply(request: ChatRequest, splitter: ToolCallStreamSplitter, finish: str) -> ParsedOutput:
    """Parse the whole reply, closing a forced call that ended at its stop string."""
    reply = splitter.text
    if request.forced_call and finish == "stop" and reply.rfind(TOOL_CALL_OPEN) > reply.rfind(TOOL_CALL_CLOSE):
        splitter.push(TOOL_CALL_CLOSE)  # generation stopped at the stop string "</tool_call>"
    return parse_tool_calls(splitter.text)
