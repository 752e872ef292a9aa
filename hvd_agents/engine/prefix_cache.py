"""Prefix KV cache: a new request starts from the KV of the longest token prefix already computed.

In an agent loop every call re-sends the whole conversation (system prompt, tool
schemas, earlier turns, tool outputs) plus a few new messages. The engine keeps the
target's KV cache of finished requests here and, for a new prompt, copies the KV of
the longest common token prefix (exact id match) it holds, so only the rest is
prefilled.

Contract:

* ``insert(token_ids, cache, prompt_len=..., session_id=...)`` takes over the KV of a
  FINISHED request: ``token_ids`` are the tokens its cache covers (prompt plus output
  minus the last emitted token, which was never fed to the target). Nothing partial is
  ever inserted, so a lookup can only see KV that a request completed.
* ``lookup(token_ids, cache, session_id=...)`` finds the stored entry with the longest
  common prefix with ``token_ids``, COPIES the KV of those ``length`` positions into
  the empty ``cache`` and returns a :class:`PrefixMatch`. The caller prefills
  ``token_ids[length:]`` on top.
* Memory: the stored tensors' storage bytes never exceed ``budget_bytes``; the least
  recently used entry (used = inserted or matched) is evicted first. An entry larger
  than the whole budget is cut to the prefix that fits (the system prompt and tool
  schemas at the front are the most reusable part). ``budget_bytes`` 0 or None
  disables the cache (lookups find nothing, inserts keep nothing).
* Tensors stay on the device they were computed on (CUDA or CPU); token ids are kept
  as NumPy arrays on the host for the prefix comparison.

Design choices:

* Copy, not consume. A lookup copies the matched positions and leaves the entry in
  place, so a conversation that branches (two agents sharing only the system prompt
  and tool schemas, a retried turn) still finds the shared prefix. The copy costs one
  pass over the reused KV, about what one decode step of a transformers
  ``DynamicCache`` pays to concatenate; in exchange a request owns its cache outright
  and no entry is ever written after insertion, which makes concurrent lookups safe.
  An inserted cache is taken over; tensors with room to grow (or rejected draft
  positions) behind them are copied to their exact size first.
* A least-recently-used list of whole sequences with subsumption, not a radix tree.
  A new entry drops every stored entry whose tokens are a prefix of its own (the new
  one answers every lookup they could answer, at least as long), so a growing
  conversation occupies ONE entry. A radix tree would also share the KV of common
  prefixes between branches, but ``DynamicCache`` needs contiguous per-layer tensors,
  so a lookup would concatenate blocks anyway; branching agent fleets pay the shared
  prefix once per live branch here, which the byte budget bounds.
* Prefix breaks. A conversation's new prompt should extend its previous prompt
  exactly. When the session's latest entry and the new prompt diverge BEFORE the end
  of that entry's prompt, history was rewritten (a template that drops earlier
  reasoning, an edited message): ``prefix_break_at`` reports the position. When they
  diverge inside the entry's generated reply, the reply as rendered back by the chat
  layer tokenizes differently from what was generated (retokenization, reformatted
  tool-call JSON, an edited reply): ``reply_mismatch_at`` reports that, a legitimate
  and expected divergence. Both need a session id; without one a divergence cannot
  be told apart from a branch.
* The KV is reached only through the runner's :class:`~hvd_agents.runtime.runner.RunnerKV`
  calls (``export_prefix``, ``import_prefix``, ``supports_reuse``), so any runner's cache
  can be kept. Only caches whose layers all hold full-length keys and values are reused;
  sliding-window or indexed layers cannot be rebuilt from a prefix of positions, so for
  such models the cache stays empty.

Example (``finished_cache`` a finished request's KV, ``kv`` a new request's empty one)::

    pc = PrefixCache(budget_bytes=1 << 30)
    pc.insert(finished_ids[:-1], finished_cache, prompt_len=n, session_id="s")
    match = pc.lookup(new_prompt[:-1], kv, session_id="s")
    match.length   # positions copied; prefill new_prompt[match.length:-1]
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hvd_agents.runtime.kv import LayerKV
from hvd_agents.runtime.runner import RunnerKV

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefixMatch:
    """What a lookup found.

    Attributes:
        length: positions whose KV was copied into the caller's cache (0 = none).
        prefix_break_at: position where the prompt first differs from the session's
            previous PROMPT (history was rewritten); None when it does not.
        reply_mismatch_at: position where the prompt first differs from the session's
            previous REPLY as generated (the reply rendered back tokenizes differently
            or was edited); None when it does not.
    """

    length: int = 0
    prefix_break_at: int | None = None
    reply_mismatch_at: int | None = None


@dataclass
class PrefixCacheStats:
    """Counters and memory figures of a :class:`PrefixCache` (a snapshot)."""

    budget_bytes: int = 0
    bytes: int = 0
    peak_bytes: int = 0
    entries: int = 0
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    inserted: int = 0
    subsumed: int = 0
    evicted: int = 0
    truncated: int = 0


@dataclass
class _Entry:
    """One finished request's KV (never written after insertion)."""

    token_ids: np.ndarray  # [n] int64, the tokens the KV covers
    layers: tuple[LayerKV, ...]
    prompt_len: int  # the first prompt_len tokens were the request's prompt
    session_id: str | None
    nbytes: int
    order: int  # insertion counter, to find a session's latest entry


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when it fills its storage, else a copy that does: an entry keeps no room to grow
    and no rejected draft positions alive."""
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
        return tensor.clone()
    return tensor


def _storage_bytes(layers: Sequence[LayerKV]) -> int:
    """Bytes of the storage the tensors keep alive (a cropped view keeps its whole base)."""
    return sum(t.untyped_storage().nbytes() for kv in layers for t in kv)


class PrefixCache:
    """Longest-prefix KV reuse across requests, LRU-bounded by bytes.

    Args:
        budget_bytes: the most bytes of KV storage kept; 0 or None disables the cache.

    Thread safety: all methods take an internal lock; stored tensors are never
    modified and lookups copy them, so requests on different threads cannot see
    each other's KV being written.
    """

    def __init__(self, budget_bytes: int | None) -> None:
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes or 0)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU order: oldest first
        self._order = itertools.count()
        self._stats = PrefixCacheStats(budget_bytes=self.budget_bytes)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def stats(self) -> PrefixCacheStats:
        """A snapshot of the counters and memory figures."""
        with self._lock:
            return PrefixCacheStats(**vars(self._stats))

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        with self._lock:
            self._entries.clear()
            self._stats.bytes = self._stats.entries = 0

    def lookup(self, token_ids: Sequence[int], cache: RunnerKV, *, session_id: str | None = None) -> PrefixMatch:
        """Copy the KV of the longest stored prefix of ``token_ids`` into ``cache``.

        Args:
            token_ids: the tokens the caller needs KV for (a new prompt minus its last token).
            cache: an EMPTY cache of the same model; filled with ``length`` positions.
            session_id: the request's conversation id, for prefix-break detection.

        Returns:
            The match: reused length and prefix-break information.

        Raises:
            ValueError: ``cache`` is not empty.
        """
        if cache.length != 0:
            raise ValueError("lookup needs an empty cache")
        if not self.enabled or not token_ids or not cache.supports_reuse:
            return PrefixMatch()
        query = np.asarray(token_ids, dtype=np.int64)
        with self._lock:
            self._stats.lookups += 1
            best_key, best_len = None, 0
            for key, entry in self._entries.items():
                length = common_prefix_length(query, entry.token_ids)
                if length > best_len:
                    best_key, best_len = key, length
            breaks = self._breaks(query, session_id)
            if best_key is None:
                return PrefixMatch(0, *breaks)
            self._entries.move_to_end(best_key)
            cache.import_prefix(self._entries[best_key].layers, best_len)  # copies into the new cache
            self._stats.hits += 1
            self._stats.reused_tokens += best_len
        return PrefixMatch(best_len, *breaks)

    def _breaks(self, query: np.ndarray, session_id: str | None) -> tuple[int | None, int | None]:
        """(prefix_break_at, reply_mismatch_at) against the session's latest entry."""
        if session_id is None:
            return None, None
        mine = [entry for entry in self._entries.values() if entry.session_id == session_id]
        if not mine:
            return None, None
        latest = max(mine, key=lambda entry: entry.order)
        length = common_prefix_length(query, latest.token_ids)
        if length >= len(query) or length >= len(latest.token_ids):
            return None, None  # the prompt extends the entry, or is a prefix of it
        if length < latest.prompt_len:
            logger.info("session %s: prompt rewrites its earlier history at token %d", session_id, length)
            return length, None
        return None, length

    def insert(
        self, token_ids: Sequence[int], cache: RunnerKV, *, prompt_len: int, session_id: str | None = None
    ) -> bool:
        """Keep a request's KV over ``token_ids``: a finished request's, or a prompt's once it is prefilled.

        Positions are copied unless a layer's tensor holds exactly them; the caller may keep
        using ``cache`` as long as it never rewrites positions ``[0, len(token_ids))`` (a
        request only appends after them, rolls back to them, or compacts later positions).

        Args:
            token_ids: the tokens the cache covers, in order (its first ``len(token_ids)``
                positions are kept; extra positions, e.g. verified past a stop, are dropped).
            cache: the request's cache, holding at least ``len(token_ids)`` positions.
            prompt_len: how many of ``token_ids`` were the request's prompt.
            session_id: the request's conversation id.

        Returns:
            True when an entry was stored.

        Raises:
            ValueError: the cache holds fewer positions than ``token_ids``.
        """
        n = len(token_ids)
        if not self.enabled or n == 0 or not cache.supports_reuse:
            return False
        ids = np.asarray(token_ids, dtype=np.int64)
        layers = tuple((_compact(keys), _compact(values)) for keys, values in cache.export_prefix(n))
        with self._lock:
            if self._covered(ids):
                return False
            layers, ids = self._fit(layers, ids)
            if len(ids) == 0:
                return False
            entry = _Entry(ids, layers, min(prompt_len, len(ids)), session_id, _storage_bytes(layers), next(self._order))
            self._drop_subsumed(ids)
            self._evict_until(self.budget_bytes - entry.nbytes)
            self._entries[entry.order] = entry
            self._stats.inserted += 1
            self._account()
        return True

    def _covered(self, ids: np.ndarray) -> bool:
        """True (and the covering entry marked used) when a stored entry already starts with ``ids``."""
        for key, entry in self._entries.items():
            if len(entry.token_ids) >= len(ids) and common_prefix_length(ids, entry.token_ids) == len(ids):
                self._entries.move_to_end(key)
                return True
        return False

    def _fit(self, layers: tuple[LayerKV, ...], ids: np.ndarray) -> tuple[tuple[LayerKV, ...], np.ndarray]:
        """The entry, cut to the longest prefix whose storage fits the budget."""
        nbytes = _storage_bytes(layers)
        if nbytes <= self.budget_bytes:
            return layers, ids
        per_token = sum(t.element_size() * t[..., :1, :].numel() for kv in layers for t in kv)
        keep = self.budget_bytes // per_token
        self._stats.truncated += 1
        logger.info("prefix cache: keeping %d of %d tokens to fit %d bytes", keep, len(ids), self.budget_bytes)
        # clone: a view of the first positions would keep the whole base storage alive
        cut = tuple((k[..., :keep, :].clone(), v[..., :keep, :].clone()) for k, v in layers)
        return cut, ids[:keep]

    def _drop_subsumed(self, ids: np.ndarray) -> None:
        """Remove entries whose tokens are a prefix of ``ids`` (the new entry answers for them)."""
        for key in [k for k, e in self._entries.items() if common_prefix_length(ids, e.token_ids) == len(e.token_ids)]:
            del self._entries[key]
            self._stats.subsumed += 1

    def _evict_until(self, limit: int) -> None:
        """Evict least recently used entries until the stored bytes are at most ``limit``."""
        total = sum(entry.nbytes for entry in self._entries.values())
        while self._entries and total > limit:
            _, entry = self._entries.popitem(last=False)
            total -= entry.nbytes
            self._stats.evicted += 1

    def _account(self) -> None:
        self._stats.bytes = sum(entry.nbytes for entry in self._entries.values())
        self._stats.entries = len(self._entries)
        self._stats.peak_bytes = max(self._stats.peak_bytes, self._stats.bytes)
