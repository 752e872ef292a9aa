"""Responses API answers: the response object and its stream of events, from the chat pipeline's deltas.

* A response is ``{"id": "resp_...", "object": "response", "created_at", "status", "model",
  "output": [...], "usage", ...}`` with the request's settings echoed (``instructions``,
  ``tools``, ``tool_choice``, ``temperature``, ...). ``output`` holds a ``message`` item
  (``{"type": "message", "id": "msg_...", "role": "assistant", "status", "content":
  [{"type": "output_text", "text", "annotations": []}]}``) when the reply has text or no
  call, then one ``function_call`` item per call (``{"type": "function_call", "id":
  "fc_...", "call_id", "name", "arguments", "status"}``). A reply cut by
  ``max_output_tokens`` is ``"incomplete"`` with ``incomplete_details.reason``.
* Streamed (:class:`ResponseEvents`), it is ``response.created``, ``response.in_progress``,
  then per output item ``response.output_item.added`` (a message also
  ``response.content_part.added``), its ``response.output_text.delta`` or
  ``response.function_call_arguments.delta`` events as the steps generate them, at the
  end each item's ``response.output_text.done`` + ``response.content_part.done`` or
  ``response.function_call_arguments.done``, its ``response.output_item.done``, and
  ``response.completed`` (``response.incomplete``) with the whole response. Every event
  is ``event: <type>`` + ``data: {..., "sequence_number"}``. A message item opens at the
  reply's first text that is not whitespace, so whitespace around a call makes no item.
* ``usage`` counts ``input_tokens`` (``input_tokens_details.cached_tokens``: the prompt
  prefix whose KV was reused) and ``output_tokens``; ``hvd`` carries the drafting stats
  as on the chat route.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvd_agents.chat.delta_stream import CollectedReply, ReplyDelta
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.chat.toolcall_stream import ToolCallDelta
from hvd_agents.server.shaping import Envelope, hvd_extension, new_id, usage

Remember = Callable[[CollectedReply], None]
"""Called with the whole reply once it is complete (stores it for ``previous_response_id``)."""


@dataclass(frozen=True)
class ResponseHead:
    """What every state of one response shares: its id, time, model and the request's settings echoed."""

    id: str
    created_at: int
    model: str
    echo: Mapping[str, Any]

    @classmethod
    def of(cls, env: Envelope, echo: Mapping[str, Any]) -> ResponseHead:
        return cls(env.id, env.created, env.model, dict(echo))

    def body(self, status: str, output: list[dict[str, Any]], summary: ReplySummary | None = None) -> dict[str, Any]:
        """The response object in ``status`` with ``output`` (usage and stats once ``summary`` is known)."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": incomplete, "model": self.model, "output": output,
                **self.echo, "usage": _usage(summary) if summary is not None else None,
                "hvd": hvd_extension(summary)}


def response_object(head: ResponseHead, reply: CollectedReply) -> dict[str, Any]:
    """The non-streamed response of a collected reply."""
    status = _status(reply.finish_reason)
    output = []
    if reply.content.strip() or not reply.tool_calls:
        output.append(message_item(new_id("msg_"), reply.content, status))
    output += [call_item(new_id("fc_"), call.id, call.name, call.arguments, status) for call in reply.tool_calls]
    return head.body(status, output, reply.summary)


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant ``message`` output item (no content part while ``text`` is None)."""
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def reply_message(reply: CollectedReply) -> dict[str, Any]:
    """The reply as the chat message that continues its conversation."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content if reply.content.strip() else None}
    if reply.tool_calls:
        message["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}}
                                 for call in reply.tool_calls]
    return message


@dataclass
class _Item:
    """An output item open in the stream: a message (``call`` None) or a function call."""

    id: str
    index: int
    text: str = ""
    call: ToolCallDelta | None = None
    arguments: str = ""

    def final(self, status: str) -> dict[str, Any]:
        if self.call is None:
            return message_item(self.id, self.text, status)
        return call_item(self.id, self.call.id or "", self.call.name or "", self.arguments, status)


@dataclass
class ResponseEvents:
    """The server-sent events of one streamed response.

    Args:
        head: the response's id, time, model and echoed settings.
        remember: called with the whole reply when it is complete; None stores nothing.
    """

    head: ResponseHead
    remember: Remember | None = None
    reply: CollectedReply = field(default_factory=CollectedReply, init=False)  # the deltas so far, summed
    items: list[_Item] = field(default_factory=list, init=False)  # output items, by output_index
    message: _Item | None = field(default=None, init=False)
    calls: dict[int, _Item] = field(default_factory=dict, init=False)  # by the call's index in the reply
    held_space: str = field(default="", init=False)  # whitespace before the message item opens
    sequence: int = field(default=0, init=False)

    def first(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        body = self.head.body("in_progress", [])
        return self._event("response.created", response=body) + self._event("response.in_progress", response=body)

    def step(self, delta: ReplyDelta) -> bytes:
        """The events of one step; on the last step the items' closing events and ``response.completed``."""
        self.reply.add(delta)
        out = self._text(delta.content) if delta.content else b""
        for call in delta.tool_calls:
            out += self._call(call)
        if delta.finish_reason is None:
            return out
        if self.message is None and not self.calls:  # a reply of no text and no call is still a message
            out += self._open_message() + (self._append(self.held_space) if self.held_space else b"")
        status = _status(delta.finish_reason)
        for item in self.items:
            out += self._close(item, status)
        if self.remember is not None:
            self.remember(self.reply)
        body = self.head.body(status, [item.final(status) for item in self.items], delta.summary)
        return out + self._event("response.completed" if status == "completed" else "response.incomplete",
                                 response=body)

    def _text(self, text: str) -> bytes:
        if self.message is not None:
            return self._append(text)
        text, self.held_space = self.held_space + text, ""
        if not text.strip():
            self.held_space = text
            return b""
        return self._open_message() + self._append(text)

    def _open_message(self) -> bytes:
        item = self.message = _Item(new_id("msg_"), len(self.items))
        self.items.append(item)
        return (self._event("response.output_item.added", output_index=item.index,
                            item=message_item(item.id, None, "in_progress"))
                + self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                              content_index=0, part=_text_part("")))

    def _append(self, text: str) -> bytes:
        item = self.message
        item.text += text
        return self._event("response.output_text.delta", item_id=item.id, output_index=item.index,
                           content_index=0, delta=text, logprobs=[])

    def _call(self, delta: ToolCallDelta) -> bytes:
        out = b""
        item = self.calls.get(delta.index)
        if item is None:
            item = self.calls[delta.index] = _Item(new_id("fc_"), len(self.items), call=delta)
            self.items.append(item)
            out += self._event("response.output_item.added", output_index=item.index,
                               item=call_item(item.id, delta.id or "", delta.name or "", "", "in_progress"))
        if delta.arguments:
            item.arguments += delta.arguments
            out += self._event("response.function_call_arguments.delta", item_id=item.id, output_index=item.index,
                               delta=delta.arguments)
        return out

    def _close(self, item: _Item, status: str) -> bytes:
        final = item.final(status)
        where = {"item_id": item.id, "output_index": item.index}
        if item.call is None:
            out = (self._event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[])
                   + self._event("response.content_part.done", **where, content_index=0,
                                 part=_text_part(item.text)))
        else:
            out = self._event("response.function_call_arguments.done", **where, name=final["name"],
                              arguments=item.arguments)
        return out + self._event("response.output_item.done", output_index=item.index, item=final)

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = json.dumps({"type": kind, "sequence_number": self.sequence, **data}, ensure_ascii=False)
        self.sequence += 1
        return f"event: {kind}\ndata: {payload}\n\n".encode()


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _usage(summary: ReplySummary) -> dict[str, Any]:
    chat = usage(summary)
    return {"input_tokens": chat["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": chat["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat["total_tokens"]}
