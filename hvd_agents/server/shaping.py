"""Responses in the OpenAI shape: chat completions, their SSE chunks, text completions.

* A chat completion is ``{"id": "chatcmpl-...", "object": "chat.completion", "created",
  "model", "choices": [{"index": 0, "message": {"role": "assistant", "content",
  "refusal": null, "annotations": [], "tool_calls"?}, "logprobs": null, "finish_reason"}],
  "usage", "hvd"}``; ``content`` is null when the reply is only tool calls.
* Streamed, it is a first chunk with the role, then per step a chunk with the content it
  adds and one chunk per tool call it adds to (one ``tool_calls`` entry each: a call's
  first delta has its ``id``, ``type``, ``name`` and the arguments read so far, the next
  ones ``function.arguments`` pieces, as OpenAI sends them), a chunk with the ``finish_reason`` (and the
  ``hvd`` field), with ``stream_options.include_usage`` a chunk with empty ``choices``
  and the ``usage`` (every earlier chunk then has ``"usage": null``), and ``data: [DONE]``.
* ``usage.prompt_tokens_details.cached_tokens`` is the prompt prefix whose KV was
  reused; the ``hvd`` extension field holds the decoding method and the request's
  drafting stats (:meth:`~hvd_agents.engine.RequestStats.to_dict`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from hvd_agents.chat.delta_stream import CollectedReply, ReplyDelta
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.chat.toolcall_stream import ToolCallDelta

DONE = b"data: [DONE]\n\n"


def new_id(prefix: str) -> str:
    """A response id: ``prefix`` + 32 hex characters."""
    return f"{prefix}{uuid.uuid4().hex}"


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"


def usage(summary: ReplySummary | None) -> dict[str, Any]:
    """OpenAI usage with ``prompt_tokens_details.cached_tokens`` (prefix KV reused)."""
    if summary is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    cached = int(summary.hvd_stats.get("reused_prefix_tokens", 0))
    return {**summary.usage(), "prompt_tokens_details": {"cached_tokens": cached}}


def hvd_extension(summary: ReplySummary | None) -> dict[str, Any]:
    """The ``hvd`` field: decoding method and the request's stats."""
    if summary is None:
        return {}
    return {"method": summary.method, "stats": summary.hvd_stats}


class Envelope:
    """The fields every response and chunk of one request shares: id, created, model."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = new_id(prefix)
        self.created = int(time.time())
        self.model = model

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


# ------------------------------------------------------------------ chat completions


def chat_completion(env: Envelope, reply: CollectedReply) -> dict[str, Any]:
    """The non-streamed chat completion of a collected reply."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.content if reply.content or not reply.tool_calls else None,
        "refusal": None,
        "annotations": [],
    }
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in reply.tool_calls
        ]
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}
    return {**env.head("chat.completion"), "choices": [choice], "usage": usage(reply.summary),
            "hvd": hvd_extension(reply.summary)}


class ChatChunks:
    """The SSE chunks of one streamed chat completion.

    Args:
        env: the request's id, created time and model.
        include_usage: ``stream_options.include_usage``.
    """

    def __init__(self, env: Envelope, include_usage: bool) -> None:
        self.env = env
        self.include_usage = include_usage

    def first(self) -> bytes:
        """The opening chunk: the assistant role and empty content."""
        return self._chunk({"role": "assistant", "content": ""})

    def step(self, delta: ReplyDelta) -> bytes:
        """The chunks of one step: its content and call deltas, and the closing chunks on the last step."""
        out = self._chunk({"content": delta.content}) if delta.content else b""
        for call in delta.tool_calls:  # one call per chunk: some clients read only a chunk's first entry
            out += self._chunk({"tool_calls": [_call_delta(call)]})
        if delta.finish_reason is None:
            return out
        out += self._chunk({}, delta.finish_reason, hvd=hvd_extension(delta.summary))
        if self.include_usage:
            out += sse({**self.env.head("chat.completion.chunk"), "choices": [], "usage": usage(delta.summary)})
        return out + DONE

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        chunk = {**self.env.head("chat.completion.chunk"), "choices": [choice], **extra}
        if self.include_usage:
            chunk["usage"] = None
        return sse(chunk)


def _call_delta(call: ToolCallDelta) -> dict[str, Any]:
    if call.id is None:
        return {"index": call.index, "function": {"arguments": call.arguments}}
    return {"index": call.index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


# ------------------------------------------------------------------ text completions


def text_completion(env: Envelope, reply: CollectedReply) -> dict[str, Any]:
    """The non-streamed text completion."""
    choice = {"index": 0, "text": reply.content, "logprobs": None, "finish_reason": reply.finish_reason}
    return {**env.head("text_completion"), "choices": [choice], "usage": usage(reply.summary),
            "hvd": hvd_extension(reply.summary)}


class CompletionChunks:
    """The SSE chunks of one streamed text completion (same closing rules as :class:`ChatChunks`)."""

    def __init__(self, env: Envelope, include_usage: bool) -> None:
        self.env = env
        self.include_usage = include_usage

    def first(self) -> bytes:
        return b""

    def step(self, delta: ReplyDelta) -> bytes:
        out = b""
        if delta.content or delta.finish_reason is not None:
            choice = {"index": 0, "text": delta.content, "logprobs": None, "finish_reason": delta.finish_reason}
            chunk = {**self.env.head("text_completion"), "choices": [choice]}
            if delta.finish_reason is not None:
                chunk["hvd"] = hvd_extension(delta.summary)
            if self.include_usage:
                chunk["usage"] = None
            out += sse(chunk)
        if delta.finish_reason is None:
            return out
        if self.include_usage:
            out += sse({**self.env.head("text_completion"), "choices": [], "usage": usage(delta.summary)})
        return out + DONE


def error_event(body: dict[str, Any]) -> bytes:
    """An error after the stream began (the status is sent already): the envelope as an event, then [DONE]."""
    return sse(body) + DONE
