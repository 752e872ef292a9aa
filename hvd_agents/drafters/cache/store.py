"""The cross-request cache store: token spans with provenance, shared by the sessions of one engine.

What goes in: the spans the prompt-structure analyzer registers (system prompts,
tool schemas, tool-call skeletons, user turns, assistant turns, tool outputs) and
the outputs of finished requests. Identical spans are stored once (a re-registered
span only counts as used again). Each span keeps its provenance: kind, session id,
and age (a registration counter).

Budget and eviction: the store holds at most ``token_budget`` tokens and evicts
the LEAST RECENTLY USED span first, where "used" means registered again or the
source of an accepted draft. LRU rather than FIFO because the spans that pay are
the ones every request repeats (system prompt, schemas, skeletons): FIFO would
evict them on a schedule while one-off tool outputs stay; LRU keeps them as long
as they keep being used. Evicted tokens are erased at once (they can never match)
and the index is rebuilt when more than half of it is dead.

Persistence: ``save(path)`` writes a NumPy ``.npz`` (token arrays plus a JSON
header, no pickle) atomically; ``CacheStore.load(path)`` reads it, and a missing,
truncated or malformed file raises :class:`~hvd_agents.errors.StoreFormatError`
naming the cause (whatever bytes the file holds, no other error). Callers that want
to continue use :meth:`CacheStore.load_or_empty`: an unusable file is kept aside as
``<name>.corrupt-<UTC timestamp>`` (renamed, never overwritten or deleted), a
warning names the file and the reason, and the store starts empty.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvd_agents.drafters.cache.ngram_index import Match, NgramIndex
from hvd_agents.drafters.cache.successors import SuccessorTable
from hvd_agents.errors import InvalidRequestError, StoreFormatError
from hvd_agents.structure import SpanKind

logger = logging.getLogger(__name__)
_FORMAT = "hvd-agents-store"
_VERSION = 1


@dataclass
class StoredSpan:
    """One span in the store, with provenance."""

    span_id: int
    start: int  # position of its first token in the index
    length: int
    kind: SpanKind
    session_id: str | None
    age: int  # registration counter value when added
    digest: str


class CacheStore:
    """Token spans shared across requests, indexed for longest-suffix lookup.

    Args:
        token_budget: most tokens kept; least recently used spans are evicted.
    """

    def __init__(self, token_budget: int = 1_000_000) -> None:
        if token_budget <= 0:
            raise InvalidRequestError(f"token_budget must be positive, got {token_budget}")
        self.token_budget = token_budget
        self._index = NgramIndex()
        self._spans: OrderedDict[int, StoredSpan] = OrderedDict()  # LRU order: oldest use first
        self._by_digest: dict[str, int] = {}
        self._starts: list[int] = []  # span start positions, ascending (parallel to _start_ids)
        self._start_ids: list[int] = []
        self._next_id = 0
        self._clock = 0
        self.num_tokens = 0
        self._lock = threading.RLock()  # registration may run beside a decode on another thread

    def __len__(self) -> int:
        return len(self._spans)

    @property
    def spans(self) -> list[StoredSpan]:
        """Live spans, least recently used first."""
        return list(self._spans.values())

    def add(self, token_ids: Sequence[int], kind: SpanKind, session_id: str | None = None) -> bool:
        """Add a span; returns False (and marks it used) if an identical span is stored.

        Raises:
            InvalidRequestError: the span is empty or larger than the whole budget.
        """
        tokens = [int(t) for t in token_ids]
        if not tokens:
            raise InvalidRequestError("cannot add an empty span to the cache store")
        if len(tokens) > self.token_budget:
            raise InvalidRequestError(f"span of {len(tokens)} tokens exceeds the store budget {self.token_budget}")
        digest = hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16).hexdigest()
        with self._lock:
            return self._add(tokens, kind, session_id, digest)

    def _add(self, tokens: list[int], kind: SpanKind, session_id: str | None, digest: str) -> bool:
        self._clock += 1
        existing = self._by_digest.get(digest)
        if existing is not None:
            self._spans.move_to_end(existing)
            return False
        self._evict_until(self.token_budget - len(tokens))
        start = self._index.extend(tokens, separate=True)
        span = StoredSpan(self._next_id, start, len(tokens), SpanKind(kind), session_id, self._clock, digest)
        self._next_id += 1
        self._spans[span.span_id] = span
        self._by_digest[digest] = span.span_id
        self._starts.append(start)
        self._start_ids.append(span.span_id)
        self.num_tokens += len(tokens)
        return True

    def touch(self, span_id: int) -> None:
        """Mark a span as used (it supplied an accepted draft)."""
        with self._lock:
            if span_id in self._spans:
                self._spans.move_to_end(span_id)

    def span_at(self, position: int) -> StoredSpan | None:
        """The live span holding index position ``position``."""
        i = bisect.bisect_right(self._starts, position) - 1
        if i < 0:
            return None
        span = self._spans.get(self._start_ids[i])
        if span is None or not span.start <= position < span.start + span.length:
            return None
        return span

    def lookup(self, query: Sequence[int], max_match: int = 64) -> list[Match]:
        """Longest earlier matches of the suffix of ``query`` in the store (see NgramIndex.lookup)."""
        with self._lock:
            return self._index.lookup(query, max_match)

    def successor_counts_many(
        self, grams: Sequence[Sequence[int]], tokens: Sequence[int], keys: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """How often each gram was followed by its token, and by any token, in the store
        (:meth:`NgramIndex.successor_counts_many`)."""
        with self._lock:
            return self._index.successor_counts_many(grams, tokens, keys=keys)

    def successors(self, grams: Sequence[Sequence[int]], k: int,
                   keys: Sequence[int] | None = None) -> list[dict[int, tuple[int, list[int]]]]:
        """What followed each of ``grams`` in the store, and how often (:meth:`NgramIndex.successors`)."""
        with self._lock:
            return self._index.successors(grams, k, keys=keys)

    def successor_table(self, grams: Sequence[Sequence[int]] | np.ndarray,
                        keys: Sequence[int] | None = None) -> SuccessorTable:
        """What followed each of ``grams`` in the store (:meth:`NgramIndex.successor_table`). Its continuations
        are read later, under the lock, from the text it was found in: where the store re-indexed meanwhile,
        that is the text as it was (positions in the new index differ)."""
        with self._lock:
            index = self._index
            return index.successor_table(grams, keys=keys, read=lambda end, k: self._read(index, end, k))

    def _read(self, index: NgramIndex, end: int, k: int) -> list[int]:
        with self._lock:
            return index.continuation(end, k)

    def continuations(
        self, query: Sequence[int], k: int, max_match: int = 64, max_candidates: int = 12
    ) -> tuple[int, list[tuple[list[int], StoredSpan]]]:
        """The longest match length of ``query``'s suffix and, for its most recent
        ``max_candidates`` occurrences, up to ``k`` following tokens with their span.

        One consistent snapshot: safe while other threads register spans.
        """
        with self._lock:
            matches = self._index.lookup(query, max_match, limit=max(max_candidates, 1))  # one at least: the length
            out = []
            for match in matches[:max_candidates]:
                span = self.span_at(match.end)
                tokens = self._index.continuation(match.end, k) if span is not None else []
                if tokens:
                    out.append((tokens, span))
            return (matches[0].length if matches else 0), out

    @property
    def clock(self) -> int:
        """The registration counter (ages are measured against it)."""
        return self._clock

    # ------------------------------------------------------------ eviction

    def _evict_until(self, limit: int) -> None:
        while self.num_tokens > limit and self._spans:
            _, span = self._spans.popitem(last=False)
            del self._by_digest[span.digest]
            self._index.erase(span.start, span.start + span.length)
            self.num_tokens -= span.length
        if len(self._index) > 2 * max(self.num_tokens, 1024):
            self._rebuild()

    def _rebuild(self) -> None:
        """Re-index the live spans compactly (drops erased tokens and stale entries)."""
        old_tokens = self._index.tokens
        spans = sorted(self._spans.values(), key=lambda span: span.start)
        self._index = NgramIndex()
        self._starts, self._start_ids = [], []
        for span in spans:
            tokens = old_tokens[span.start : span.start + span.length]
            span.start = self._index.extend(tokens, separate=True)
            self._starts.append(span.start)
            self._start_ids.append(span.span_id)

    # ------------------------------------------------------------ persistence

    def save(self, path: str | os.PathLike) -> None:
        """Write the store to ``path`` (.npz holding arrays and a JSON header, no pickle), atomically."""
        with self._lock:
            spans = self.spans  # LRU order is kept
            tokens = self._index.tokens.copy()
        flat = np.concatenate([tokens[s.start : s.start + s.length] for s in spans]) if spans else np.zeros(0)
        header = {
            "format": _FORMAT,
            "version": _VERSION,
            "token_budget": self.token_budget,
            "clock": self._clock,
            "spans": [{"length": s.length, "kind": s.kind.value, "session_id": s.session_id, "age": s.age}
                      for s in spans],
        }
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, tokens=flat.astype(np.int64), header=np.frombuffer(json.dumps(header).encode(), np.uint8))
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike, token_budget: int | None = None) -> CacheStore:
        """Read a store written by :meth:`save`.

        Args:
            path: the ``.npz`` file.
            token_budget: the loaded store's budget; None keeps the saved one. Spans
                beyond it are evicted least recently used first, as when adding; a
                span longer than the whole budget is left out.

        Raises:
            StoreFormatError: the file is missing, truncated, not a store, or
                inconsistent; no other error is raised for what the file holds.
        """
        if token_budget is not None and token_budget <= 0:
            raise InvalidRequestError(f"token_budget must be positive, got {token_budget}")
        tokens, header = _read_file(path)
        entries = _check_header(path, header, tokens)
        budget = token_budget or int(header["token_budget"])
        store = cls(budget)
        offset = 0
        for entry in entries:
            length = int(entry["length"])
            if length <= budget and store.add(
                tokens[offset : offset + length].tolist(), SpanKind(entry["kind"]), entry["session_id"]
            ):
                next(reversed(store._spans.values())).age = int(entry["age"])
            offset += length
        store._clock = max(int(header["clock"]), store._clock)
        return store

    @classmethod
    def load_or_empty(cls, path: str | os.PathLike, token_budget: int = 1_000_000) -> CacheStore:
        """:meth:`load`, or an empty store if the file is missing or unusable.

        A file that exists but cannot be read as a store (truncated, corrupt, of
        another format or version) is kept aside: renamed to
        ``<name>.corrupt-<UTC timestamp>`` (never overwritten or deleted, so a later
        :meth:`save` to ``path`` cannot destroy it), and a warning names the file,
        the reason and where it went. A missing file gives an empty store quietly.
        """
        try:
            return cls.load(path, token_budget)
        except StoreFormatError as exc:
            if not os.path.lexists(path):
                logger.info("no cache store file at %s; starting with an empty cache store", path)
                return cls(token_budget)
            kept = quarantine(path)
            where = f"kept aside as {kept}" if kept is not None else "left in place (it could not be renamed)"
            logger.warning("%s; %s; starting with an empty cache store", exc, where)
            return cls(token_budget)


def quarantine(path: str | os.PathLike) -> Path | None:
    """Rename an unusable file to ``<name>.corrupt-<UTC timestamp>[-n]`` next to it.

    Never overwrites: an existing name gets a ``-1``, ``-2``, ... suffix.

    Returns:
        The new path, or None when ``path`` is not a regular file or cannot be renamed
        (the reason is logged).
    """
    source = Path(path)
    if not source.is_file():
        logger.warning("cannot keep %s aside: not a regular file", source)
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for attempt in range(1000):
        target = source.with_name(f"{source.name}.corrupt-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            os.link(source, target)  # fails if target exists: never overwrites
        except FileExistsError:
            continue
        except OSError:
            if os.path.lexists(target):
                continue
            try:  # no hard links here (some file systems): rename, having checked the name is free
                os.rename(source, target)
            except OSError as exc:
                logger.warning("cannot keep %s aside as %s: %s", source, target, exc)
                return None
            return target
        try:
            os.unlink(source)
        except OSError as exc:
            logger.warning("kept a copy of %s as %s but cannot remove the original: %s", source, target, exc)
        return target
    logger.warning("cannot keep %s aside: too many earlier copies", source)
    return None


# What reading arbitrary bytes as an .npz can raise (numpy, zipfile, json, and the checks below). RuntimeError:
# zipfile's for an entry whose flags say it is encrypted (RecursionError and NotImplementedError are kinds of it).
_READ_ERRORS = (
    OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError, OverflowError,
    RuntimeError, zipfile.BadZipFile, zipfile.LargeZipFile,
)


def _read_file(path: str | os.PathLike) -> tuple[np.ndarray, object]:
    """The token array and the decoded JSON header of a store file.

    Raises:
        StoreFormatError: the file is missing or cannot be read as an ``.npz`` with
            an int token array and a UTF-8 JSON header.
    """
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"PK\x03\x04":
            raise StoreFormatError(f"cache store file {path} is corrupt or not a store: not an .npz (zip) file")
        with np.load(path, allow_pickle=False) as data:
            tokens = np.asarray(data["tokens"])
            raw_header = np.asarray(data["header"])
            if raw_header.dtype != np.uint8 or raw_header.ndim != 1:
                raise StoreFormatError(f"cache store file {path} is corrupt or not a store: bad header array")
            header = json.loads(raw_header.tobytes().decode("utf-8"))
    except StoreFormatError:
        raise
    except FileNotFoundError as exc:
        raise StoreFormatError(f"cache store file {path} does not exist") from exc
    except _READ_ERRORS as exc:
        raise StoreFormatError(f"cache store file {path} is corrupt or not a store: {exc}") from exc
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise StoreFormatError(f"{path} is inconsistent: the token array is not a 1-D integer array")
    return tokens, header


def _check_header(path: str | os.PathLike, header: object, tokens: np.ndarray) -> list[dict]:
    """Validate a loaded header against its token array; returns the span entries."""
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise StoreFormatError(f"{path} is not an hvd-agents cache store")
    if header.get("version") != _VERSION:
        raise StoreFormatError(f"{path} has store format version {header.get('version')}, expected {_VERSION}")
    entries = header.get("spans")
    kinds = {kind.value for kind in SpanKind}
    ok = (
        isinstance(entries, list)
        and all(
            isinstance(e, dict)
            and _is_int(e.get("length")) and e["length"] > 0
            and isinstance(e.get("kind"), str) and e["kind"] in kinds
            and _is_int(e.get("age")) and e["age"] >= 0
            and (e.get("session_id") is None or isinstance(e.get("session_id"), str))
            for e in entries
        )
        and _is_int(header.get("token_budget")) and header["token_budget"] > 0
        and _is_int(header.get("clock")) and header["clock"] >= 0
    )
    if not ok:
        raise StoreFormatError(f"{path} has a malformed span table")
    total = sum(e["length"] for e in entries)
    in_range = not len(tokens) or (int(tokens.min()) >= 0 and int(tokens.max()) <= np.iinfo(np.int64).max)
    if total != len(tokens) or not in_range:
        raise StoreFormatError(f"{path} is inconsistent: span table and token array do not agree")
    return entries


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
