"""The generations the server runs: a chat request or a raw-prompt completion, as reply deltas.

Each job runs in two phases. :meth:`ChatJob.prepare` / :meth:`CompletionJob.prepare` run
on the preparation thread (:meth:`~hvd_agents.server.queue.GenerationQueue.submit_after`),
so rendering and tokenizing a long prompt never delays the generations queued behind it:
the chat job prepares the request with :func:`~hvd_agents.chat.request.build_chat_request`,
the same call the LangChain and LlamaIndex adapters make (so the prompt and greedy output
equal ``ChatHVD``'s, and the conversation is registered in the cache drafter's store for its
session; the store is locked, so registering beside a running generation is safe), and a
prompt that does not fit the context window is refused there, before anything is
registered. What ``prepare`` returns then runs on the generation worker and yields the
deltas (:func:`~hvd_agents.chat.delta_stream.stream_reply_deltas`).

Every step is counted in the metrics as it happens, so tokens of a cancelled request
are counted too; a job that ends without its last delta counts as cancelled.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.conversation import check_fits
from hvd_agents.chat.delta_stream import ReplyDelta, stream_reply_deltas
from hvd_agents.chat.reply import ReplySummary
from hvd_agents.chat.reply_options import ReplyOptions
from hvd_agents.chat.request import build_chat_request
from hvd_agents.chat.settings import ChatSettings
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.runtime.chat_template import plain_prompt_ids
from hvd_agents.server.metrics import ServerMetrics

Job = Callable[[threading.Event], Generator[ReplyDelta, None, None]]
Run = Callable[[threading.Event], Iterator[ReplyDelta]]


@dataclass(frozen=True)
class ChatJob:
    """One chat completion, ready to run (everything :func:`build_chat_request` takes; ``options`` are the
    request's ``tool_choice`` and ``response_format`` as the route checked them)."""

    engine: Engine
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None
    settings: ChatSettings
    options: ReplyOptions
    stop: Sequence[str]
    session_id: str | None
    model_name: str

    def prepare(self) -> Run:
        """Render, tokenize, check and register the request; returns what the worker runs.

        Raises:
            InvalidRequestError: bad messages, tools or settings.
            ContextLengthError: the prompt does not fit the context window.
        """
        request = build_chat_request(
            self.engine, self.messages, self.tools, settings=self.settings, options=self.options,
            stop=self.stop, session_id=self.session_id, model_name=self.model_name,
        )
        return functools.partial(stream_reply_deltas, request)


@dataclass(frozen=True)
class CompletionJob:
    """One raw-prompt completion (no chat template, no tool calls)."""

    engine: Engine
    prompt: str | Sequence[int]
    settings: ChatSettings
    stop: Sequence[str]
    model_name: str

    def prepare(self) -> Run:
        """Tokenize and check the prompt; returns what the worker runs.

        Raises:
            InvalidRequestError: bad settings.
            ContextLengthError: the prompt does not fit the context window.
        """
        params = self.settings.to_params(self.stop)
        if isinstance(self.prompt, str):
            ids = plain_prompt_ids(self.engine.tokenizer, self.prompt) if self.engine.tokenizer else []
        else:
            ids = list(self.prompt)
        check_fits(self.engine, ids)
        return functools.partial(self._deltas, ids, params)

    def _deltas(self, ids: list[int], params: GenerationParams, cancelled: threading.Event) -> Iterator[ReplyDelta]:
        events = self.engine.stream(ids, params)
        try:
            for event in events:
                if cancelled.is_set():
                    return
                summary = None
                if event.finish_reason is not None and event.stats is not None:
                    summary = ReplySummary(self.model_name, params.method, event.finish_reason, len(ids),
                                           event.stats.new_tokens, event.stats.to_dict())
                yield ReplyDelta(event.text, tokens=len(event.token_ids), finish_reason=event.finish_reason,
                                 summary=summary)
        finally:
            events.close()


def counted(run: Run, metrics: ServerMetrics) -> Job:
    """A prepared job as the worker runs it: each step counted, a job that ends early counted as cancelled."""

    def counting(cancelled: threading.Event) -> Generator[ReplyDelta, None, None]:
        finished = False
        deltas = run(cancelled)
        try:
            for delta in deltas:
                metrics.step(delta.tokens)
                finished = delta.finish_reason is not None
                yield delta
        finally:
            deltas.close()
            if not finished and cancelled.is_set():
                metrics.cancel()

    return counting
