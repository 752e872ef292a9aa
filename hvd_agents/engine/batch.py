"""Continuous batching: many requests decoded together, one forward per step for all of them.

An engine made with ``max_batch > 1`` hands each request to a :class:`Batcher`, whose
worker thread owns the decode loop. Requests join between steps and leave when they
finish, their consumer goes away or their deadline passes (``timeout_s``). A joining
request's prefill runs in the engine's chunks (``prefill_chunk`` tokens), about one
chunk's worth between two steps, so a long prompt does not stall the requests already
decoding; a request starts decoding with the step after its last chunk. Each step

1. asks every active request's drafter for a draft, as a lone request would;
2. shares the step's verification among the requests
   (:func:`~hvd_agents.engine.allocation.allocate`): every request verifies at least its
   last token, so one whose drafts never pay still advances one token a step; draft
   tokens are ranked by their expected acceptance, and the step keeps, within
   ``max_rows`` rows, the number of them that gives the most expected tokens per unit of
   the step's cost;
3. runs all of them in one :meth:`~hvd_agents.runtime.runner.Runner.forward_batch`;
4. verifies, emits and accounts each request exactly as the one-request loop does
   (the same :class:`~hvd_agents.engine.request.Request` step), and hands its
   :class:`TokenEvent` to its consumer.

A request's output does not depend on its company: each row's logits are its logits
alone (bitwise on the native CPU runner), drafts only change how many tokens a step
verifies, and verification is lossless. Callers see what :meth:`Engine.stream` always
gave: the same events, errors raised by the call, closing the iterator cancels the
request (at the end of the step in progress; its cache goes to the prefix cache and its
KV slot is freed).

Each request of a built-in method gets its own drafter (a drafter keeps one request's
model-drafter state); a drafter added with :meth:`Engine.add_drafter` is shared.

Bounds: at most ``max_batch`` requests decode together; at most ``max_queue`` wait for
a place (one more raises :class:`~hvd_agents.errors.QueueFullError` from the call), and a
request still waiting at its deadline fails with
:class:`~hvd_agents.errors.RequestTimeoutError` without having started.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hvd_agents.drafters import Draft, never_drafts
from hvd_agents.engine.allocation import allocate
from hvd_agents.engine.request import DEFAULT_PREFILL_CHUNK, Request, StepCall
from hvd_agents.engine.stats import TokenEvent
from hvd_agents.errors import InvalidRequestError, QueueFullError
from hvd_agents.policy.cost import CostModel, request_cost
from hvd_agents.runtime.cpu.threads import step_threads
from hvd_agents.runtime.runner import Runner

logger = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 64  # rows one batched step verifies at most (the native CPU forward's largest call)


@dataclass(eq=False)
class _Active:
    """A request in the batch (engine-internal)."""

    req: Request
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: bool = False
    prefill: Iterator[int] | None = None  # its prefill's remaining chunks, while it has some


class Batcher:
    """The batching worker of one engine (see the module docstring).

    Args:
        runner: the target's runner; each step is one ``forward_batch`` over it.
        lock: held while the worker runs prefill chunks and steps (the engine's: its
            requests and its other users of the runner take turns).
        cost: returns the runner's cost profile (measured on first call).
        max_batch: requests decoded together at most; more wait in line.
        max_rows: rows one step verifies at most.
        max_queue: requests waiting for a place at most (None: no bound).
        prefill_chunk: about how many prompt tokens are prefilled between two steps.
    """

    def __init__(self, runner: Runner, lock: threading.Lock, cost: Callable[[], CostModel], max_batch: int,
                 max_rows: int = DEFAULT_MAX_ROWS, max_queue: int | None = None,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if max_batch < 1 or max_rows < max_batch:
            raise InvalidRequestError(f"max_batch must be in 1..{max_rows} (a step verifies at most {max_rows} rows), "
                                      f"got {max_batch}")
        if max_queue is not None and (isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0):
            raise InvalidRequestError(f"max_queue must be an int >= 0 or None, got {max_queue!r}")
        self.runner = runner
        self.lock = lock
        self.cost = cost
        self.max_batch = max_batch
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._waiting: list[_Active] = []
        self._active: list[_Active] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.steps = 0  # batched steps run (for tests and metrics)
        self.largest_batch = 0

    def submit(self, req: Request) -> Iterator[TokenEvent]:
        """Queue ``req`` and return its events (the iterator is :meth:`Engine.stream`'s)."""
        item = _Active(req)
        with self._cv:
            queued = len(self._waiting) - max(0, self.max_batch - len(self._active))  # those with no free place
            if self.max_queue is not None and queued >= self.max_queue:
                raise QueueFullError(f"{queued} requests are already waiting for a place in the batch "
                                     f"(max_queue={self.max_queue}); retry later or raise max_queue")
            self._waiting.append(item)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="hvd-batcher", daemon=True)
                self._thread.start()
            self._cv.notify()
        return _Events(item, self._cv)

    @property
    def pending(self) -> int:
        """Requests waiting or in the batch."""
        with self._cv:
            return len(self._waiting) + len(self._active)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._active:
                    if not self._cv.wait(timeout=30.0) and not self._waiting:  # idle: the thread ends
                        self._thread = None
                        return
                expired = [item for item in self._waiting if item.req.overdue()]
                self._waiting = [item for item in self._waiting if item not in expired]
                joining = self._waiting[: self.max_batch - len(self._active)]
                del self._waiting[: len(joining)]
                self._active += joining
            for item in expired:
                item.events.put(item.req.timed_out("waiting for a place in the batch"))
            with self.lock, step_threads(self.runner):
                active = [item for item in self._active
                          if (item not in joining or self._start(item)) and not self._left(item) and not self._expire(item)]
                self._prefill_some([item for item in active if item.prefill is not None])
                active = [item for item in active if not item.ended]
                ready = [item for item in active if item.prefill is None]
                if ready:
                    self.largest_batch = max(self.largest_batch, len(ready))
                    self._step(ready)
                    active = [item for item in active if not self._left(item)]
            with self._cv:
                self._active = active

    def _start(self, item: _Active) -> bool:
        """Start a joining request: its drafter, and its prefill's chunks. False (its error delivered) if it fails."""
        if item.cancelled.is_set():
            item.events.put(None)  # a consumer blocked in next() ends
            return False
        try:
            item.req.start()
            item.prefill = item.req.prefill_chunks()
        except Exception as exc:  # noqa: BLE001 - delivered to the request's consumer
            self._end(item, consistent=False)
            item.events.put(exc)
            return False
        return True

    def _prefill_some(self, items: list[_Active]) -> None:
        """Run prefill chunks of ``items``, oldest first, until about one chunk's worth of tokens is computed."""
        spent = 0
        for item in items:
            while item.prefill is not None and spent < self.prefill_chunk:
                try:
                    spent += max(1, next(item.prefill))
                except Exception as exc:  # noqa: BLE001 - delivered to the request's consumer
                    self._end(item, consistent=False)
                    item.events.put(exc)
                    break
                if item.req.prefilled:
                    item.prefill = None
            if spent >= self.prefill_chunk:
                return

    def _expire(self, item: _Active) -> bool:
        """Whether ``item``'s deadline has passed; if so it ends (its KV kept when prefilled) with the error."""
        if not item.req.overdue():
            return False
        where = "while decoding" if item.req.prefilled else "during its prefill"
        self._end(item, consistent=True)
        item.events.put(item.req.timed_out(where))
        return True

    def _left(self, item: _Active) -> bool:
        """Whether ``item`` is done (finished or cancelled); ends it if so."""
        if not item.cancelled.is_set() and not item.ended:
            return False
        self._end(item, consistent=True)
        return True

    def _end(self, item: _Active, *, consistent: bool) -> None:
        """End the request (:meth:`Request.end`: drafter, prefix cache when between steps, KV slot); once."""
        if item.ended:
            return
        item.ended = True
        item.req.end(consistent=consistent)
        if item.cancelled.is_set():
            item.events.put(None)  # wakes a consumer blocked in next() after a cancel() from another thread

    def _step(self, active: list[_Active]) -> None:
        """One batched step: every request's draft, the step's rows allocated, one forward, each request settled."""
        requests = [item.req for item in active]
        drafts = self._propose(requests)
        steps = [req.step_call(draft) for req, draft in zip(requests, drafts)]
        start = time.perf_counter()
        try:
            logits = self.runner.forward_batch([step.call for step in steps])
        except Exception as exc:  # noqa: BLE001 - every request of the step fails with it
            for item in active:
                self._end(item, consistent=False)
                item.events.put(exc)
            return
        forward_s = (time.perf_counter() - start) / len(active)
        self.steps += 1
        for item, step, rows in zip(active, steps, logits):
            if item.cancelled.is_set():
                item.req.undo(step)  # nobody reads it: the cache stays consistent
                continue
            try:
                event = self._settle(item.req, step, rows, forward_s)
            except Exception as exc:  # noqa: BLE001 - delivered to the request's consumer
                self._end(item, consistent=False)
                item.events.put(exc)
                continue
            if event.finish_reason is not None:  # its prefix is kept before its consumer can send the next turn
                self._end(item, consistent=True)
            item.events.put(event)

    def _propose(self, requests: list[Request]) -> list[Draft]:
        """Each request's draft (a greedy one priced at its share of this step), then the step's rows allocated."""
        priced = len(requests) > 1 and any(req.greedy and not never_drafts(req.drafter) for req in requests)
        step_cost, share = request_cost(self.cost(), len(requests)) if priced else (None, 1.0)
        # a sampled request's drafts must not depend on its company
        drafts = [req.propose(step_cost, share) if req.greedy else req.propose() for req in requests]
        rates = [req.acceptance_rate() for req in requests]
        cost = self.cost() if any(len(d) for d in drafts) else None
        return allocate(drafts, rates, self.max_rows, cost, keep_whole=[not req.greedy for req in requests])

    @staticmethod
    def _settle(req: Request, step: StepCall, logits, forward_s: float) -> TokenEvent:
        """The one-request loop's step after its forward: verify, then emit, account, observe."""
        start = time.perf_counter()
        verification = req.settle(step, logits)
        verify_s = forward_s + time.perf_counter() - start
        return req.finish_step(step.draft, verification, verify_s)


class _Events(Iterator[TokenEvent]):
    """A batched request's events, as its consumer reads them.

    Closing it (``close()``, or dropping it, even before the first item) cancels the
    request: it leaves the batch at the end of the step in progress. :meth:`cancel` does
    the same from another thread while the consumer waits for its next event.
    """

    def __init__(self, item: _Active, cv: threading.Condition) -> None:
        self._item = item
        self._cv = cv
        self._done = False

    def __iter__(self) -> _Events:
        return self

    def __next__(self) -> TokenEvent:
        if self._done:
            raise StopIteration
        event = self._item.events.get()
        if event is None:  # cancelled (by :meth:`cancel`): the request left the batch
            self.close()
            raise StopIteration
        if isinstance(event, BaseException):
            self.close()
            raise event
        if event.finish_reason is not None:
            self.close()
        return event

    def close(self) -> None:
        if not self._done:
            self._done = True
            self.cancel()

    def cancel(self) -> None:
        """End the request at the end of the step in progress, from any thread; a consumer blocked in
        ``next()`` then gets ``StopIteration``."""
        self._item.cancelled.set()  # finished, or the consumer went away
        with self._cv:
            self._cv.notify()

    def __del__(self) -> None:
        self.close()
