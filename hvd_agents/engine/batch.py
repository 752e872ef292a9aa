"""Continuous batching: many requests decoded together, one forward per step for all of them.

An engine made with ``max_batch > 1`` hands each request to a :class:`Batcher`, whose
worker thread owns the decode loop. Requests join between steps (their prefill runs
then) and leave when they finish or their consumer goes away; each step

1. asks every active request's drafter for a draft, as a lone request would;
2. shares the step's verification budget (``max_rows`` rows of one forward) among the
   requests (:func:`allocate`): every request verifies at least its last token, so one
   whose drafts never pay still advances one token a step, and draft tokens are kept in
   the order of their expected acceptance, ``rate ** position``, where ``rate`` is the
   request's own acceptance so far;
3. runs all of them in one :meth:`~hvd_agents.runtime.runner.Runner.forward_batch`;
4. verifies, emits and accounts each request exactly as the one-request loop does
   (the same engine methods), and hands its :class:`TokenEvent` to its consumer.

A request's output does not depend on its company: each row's logits are its logits
alone (bitwise on the native CPU runner), drafts only change how many tokens a step
verifies, and verification is lossless. Callers see what :meth:`Engine.stream` always
gave: the same events, errors raised by the call, closing the iterator cancels the
request (at the end of the step in progress; its cache goes to the prefix cache and its
KV slot is freed).

Each request of a built-in method gets its own drafter (a drafter keeps one request's
model-drafter state); a drafter added with :meth:`Engine.add_drafter` is shared.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hvd_agents.drafters import Draft, Drafter, Outcome
from hvd_agents.engine.stats import TokenEvent
from hvd_agents.errors import InvalidRequestError
from hvd_agents.runtime.runner import BatchCall

logger = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 64  # rows one batched step verifies at most (the native CPU forward's largest call)
PRIOR_RATE = 0.5  # a request's acceptance rate before it has verified anything


@dataclass(eq=False)
class _Active:
    """A request in the batch (engine-internal)."""

    req: object  # the engine's _Request
    drafter: Drafter
    structure: object
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    ended: bool = False
    start_s: float = 0.0


def allocate(drafts: Sequence[Draft], rates: Sequence[float], max_rows: int) -> list[Draft]:
    """Cut ``drafts`` so that they and one root row each fit ``max_rows`` rows.

    Every request keeps its root; the remaining rows go to draft tokens by expected
    acceptance ``rate ** position`` (a draft keeps a prefix: its later tokens are worth
    less), ties to the earlier request. A tree that must be cut keeps its main branch.

    >>> a, b = Draft((1, 2, 3)), Draft((4, 5))
    >>> [len(d) for d in allocate([a, b], [0.6, 0.5], 5)]  # 3 rows for drafts: 0.6, 0.5, 0.36
    [2, 1]
    """
    room = max_rows - len(drafts)
    if sum(len(d) for d in drafts) <= room:
        return list(drafts)
    scored = [(rates[i] ** (j + 1), -i, i) for i, d in enumerate(drafts) for j in range(len(d))]
    keep = [0] * len(drafts)
    for _, _, i in sorted(scored, reverse=True)[: max(0, room)]:
        keep[i] += 1
    out = []
    for d, n in zip(drafts, keep):
        if n < len(d) and d.is_tree:
            d = d.main_branch()
        out.append(d.truncated(min(n, len(d))))
    return out


class Batcher:
    """The batching worker of one engine (see the module docstring).

    Args:
        engine: the engine whose runner, prefix cache and request methods it uses.
        max_batch: requests decoded together at most; more wait in line.
        max_rows: rows one step verifies at most.
        make_drafter: a fresh drafter for a request of ``method`` (None: the engine's shared one).
    """

    def __init__(self, engine, max_batch: int, max_rows: int = DEFAULT_MAX_ROWS,
                 make_drafter: Callable[[str], Drafter | None] | None = None) -> None:
        if max_batch < 1 or max_rows < max_batch:
            raise InvalidRequestError(f"max_batch must be in 1..{max_rows} (a step verifies at most {max_rows} rows), "
                                      f"got {max_batch}")
        self.engine = engine
        self.max_batch = max_batch
        self.max_rows = max_rows
        self._make_drafter = make_drafter
        self._waiting: list[_Active] = []
        self._active: list[_Active] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.steps = 0  # batched steps run (for tests and metrics)
        self.largest_batch = 0

    def submit(self, req, drafter: Drafter, structure) -> Iterator[TokenEvent]:
        """Queue ``req`` and return its events (the iterator is :meth:`Engine.stream`'s)."""
        if self._make_drafter is not None:
            drafter = self._make_drafter(req.params.method) or drafter
        item = _Active(req, drafter, structure)
        with self._cv:
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
                joining = self._waiting[: self.max_batch - len(self._active)]
                del self._waiting[: len(joining)]
                self._active += joining
            with self.engine._lock:
                started = [item for item in self._active if item not in joining or self._start(item)]
                active = [item for item in started if not self._left(item)]
                if active:
                    self.largest_batch = max(self.largest_batch, len(active))
                    self._step(active)
                    active = [item for item in active if not self._left(item)]
            with self._cv:
                self._active = active

    def _start(self, item: _Active) -> bool:
        """Start a joining request: drafter, prefill. False (and its error delivered) when it fails."""
        req = item.req
        if item.cancelled.is_set():
            return False
        try:
            req.session_id = item.structure.session_id if item.structure is not None else None
            item.drafter.start(req.req_id, tuple(req.token_ids), item.structure)
            item.started = True
            self.engine._prefill(req)
        except Exception as exc:  # noqa: BLE001 - delivered to the request's consumer
            self._end(item, consistent=False)
            item.events.put(exc)
            return False
        item.start_s = time.perf_counter()
        return True

    def _left(self, item: _Active) -> bool:
        """Whether ``item`` is done (finished or cancelled); ends it if so."""
        if not item.cancelled.is_set() and not item.ended:
            return False
        self._end(item, consistent=True)
        return True

    def _end(self, item: _Active, *, consistent: bool) -> None:
        """Stop its drafter, keep its KV in the prefix cache (when between steps), free its cache; once."""
        if item.ended:
            return
        item.ended = True
        if item.started:
            item.drafter.stop(item.req.req_id)
            item.started = False
        if consistent:
            self.engine._keep_prefix(item.req)
        self.engine._release(item.req)

    def _step(self, active: list[_Active]) -> None:
        engine = self.engine
        drafts = []
        for item in active:
            req = item.req
            draft = engine._propose(req, item.drafter, req.budget - req.num_output - 1)
            if draft.is_tree and not req.cache.supports_trees:
                draft = draft.main_branch()
            drafts.append(draft)
        rates = [_rate(item.req) for item in active]
        drafts = allocate(drafts, rates, self.max_rows)
        pasts = [item.req.cache.length for item in active]
        hiddens = [[] if item.req.hidden is not None else None for item in active]
        calls = [BatchCall(item.req.cache, [item.req.token_ids[-1], *d.token_ids], d.parents if d.is_tree else None,
                           hidden)
                 for item, d, hidden in zip(active, drafts, hiddens)]
        start = time.perf_counter()
        try:
            logits = engine.runner.forward_batch(calls)
        except Exception as exc:  # noqa: BLE001 - every request of the step fails with it
            for item in active:
                self._end(item, consistent=False)
                item.events.put(exc)
            return
        forward_s = (time.perf_counter() - start) / len(active)
        self.steps += 1
        for item, draft, rows, hidden, past in zip(active, drafts, logits, hiddens, pasts):
            if item.cancelled.is_set():
                item.req.cache.rollback(past)  # nobody reads it: the cache stays consistent
                continue
            try:
                event = self._settle(item, draft, rows, hidden, past, forward_s)
            except Exception as exc:  # noqa: BLE001 - delivered to the request's consumer
                self._end(item, consistent=False)
                item.events.put(exc)
                continue
            if event.finish_reason is not None:  # its prefix is kept before its consumer can send the next turn
                self._end(item, consistent=True)
            item.events.put(event)

    def _settle(self, item: _Active, draft: Draft, logits, hidden, past: int, forward_s: float) -> TokenEvent:
        """The one-request loop's step after its forward: verify, emit, account, observe."""
        engine, req = self.engine, item.req
        start = time.perf_counter()
        verification = engine._settle(req, req.cache, draft, logits, hidden, past)
        verify_s = forward_s + time.perf_counter() - start
        emitted, text, finish = engine._emit(req, verification.token_ids)
        engine._account(req, draft, verification, len(emitted))
        item.drafter.observe(Outcome(req.req_id, draft, verification.num_accepted, emitted,
                                     verification.target_logprob, verification.target_entropy, verify_s=verify_s))
        if finish is None and req.num_output >= req.budget:
            finish = "length"
        if finish is not None:
            text += engine._flush(req, finish)
            req.stats.decode_s = time.perf_counter() - item.start_s
        return TokenEvent(emitted, text, finish, req.stats if finish else None)


class _Events(Iterator[TokenEvent]):
    """A batched request's events, as its consumer reads them.

    Closing it (``close()``, or dropping it, even before the first item) cancels the
    request: it leaves the batch at the end of the step in progress.
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
        if isinstance(event, BaseException):
            self.close()
            raise event
        if event.finish_reason is not None:
            self.close()
        return event

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._item.cancelled.set()  # finished, or the consumer went away
            with self._cv:
                self._cv.notify()

    def __del__(self) -> None:
        self.close()


def _rate(req) -> float:
    """The request's acceptance rate so far (accepted over drafted tokens), with a prior of one draft token."""
    drafted = sum(s.drafted for s in req.stats.per_source.values())
    accepted = sum(s.accepted for s in req.stats.per_source.values())
    return (accepted + PRIOR_RATE) / (drafted + 1)
