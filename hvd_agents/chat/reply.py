"""Running a chat request: the engine's events, and the reply as the adapters stream it.

* :class:`ChatRequest` is a prepared request
  (:func:`~hvd_agents.chat.request.build_chat_request` makes it) and how to read its output.
* :func:`request_events` is where every chat reply's decoding starts, for the adapters
  (:func:`stream_reply`) and the server
  (:func:`~hvd_agents.chat.delta_stream.stream_reply_deltas`) alike.
* :func:`stream_reply` yields :class:`ReplyPiece` s: content deltas (tool-call text held
  back, :class:`~hvd_agents.chat.toolcall_stream.ToolCallStreamSplitter`), then one last
  piece with the finish reason, the parsed tool calls and a :class:`ReplySummary`
  (usage, method, stats) that each adapter places into its framework's response types.
  Non-streaming calls aggregate the same pieces.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.forced_name import NameState, NameWatch
from hvd_agents.chat.json_reply import VisibleReply
from hvd_agents.chat.settings import DEFAULT_MODEL_NAME
from hvd_agents.chat.toolcall_parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParsedOutput, parse_tool_calls
from hvd_agents.chat.toolcall_stream import ToolCallStreamSplitter
from hvd_agents.engine import Engine, GenerationParams, RequestStats, TokenEvent
from hvd_agents.structure import PromptStructure


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
        name_choices: the tool names a forced call's name is decoded among before
            the call (:mod:`hvd_agents.chat.forced_name`); empty when the prefix holds it.
        call_to: a forced call to the named tool: its pre-fill and the conversation
            rendered with it (set with ``name_choices``).
    """

    engine: Engine
    structure: PromptStructure
    params: GenerationParams
    prefix: str = ""
    parse_tools: bool = False
    forced_call: bool = False
    json_mode: bool = False
    model_name: str = DEFAULT_MODEL_NAME
    name_choices: tuple[str, ...] = ()
    call_to: Callable[[str], tuple[str, PromptStructure]] | None = None



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


def request_events(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[TokenEvent]:
    """The engine's events for ``request``: where every chat reply's decoding starts.

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


def start_reply(request: ChatRequest, cancelled: threading.Event | None = None
                ) -> tuple[ChatRequest, Iterator[TokenEvent]] | None:
    """The request as it runs and its engine events; None when cancelled before the first event.

    A forced call among several tools (``request.name_choices``) is watched until its name is
    read (:class:`~hvd_agents.chat.forced_name.NameWatch`): a declared name goes on as written;
    any other is dropped and the call decoded again with the closest declared name (and its first
    required argument key) pre-filled.
    """
    events = request_events(request, cancelled)
    if not request.name_choices:
        return request, events
    watch, seen = NameWatch(request.prefix, request.name_choices), []
    try:
        for event in events:
            if cancelled is not None and cancelled.is_set():
                events.close()
                return None
            seen.append(event)
            state = watch.push(event.text)
            if state is NameState.DECLARED or (state is NameState.PENDING and event.finish_reason is not None):
                return request, _replayed(seen, events)
            if state is NameState.UNDECLARED:
                break
    except BaseException:
        events.close()
        raise
    events.close()
    if watch.state is NameState.PENDING:  # the engine ended without a last event
        return request, _replayed(seen, iter(()))
    prefix, structure = request.call_to(watch.choice())
    request = dataclasses.replace(request, structure=structure, prefix=prefix, name_choices=(), call_to=None)
    return request, request_events(request, cancelled)


def _replayed(seen: list[TokenEvent], events: Iterator[TokenEvent]) -> Iterator[TokenEvent]:
    """The events read already, then the rest; closing it closes ``events``."""
    try:
        yield from seen
        yield from events
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def stream_reply(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[ReplyPiece]:
    """Run a request; yield content deltas, then one last piece with calls and the summary.

    Closing this generator, or setting ``cancelled`` (checked after every engine
    event, also while tool-call text is held back), closes the engine's iterator,
    which ends the request and releases the engine (see :func:`request_events`).
    A forced call among several tools keeps its name to them (:func:`start_reply`).
    """
    started = start_reply(request, cancelled)
    if started is None:
        return
    request, events = started
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
