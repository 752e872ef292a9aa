"""A chat request's reply as OpenAI-style deltas: content and tool calls that grow step by step.

:func:`stream_reply_deltas` runs a :class:`~hvd_agents.chat.request.ChatRequest` (built by
:func:`~hvd_agents.chat.request.build_chat_request`, exactly as the adapters build it, so
the prompt and the greedy output are the same) and yields one :class:`ReplyDelta` per
engine step: the content that can be shown, the tool-call deltas of
:class:`~hvd_agents.chat.toolcall_stream.ToolCallDeltaParser` (a call's name as soon as it
is read, then its argument text as it is generated) and the tokens the step emitted.
The last delta has the finish reason (``"tool_calls"`` when the reply called a tool
and stopped by itself; ``"invalid_tool_call"`` when a forced call stopped without a call
that parses: its text comes back as content, or as the call's arguments when they were
streamed) and the :class:`~hvd_agents.chat.reply.ReplySummary`.

A non-streaming reply is the sum of the deltas (:func:`collect`), so a streamed
reply and a non-streamed one are the same.

Closing the generator, or setting ``cancelled`` (checked after every engine step),
closes the engine's iterator: the request ends within one step and the engine is free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hvd_agents.chat.json_reply import VisibleReply
from hvd_agents.chat.reply import ReplySummary, start_reply
from hvd_agents.chat.request import ChatRequest
from hvd_agents.chat.toolcall_parser import TOOL_CALL_CLOSE
from hvd_agents.chat.toolcall_stream import ParsedDelta, ToolCallDelta, ToolCallDeltaParser, merge_call_deltas
from hvd_agents.engine import TokenEvent

INVALID_TOOL_CALL = "invalid_tool_call"
"""The finish reason of a reply whose forced tool call did not parse."""


@dataclass(frozen=True)
class ReplyDelta:
    """What one engine step adds to a reply.

    Attributes:
        content: content that can be shown now.
        tool_calls: tool-call deltas (see :class:`ToolCallDelta`).
        tokens: tokens the step emitted (the target's token plus accepted draft tokens).
        finish_reason: None until the last delta, then ``"stop"``, ``"length"`` or ``"tool_calls"``.
        summary: on the last delta: usage, method and stats.
    """

    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    tokens: int = 0
    finish_reason: str | None = None
    summary: ReplySummary | None = None


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

    def add(self, delta: ReplyDelta) -> None:
        """Add one delta."""
        self.content += delta.content
        for call in delta.tool_calls:
            if call.index == len(self.tool_calls):
                self.tool_calls.append(CollectedCall(call.id or "", call.name or ""))
            self.tool_calls[call.index].arguments += call.arguments
        if delta.finish_reason is not None:
            self.finish_reason, self.summary = delta.finish_reason, delta.summary


def collect(deltas: Iterable[ReplyDelta]) -> CollectedReply:
    """The whole reply: content, calls (arguments joined), finish reason and summary."""
    reply = CollectedReply()
    for delta in deltas:
        reply.add(delta)
    return reply


def stream_reply_deltas(request: ChatRequest, cancelled: threading.Event | None = None) -> Iterator[ReplyDelta]:
    """Run ``request``; yield a :class:`ReplyDelta` per engine step, the last with the summary.

    Args:
        request: the prepared request.
        cancelled: when set, the request ends after the current step (no last delta); a
            :class:`~hvd_agents.chat.async_stream.CancelFlag` (the server's) also ends a batched
            request at once (:func:`~hvd_agents.chat.reply.request_events`).
    """
    started = start_reply(request, cancelled)
    if started is None:
        return
    request, events = started
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
            yield ReplyDelta(parsed.content, parsed.tool_calls, len(event.token_ids))
            continue
        # Generation that stopped at the stop string "</tool_call>" consumed the closing tag.
        closed = event.finish_reason == "stop" and TOOL_CALL_CLOSE in request.params.stop
        rest = parser.finish(close_open_block=closed)
        parsed = ParsedDelta(parsed.content + rest.content, merge_call_deltas([*parsed.tool_calls, *rest.tool_calls]))
        finish = _finish_reason(request, parser, event.finish_reason)
        summary = ReplySummary.of(request, event.finish_reason, event.stats)
        yield ReplyDelta(parsed.content, parsed.tool_calls, len(event.token_ids), finish, summary)
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
            yield ReplyDelta(delta, tokens=len(event.token_ids))
            continue
        summary = ReplySummary.of(request, event.finish_reason, event.stats)
        yield ReplyDelta(delta, tokens=len(event.token_ids), finish_reason=event.finish_reason, summary=summary)
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
