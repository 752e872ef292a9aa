"""Running a chat request: where its decoding starts, and what its reply reports at the end.

* :func:`request_events` is where every chat reply's decoding starts: it runs a
  :class:`~hvd_agents.chat.request.ChatRequest`
  (:func:`~hvd_agents.chat.request.build_chat_request` makes it).
* :class:`ReplySummary` is what a reply's last delta reports (usage, method, stats), which
  each front end places into its framework's response types.

The reply itself, content and tool calls as they are generated, is
:func:`~hvd_agents.chat.delta_stream.stream_reply_deltas`: the one reply pipeline of the
server and both adapters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.request import ChatRequest
from hvd_agents.engine import RequestStats, TokenEvent


@dataclass(frozen=True)
class ReplySummary:
    """What the last delta of a reply reports: usage and drafting stats, framework-neutral.

    Attributes:
        model_name: the model's name.
        method: the decoding method.
        finish_reason: the engine's reason, ``"stop"`` or ``"length"``.
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


