"""Generations one at a time, in arrival order, with a bounded number waiting.

The engine decodes one request at a time, so every generation runs on one worker
thread (a one-thread executor: FIFO). :meth:`GenerationQueue.submit` admits a request
only while fewer than ``max_pending`` are queued or running; past that it refuses
with 503 and ``Retry-After``, which the OpenAI client honours and retries, instead of
letting requests pile up without bound.

A submitted generation is an async iterator over the items its generator yields in
the worker (:func:`hvd_agents.chat.async_stream.iterate_in_thread`): leaving it
(a client's disconnect cancels the consuming task) sets the generation's cancel flag,
which stops it after the current engine step; one still waiting never starts.

A generation may have a set-up phase (:meth:`GenerationQueue.submit_after`): rendering
and tokenizing its prompt. It runs on a small pool of its own, so a long prompt's
tokenization never delays the generations already queued, nor the set-up of short
requests behind it; a generation joins the worker's line when its set-up ends. The
set-up counts against ``max_pending`` like the generation, so waiting set-ups are
bounded too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hvd_agents.chat.async_stream import iterate_in_thread
from hvd_agents.server.errors import APIError

T = TypeVar("T")
# Set-ups (tokenizing) running at once: a few long prompts cannot hold up the short requests
# behind them, and the memory of the prompts being tokenized stays a few prompts' worth.
PREPARE_WORKERS = 4


class GenerationQueue:
    """The one worker that runs generations, and the bound on how many may wait for it.

    Args:
        max_pending: most generations queued or running at once (>= 1).
        retry_after_s: the ``Retry-After`` of a refusal, in seconds.
        on_change: called with the new count whenever it changes (a metrics gauge).
        workers: generations running at once (a batching engine decodes them together;
            1 runs them one after another, in order).
    """

    def __init__(self, max_pending: int, retry_after_s: int = 1,
                 on_change: Callable[[int], None] | None = None, workers: int = 1) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        self._on_change = on_change
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="hvd-generation")
        self._preparer = ThreadPoolExecutor(max_workers=PREPARE_WORKERS, thread_name_prefix="hvd-prepare")
        self._lock = threading.Lock()
        self._pending = 0

    @property
    def pending(self) -> int:
        """Generations queued or running."""
        return self._pending

    def submit(self, make: Callable[[threading.Event], Generator[T, None, None]]) -> AsyncIterator[T]:
        """Admit a generation; iterate the result (at once) to run it and read its items.

        Args:
            make: builds the generation's generator in the worker; it receives the
                cancel flag (see :func:`~hvd_agents.chat.async_stream.iterate_in_thread`).

        Raises:
            APIError: 503 with ``Retry-After`` when ``max_pending`` are already admitted.
        """
        self._admit()
        return _Admitted(self, iterate_in_thread(make, self._executor))

    def submit_after(
        self, prepare: Callable[[], Callable[[threading.Event], Generator[T, None, None]]]
    ) -> AsyncIterator[T]:
        """Admit a generation with a set-up phase: ``prepare()`` runs on the preparation pool
        and returns the ``make`` that :meth:`submit` takes, which then runs on the worker.
        Whatever ``prepare`` raises is raised by the first ``__anext__``.

        Raises:
            APIError: 503 with ``Retry-After`` when ``max_pending`` are already admitted.
        """
        self._admit()
        return _Admitted(self, self._prepared(prepare))

    async def _prepared(self, prepare: Callable[[], Callable[[threading.Event], Generator[T, None, None]]]
                        ) -> AsyncIterator[T]:
        make = await asyncio.get_running_loop().run_in_executor(self._preparer, prepare)
        items = iterate_in_thread(make, self._executor)
        try:
            async for item in items:
                yield item
        finally:
            await items.aclose()

    def _admit(self) -> None:
        with self._lock:
            if self._pending >= self.max_pending:
                raise APIError(503, f"the server is busy: {self._pending} requests are queued or running",
                               "server_error", None, "queue_full", {"Retry-After": str(self.retry_after_s)})
            self._change(+1)

    def _release(self) -> None:
        with self._lock:
            self._change(-1)

    def _change(self, step: int) -> None:
        self._pending += step
        if self._on_change is not None:
            self._on_change(self._pending)

    def close(self) -> None:
        """Stop the worker once what it has started is done."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._preparer.shutdown(wait=False, cancel_futures=True)


class _Admitted(AsyncIterator[T]):
    """An admitted generation's items; its slot in the queue is released once, when the items run out,
    fail, or the iterator is closed (closed before its first item too: an async generator's own
    ``finally`` would not run then)."""

    def __init__(self, queue: GenerationQueue, items: AsyncIterator[T]) -> None:
        self._queue = queue
        self._items = items
        self._released = False

    def __aiter__(self) -> _Admitted[T]:
        return self

    async def __anext__(self) -> T:
        if self._released:
            raise StopAsyncIteration
        try:
            return await self._items.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            close = getattr(self._items, "aclose", None)
            if close is not None:
                await close()
        finally:
            self._queue._release()
