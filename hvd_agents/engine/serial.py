"""Requests one at a time: the scheduler of an engine that does not batch (``max_batch=1``).

:meth:`SerialScheduler.submit` runs a :class:`~hvd_agents.engine.request.Request` alone
under the engine's lock, one target forward per step (the step itself is written once,
in :mod:`hvd_agents.engine.request`; :class:`~hvd_agents.engine.batch.Batcher` is the
scheduler that runs many in one forward). The lock is taken at the first ``next()``
and held until the request ends: finished, failed, past its deadline, or closed by its
consumer (``close()``, garbage collection) at a yield. A request that ends between
steps hands its KV to the prefix cache.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from hvd_agents.engine.request import Request
from hvd_agents.engine.stats import TokenEvent
from hvd_agents.errors import RequestTimeoutError
from hvd_agents.runtime.cpu.threads import step_threads


class SerialScheduler:
    """Runs each request alone, in turn (see the module docstring).

    Args:
        lock: the engine's lock, held while a request runs.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def submit(self, req: Request) -> Iterator[TokenEvent]:
        """``req``'s events; it waits for the lock (until its deadline at most) at the first ``next()``.

        Raises:
            RequestTimeoutError: its deadline passed while it waited, or while it decoded.
        """
        left = req.remaining_s()
        if (left is not None and left <= 0) or not self.lock.acquire(timeout=-1 if left is None else left):
            raise req.timed_out("waiting for the engine")
        try:
            req.start()
            between_steps = False  # True when the cache is consistent: finished, or closed at a yield
            try:
                yield from run_alone(req)
                between_steps = True
            except GeneratorExit:
                between_steps = True
                raise
            except RequestTimeoutError:
                between_steps = True  # raised between steps
                raise
            finally:
                req.end(consistent=between_steps)
        finally:
            self.lock.release()


def run_alone(req: Request) -> Iterator[TokenEvent]:
    """The one-request loop: prefill, then one step per forward (:mod:`hvd_agents.engine.request`)."""
    with step_threads(req.host.runner):
        req.prefill()
    finish: str | None = None
    while finish is None:
        with step_threads(req.host.runner):  # never across a yield: the consumer's code runs on its own threads
            req.check_deadline("while decoding")
            draft = req.propose()
            verify_start = time.perf_counter()
            verification = req.verify(draft)
            event = req.finish_step(draft, verification, time.perf_counter() - verify_start)
        finish = event.finish_reason
        yield event
