"""Messages API answers: the message object and its stream of events, from the chat pipeline's deltas.

* A message is ``{"id": "msg_...", "type": "message", "role": "assistant", "model", "content": [...],
  "stop_reason", "stop_sequence", "usage"}``. ``content`` holds a ``text`` block when the reply
  has text or no call, then a ``tool_use`` block per call (``{"type": "tool_use", "id", "name",
  "input"}``, ``input`` the parsed arguments object). A call whose arguments are not a JSON object
  (a forced call cut by ``max_tokens``) comes back as the text it is.
* ``stop_reason``: ``tool_use`` when the reply called a tool, ``max_tokens`` when it was cut,
  ``stop_sequence`` when ``stop_sequences`` were given and it stopped (the engine reports that a
  reply stopped, not whether its end-of-turn token or a stop sequence ended it; ``stop_sequence``
  names the sequence when the request gave one), else ``end_turn``.
* ``usage``: ``input_tokens`` (the prompt tokens computed for this request),
  ``cache_read_input_tokens`` (the prompt prefix whose KV the prefix cache reused; their sum is
  the prompt), ``cache_creation_input_tokens`` (0: nothing is billed) and ``output_tokens``.
  The ``hvd`` extension field holds the decoding method and the request's drafting stats.
* Streamed (:class:`MessageEvents`), it is ``message_start`` (the message, empty), then per
  content block ``content_block_start``, its ``content_block_delta`` events (``text_delta``, or
  ``input_json_delta`` pieces of a call's arguments, as the steps generate them) and
  ``content_block_stop``, a ``ping`` after the first block opens, then ``message_delta``
  (``stop_reason``, ``stop_sequence`` and the usage) and ``message_stop``. Every event is
  ``event: <type>`` + ``data: {"type": <type>, ...}``; a failure after the first event is an
  ``error`` event, which Anthropic's SDK raises. Whitespace before a block opens and between
  calls makes no block.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hvd_agents.chat.delta_stream import CollectedCall, CollectedReply, ReplyDelta
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.chat.toolcall_stream import ToolCallDelta
from hvd_agents.server.errors import APIError
from hvd_agents.server.shaping import Envelope, hvd_extension


def usage(summary: ReplySummary | None) -> dict[str, Any]:
    """Anthropic usage: the prompt split into computed (``input_tokens``) and reused (``cache_read_...``)."""
    if summary is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0}
    reused = int(summary.hvd_stats.get("reused_prefix_tokens", 0))
    return {"input_tokens": summary.prompt_tokens - reused, "output_tokens": summary.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": reused}


def stop_reason(finish_reason: str | None, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for the chat pipeline's finish reason."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "stop" and stop_sequences:
        return "stop_sequence", stop_sequences[0] if len(stop_sequences) == 1 else None
    return "end_turn", None


def tool_input(arguments: str) -> dict[str, Any] | None:
    """A call's arguments as the ``input`` object; None when they are not a JSON object."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def content_blocks(reply: CollectedReply) -> list[dict[str, Any]]:
    """The content blocks of a collected reply: text, then one ``tool_use`` block per call."""
    texts = [reply.content] if reply.content.strip() or not reply.tool_calls else []
    calls: list[CollectedCall] = []
    for call in reply.tool_calls:
        if tool_input(call.arguments) is None:
            texts.append(call.arguments)  # not a call a client could run: the text the model wrote
        else:
            calls.append(call)
    blocks = [{"type": "text", "text": "".join(texts)}] if texts else []
    return blocks + [{"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)}
                     for call in calls]


def message_object(env: Envelope, reply: CollectedReply, stop_sequences: Sequence[str]) -> dict[str, Any]:
    """The non-streamed message of a collected reply."""
    blocks = content_blocks(reply)
    finish = reply.finish_reason
    if finish == "tool_calls" and not any(block["type"] == "tool_use" for block in blocks):
        finish = "stop"
    reason, sequence = stop_reason(finish, stop_sequences)
    return {**_head(env, blocks), "stop_reason": reason, "stop_sequence": sequence, "usage": usage(reply.summary),
            "hvd": hvd_extension(reply.summary)}


def _head(env: Envelope, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": env.id, "type": "message", "role": "assistant", "model": env.model, "content": content}


@dataclass
class MessageEvents:
    """The server-sent events of one streamed message.

    Args:
        env: the message's id and model.
        stop_sequences: the request's ``stop_sequences`` (for ``stop_reason``).
    """

    env: Envelope
    stop_sequences: Sequence[str] = ()
    blocks: int = field(default=0, init=False)  # content blocks opened so far
    open_kind: str | None = field(default=None, init=False)  # "text", "tool_use" or None
    held_space: str = field(default="", init=False)  # whitespace before a text block opens
    called: bool = field(default=False, init=False)

    def first(self) -> bytes:
        """``message_start`` with the empty message."""
        message = {**_head(self.env, []), "stop_reason": None, "stop_sequence": None, "usage": usage(None)}
        return self._event("message_start", message=message)

    def step(self, delta: ReplyDelta) -> bytes:
        """The events of one step; on the last step the closing events."""
        out = self._text(delta.content) if delta.content else b""
        for call in delta.tool_calls:
            out += self._call(call)
        if delta.finish_reason is None:
            return out
        if self.blocks == 0:  # a reply of no text and no call is still one (maybe empty) text block
            out += self._open({"type": "text", "text": ""}, "text")
            if self.held_space:
                out += self._delta({"type": "text_delta", "text": self.held_space})
        out += self._close()
        finish = delta.finish_reason
        if finish == "tool_calls" and not self.called:
            finish = "stop"
        reason, sequence = stop_reason(finish, self.stop_sequences)
        out += self._event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                           usage=usage(delta.summary), hvd=hvd_extension(delta.summary))
        return out + self._event("message_stop")

    def error(self, error: APIError) -> bytes:
        """A failure after the first event: an ``error`` event."""
        return self._event("error", error=error.anthropic_body()["error"])

    def _text(self, text: str) -> bytes:
        if self.open_kind == "text":
            return self._delta({"type": "text_delta", "text": text})
        text, self.held_space = self.held_space + text, ""
        if not text.strip():
            self.held_space = text
            return b""
        return self._close() + self._open({"type": "text", "text": ""}, "text") + self._delta(
            {"type": "text_delta", "text": text})

    def _call(self, call: ToolCallDelta) -> bytes:
        out = b""
        if call.id is not None:  # a new call opens its block
            self.held_space, self.called = "", True
            out += self._close() + self._open({"type": "tool_use", "id": call.id, "name": call.name or "",
                                               "input": {}}, "tool_use")
        if call.arguments:
            out += self._delta({"type": "input_json_delta", "partial_json": call.arguments})
        return out

    def _open(self, block: dict[str, Any], kind: str) -> bytes:
        self.open_kind = kind
        self.blocks += 1
        out = self._event("content_block_start", index=self.blocks - 1, content_block=block)
        return out + (self._event("ping") if self.blocks == 1 else b"")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=self.blocks - 1, delta=delta)

    def _close(self) -> bytes:
        if self.open_kind is None:
            return b""
        self.open_kind = None
        return self._event("content_block_stop", index=self.blocks - 1)

    @staticmethod
    def _event(kind: str, **data: Any) -> bytes:
        payload = json.dumps({"type": kind, **data}, ensure_ascii=False)
        return f"event: {kind}\ndata: {payload}\n\n".encode()
