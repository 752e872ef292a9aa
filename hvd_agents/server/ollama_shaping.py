"""Ollama's answers: ``/api/chat`` and ``/api/generate`` replies, whole or as NDJSON lines.

* ``/api/chat``: ``{"model", "created_at", "message": {"role": "assistant", "content",
  "tool_calls"?}, "done": true, "done_reason", "total_duration", "load_duration",
  "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"}``. A tool call is
  ``{"function": {"name", "arguments": {...}}}`` with the arguments an object, as Ollama sends
  them (a call whose arguments are not an object comes back as the text it is).
* ``/api/generate``: the same with ``"response"`` (the text) in place of ``"message"``.
* Streamed (``stream`` is true unless set false, as in Ollama), each step with content is one
  line ``{"model", "created_at", "message": {"role": "assistant", "content": <piece>}, "done":
  false}`` (``"response"`` for generate); a reply's tool calls come whole, in one line, once the
  reply ends (Ollama sends parsed calls, not argument pieces); then the last line with ``done``
  true, the counts and durations (nanoseconds: the request's prefill and decode times). A
  failure after the first line is a line ``{"error": "..."}``.
* ``done_reason``: ``"length"`` when ``num_predict`` or the context window cut the reply, else
  ``"stop"`` (tool calls included, as Ollama reports them).
* ``prompt_eval_count`` is the prompt's tokens; the ``hvd`` extension field holds the decoding
  method and the request's drafting stats (``reused_prefix_tokens``: the prefix whose KV was reused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hvd_agents.chat.delta_stream import CollectedCall, CollectedReply, ReplyDelta
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.server.anthropic_shaping import tool_input
from hvd_agents.server.errors import APIError
from hvd_agents.server.shaping import Envelope, hvd_extension

NDJSON = "application/x-ndjson"


def created_at() -> str:
    """Now, as Ollama writes its times (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _done(summary: ReplySummary | None, finish_reason: str | None) -> dict[str, Any]:
    """The fields of the last line: ``done``, ``done_reason``, counts and durations."""
    stats = summary.hvd_stats if summary is not None else {}
    prefill = int(float(stats.get("prefill_s", 0.0)) * 1e9)
    decode = int(float(stats.get("decode_s", 0.0)) * 1e9)
    return {"done": True, "done_reason": "length" if finish_reason == "length" else "stop",
            "total_duration": prefill + decode, "load_duration": 0,
            "prompt_eval_count": summary.prompt_tokens if summary is not None else 0, "prompt_eval_duration": prefill,
            "eval_count": summary.completion_tokens if summary is not None else 0, "eval_duration": decode,
            "hvd": hvd_extension(summary)}


def _split_calls(reply: CollectedReply) -> tuple[str, list[dict[str, Any]]]:
    """The reply's text and its calls in Ollama's shape (calls whose arguments are no object stay text)."""
    text, calls = reply.content, []
    for call in reply.tool_calls:
        arguments = tool_input(call.arguments)
        if arguments is None:
            text += call.arguments
        else:
            calls.append(_call(call, arguments))
    return text, calls


def _call(call: CollectedCall, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call.id, "function": {"name": call.name, "arguments": arguments}}


def chat_reply(env: Envelope, reply: CollectedReply) -> dict[str, Any]:
    """The non-streamed ``/api/chat`` reply."""
    text, calls = _split_calls(reply)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {"model": env.model, "created_at": created_at(), "message": message,
            **_done(reply.summary, reply.finish_reason)}


def generate_reply(env: Envelope, reply: CollectedReply) -> dict[str, Any]:
    """The non-streamed ``/api/generate`` reply."""
    return {"model": env.model, "created_at": created_at(), "response": reply.content,
            **_done(reply.summary, reply.finish_reason)}


@dataclass
class OllamaLines:
    """The NDJSON lines of one streamed ``/api/chat`` (``chat`` true) or ``/api/generate`` reply.

    Args:
        env: the reply's model.
        chat: lines carry a ``message`` (chat) or a ``response`` (generate).
    """

    env: Envelope
    chat: bool = True
    media_type: str = field(default=NDJSON, init=False)
    reply: CollectedReply = field(default_factory=CollectedReply, init=False)  # the calls so far, summed

    def first(self) -> bytes:
        return b""

    def step(self, delta: ReplyDelta) -> bytes:
        """The line of one step's content; on the last step the calls' line and the ``done`` line."""
        self.reply.add(delta)
        out = self._line({"done": False}, delta.content) if delta.content else b""
        if delta.finish_reason is None:
            return out
        if self.chat and self.reply.tool_calls:
            text, calls = _split_calls(CollectedReply(tool_calls=self.reply.tool_calls))
            out += self._line({"done": False}, text, calls)
        return out + self._line(_done(delta.summary, delta.finish_reason), "")

    def error(self, error: APIError) -> bytes:
        """A failure after the first line."""
        return (json.dumps(error.ollama_body()) + "\n").encode()

    def _line(self, fields: dict[str, Any], text: str, calls: list[dict[str, Any]] | None = None) -> bytes:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            body = {"model": self.env.model, "created_at": created_at(), "message": message, **fields}
        else:
            body = {"model": self.env.model, "created_at": created_at(), "response": text, **fields}
        return (json.dumps(body, ensure_ascii=False) + "\n").encode()
