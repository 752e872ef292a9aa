"""A chat request's reply as deltas: content and tool calls that grow step by step.

:func:`stream_reply_deltas` runs a :class:`~hvd_agents.chat.request.ChatRequest` (built by
:func:`~hvd_agents.chat.request.build_chat_request`) and yields one :class:`ReplyDelta` per
engine step: the content that can be shown, the tool-call deltas of
:class:`~hvd_agents.chat.toolcall_stream.ToolCallDeltaParser` (a call's name as soon as it
is read, then its argument text as it is generated) and the tokens the step emitted. It is
the one reply pipeline: the server shapes the deltas into OpenAI-style chunks,
``langchain_hvd.ChatHVD`` into ``tool_call_chunks`` as they are generated, and
``llama_index.llms.hvd.HVD`` aggregates them (:class:`CollectedReply`).

How a reply ends is decided here, once for every front end:

* a block still open at the end is complete when
  :meth:`~hvd_agents.chat.request.ChatRequest.closes_open_call` says so (a forced call
  stopped by its stop string ``</tool_call>``), else it is cut short;
* a block that ends without a call that parses comes as an
  :class:`~hvd_agents.chat.toolcall_stream.InvalidCallDelta` on the delta of the step it
  ended in: the one ``invalid_tool_call`` outcome (the server shows its text, as content or
  as the streamed call's arguments; LangChain lists it in ``invalid_tool_calls``; LlamaIndex
  in ``additional_kwargs["invalid_tool_calls"]``, where ``get_tool_calls_from_response``
  names it when there is no valid call);
* the last delta's finish reason is ``"tool_calls"`` when the reply called a tool and
  stopped by itself, ``"invalid_tool_call"`` when a forced call stopped without a call that
  parses, else the engine's (``"stop"``, ``"length"``); its summary
  (:class:`~hvd_agents.chat.reply.ReplySummary`) keeps the engine's reason.

A non-streaming reply is the sum of the deltas (:func:`collect`), so a streamed
reply and a non-streamed one are the same.

Closing the generator, or setting ``cancelled`` (checked after every engine step),
closes the engine's iterator: the request ends within one step and the engine is free.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hvd_agents.chat.json_reply import VisibleReply
from hvd_agents.chat.reply import ReplySummary, request_events
from hvd_agents.chat.request import ChatRequest
from hvd_agents.chat.toolcall_parser import ParsedOutput, ToolCall
from hvd_agents.chat.toolcall_stream import (
    InvalidCallDelta,
    ParsedDelta,
    ToolCallDelta,
    ToolCallDeltaParser,
    merge_call_deltas,
)
from hvd_agents.engine import TokenEvent

INVALID_TOOL_CALL = "invalid_tool_call"
"""The finish reason of a reply whose forced tool call did not parse."""


@dataclass(frozen=True)
class ReplyDelta:
    """What one engine step adds to a reply.

    Attributes:
        content: content that can be shown now (a block read whole that is no call comes as
            written: the server's content).
        tool_calls: tool-call deltas (see :class:`ToolCallDelta`).
        tokens: tokens the step emitted (the target's token plus accepted draft tokens).
        finish_reason: None until the last delta, then ``"stop"``, ``"length"``, ``"tool_calls"``
            or ``"invalid_tool_call"``.
        summary: on the last delta: usage, method and stats.
        prose: ``content`` without the blocks that are no call (the adapters' content: they
            report such a block as an invalid call).
        invalid_calls: the blocks that ended this step without a call that parses.
    """

    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    tokens: int = 0
    finish_reason: str | None = None
    summary: ReplySummary | None = None
    prose: str = ""
    invalid_calls: tuple[InvalidCallDelta, ...] = ()


@dataclass
class CollectedCall:
    """One tool call of a collected reply."""

    id: str
    name: str
    arguments: str = ""


@dataclass
class CollectedReply:
    """The sum of a reply's deltas (:func:`collect`)."""

    content: str = ""
    tool_calls: list[CollectedCall] = field(default_factory=list)
    finish_reason: str | None = None
    summary: ReplySummary | None = None
    prose: str = ""
    invalid_calls: list[InvalidCallDelta] = field(default_factory=list)

    def add(self, delta: ReplyDelta) -> None:
        """Add one delta."""
        self.content += delta.content
        self.prose += delta.prose
        for call in delta.tool_calls:
            if call.index == len(self.tool_calls):
                self.tool_calls.append(CollectedCall(call.id or "", call.name or ""))
            self.tool_calls[call.index].arguments += call.arguments
        self.invalid_calls.extend(delta.invalid_calls)
        if delta.finish_reason is not None:
            self.finish_reason, self.summary = delta.finish_reason, delta.summary

    def parsed(self) -> ParsedOutput:
        """The reply as the adapters read it: its prose, the calls that parse (arguments decoded), the rest.

        Equal to :func:`~hvd_agents.chat.toolcall_parser.parse_tool_calls` of the whole reply but for
        the ids it draws (a call keeps the id its first delta carried).
        """
        invalid = {bad.index for bad in self.invalid_calls if bad.index is not None}
        # a call that parsed has a JSON object for arguments: its raw text, or the object re-serialised
        calls = tuple(ToolCall(call.name, json.loads(call.arguments), call.id)
                      for index, call in enumerate(self.tool_calls) if index not in invalid)
        return ParsedOutput(self.prose, calls, tuple(bad.as_invalid_tool_call() for bad in self.invalid_calls))


def collect(deltas: Iterable[ReplyDelta]) -> CollectedReply:
    """The whole reply: content, calls (arguments joined), invalid calls, finish reason and summary."""
    reply = CollectedReply()
    for delta in deltas:
        reply.add(delta)
    return reply


def stream_reply_deltas(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[ReplyDelta]:
    """Run ``request``; yield a :class:`ReplyDelta` per engine step, the last with the summary.

    Args:
        request: the prepared request.
        cancelled: when set, the request ends after the current step (no last delta); a
            :class:`~hvd_agents.chat.async_stream.CancelFlag` (the server's, the adapters'
            async calls') also ends a batched request at once
            (:func:`~hvd_agents.chat.reply.request_events`).
    """
    if cancelled is not None and cancelled.is_set():
        return
    events = request_events(request, cancelled)
    try:
        if request.parse_tools:
            yield from _tool_deltas(request, events, cancelled)
        else:
            yield from _text_deltas(request, events, cancelled)
    finally:
        events.close()


def _tool_deltas(
    request: ChatRequest, events: Iterator[TokenEvent], cancelled: threading.Event | None
) -> Iterator[ReplyDelta]:
    parser = ToolCallDeltaParser(request.prefix)
    for event in events:
        if cancelled is not None and cancelled.is_set():
            return
        parsed = parser.push(event.text)
        if event.finish_reason is None:
            yield ReplyDelta(parsed.content, parsed.tool_calls, len(event.token_ids), prose=parsed.prose,
                             invalid_calls=parsed.invalid_calls)
            continue
        rest = parser.finish(close_open_block=request.closes_open_call(event.finish_reason))
        parsed = ParsedDelta(parsed.content + rest.content, merge_call_deltas([*parsed.tool_calls, *rest.tool_calls]),
                             parsed.prose + rest.prose, parsed.invalid_calls + rest.invalid_calls)
        finish = _finish_reason(request, parser, event.finish_reason)
        summary = ReplySummary.of(request, event.finish_reason, event.stats)
        yield ReplyDelta(parsed.content, parsed.tool_calls, len(event.token_ids), finish, summary, parsed.prose,
                         parsed.invalid_calls)
        return


def _text_deltas(
    request: ChatRequest, events: Iterator[TokenEvent], cancelled: threading.Event | None
) -> Iterator[ReplyDelta]:
    """Content only; in JSON mode the reply is cut after its first JSON object."""
    content = VisibleReply(request.prefix, request.json_mode)
    for event in events:
        if cancelled is not None and cancelled.is_set():
            return
        delta = content.push(event.text)
        if event.finish_reason is None:
            yield ReplyDelta(delta, tokens=len(event.token_ids), prose=delta)
            continue
        summary = ReplySummary.of(request, event.finish_reason, event.stats)
        yield ReplyDelta(delta, tokens=len(event.token_ids), finish_reason=event.finish_reason, summary=summary,
                         prose=delta)
        return


def _finish_reason(request: ChatRequest, parser: ToolCallDeltaParser, engine_reason: str) -> str:
    """``"tool_calls"`` when the reply called a tool and stopped by itself; ``"invalid_tool_call"`` when a
    forced call stopped without one that parses (its text is the content, or the call's arguments are
    not valid JSON); else the engine's reason."""
    if engine_reason != "stop":
        return engine_reason
    if request.forced_call and not parser.num_valid_calls:
        return INVALID_TOOL_CALL
    return "tool_calls" if parser.num_calls else engine_reason
