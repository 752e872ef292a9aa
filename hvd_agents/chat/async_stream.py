"""Async iteration over a blocking stream, without blocking the event loop.

:func:`iterate_in_thread` runs a synchronous iterator (tokenization, model loading
on first use, decoding) in a worker thread and hands its items to the event loop
through an asyncio queue. When the consuming task is cancelled or stops iterating,
a flag is set that the iterator checks (it is passed to the factory); the worker
then closes the iterator, which must release what it holds (the engine's iterator,
hence the engine's lock), and the async generator waits for that before it ends.
An iterator cancelled before its worker started is never built.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

STREAM_WORKERS = 64  # threads of the shared pool: concurrent streams waiting on an engine cost a thread each
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


class CancelFlag(threading.Event):
    """The flag :func:`iterate_in_thread` sets when its consumer leaves, with callbacks run when it is set.

    A callback (``add_callback``) runs in the thread that sets the flag, at once if it
    is already set: an iterator that can be ended from another thread (a batching
    engine's, :meth:`hvd_agents.engine.batch._Events.cancel`) registers its ``cancel``,
    so a cancelled consumer frees the request's place at the end of the step in progress
    instead of after the next event reaches the worker.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], Any]] = []
        self._callbacks_lock = threading.Lock()

    def add_callback(self, callback: Callable[[], Any]) -> None:
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=STREAM_WORKERS, thread_name_prefix="hvd-stream")
        return _pool


async def iterate_in_thread(
    make: Callable[[threading.Event], Generator[T, None, None]], executor: Executor | None = None
) -> AsyncIterator[T]:
    """Yield the items of ``make(cancelled)``, produced in a worker thread.

    Args:
        make: builds the generator inside the worker (so that its set-up also runs
            off the loop); it receives the cancellation flag and should check it
            between steps, including steps that yield nothing. The worker closes
            the generator at the end, so its ``finally`` blocks release resources.
        executor: where the worker runs (None: :data:`STREAM_WORKERS`, a shared pool
            large enough for an engine that decodes many requests together; the
            loop's default pool has only a few threads more than the machine has
            cores, which would cap such a batch). A
            one-thread executor runs the iterators of all its callers one after
            the other, in the order they came.

    Raises:
        Whatever the iterator raises, re-raised in the consuming task.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    cancelled = CancelFlag()

    def put(kind: str, item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, item))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            cancelled.set()

    def work() -> None:
        items: Generator[T, None, None] | None = None
        if cancelled.is_set():  # the consumer left while this waited for a thread
            put("done", None)
            return
        try:
            items = make(cancelled)
            for item in items:
                if cancelled.is_set():
                    break
                put("item", item)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            put("error", exc)
        else:
            put("done", None)
        finally:
            if items is not None:
                items.close()  # runs its finally blocks (closes the engine iterator)

    context = contextvars.copy_context()
    worker = loop.run_in_executor(executor or _shared_pool(), context.run, work)
    try:
        while True:
            kind, item = await queue.get()
            if kind == "done":
                break
            if kind == "error":
                raise item
            yield item
    finally:
        cancelled.set()
        await asyncio.shield(worker)
