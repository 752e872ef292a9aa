"""An append-only token index that finds the longest earlier match of a suffix.

Used twice by the cache drafter: over one request's live context (prompt + output,
updated token by token) and over the cross-request store (spans appended in bulk,
separated so no match crosses a span boundary).

How it works: every position ``p`` is indexed under hashes of the n-grams that END
at ``p`` for ``n`` in :data:`NGRAM_SIZES`, each hash's positions kept as a machine-integer
array (``array('q')``: a query reads thousands of them into NumPy at once, which a
list of Python ints would make element by element). A lookup takes the largest n whose hash
of the query's last n tokens has entries, then extends each candidate's match
backwards token by token (vectorised, capped at ``max_match``), comparing real
tokens, so hash collisions cannot produce a false match. Updates cost O(len(NGRAM_SIZES))
per token; a lookup looks at a bounded number of candidates (the most recent ones
plus the earliest ones, since a name's first occurrence, e.g. in a tool schema, is
often the best source).

Worked example::

    index = NgramIndex(); index.extend([5, 6, 7, 8, 5, 6])
    index.lookup([9, 5, 6], max_match=8)  ->  [Match(end=1, length=2)]   # 5, 6 at 0..1
    index.continuation(1, 3)              ->  [7, 8, 5]
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hvd_agents.drafters.cache.successors import SuccessorTable

NGRAM_SIZES: tuple[int, ...] = (4, 2, 1)  # lookup order: longest first
SUCCESSOR_LIMIT = 64  # most recent occurrences of an n-gram read by successor_counts
SEPARATOR = -1  # never matches a real token; marks span boundaries and evicted tokens
_MASK = (1 << 64) - 1
_PRIME = 1_000_003
_DEPTHS = np.arange(65)  # offsets back from a candidate's end (longer queries make their own)
_UNMATCHED = -3  # a query "token" past the query's start: equal to no indexed one (tokens >= 0, separators -1)
_LONGEST = max(NGRAM_SIZES)
_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.setflags(write=False)
_BACK = {n: np.arange(1 - n, 1) for n in NGRAM_SIZES}  # an n-gram's positions from its end
# the bytes of n true booleans read as one unsigned integer (n of 1, 2, 4 or 8)
_ROW_OF_TRUE = {n: np.dtype(f"u{n}").type(int.from_bytes(b"\x01" * n, "little")) for n in NGRAM_SIZES}


def ngram_key(tokens: Sequence[int]) -> int:
    """Polynomial hash of a token n-gram, mod 2**64 (equal to :func:`_bulk_keys`)."""
    h = 0
    for t in tokens:
        h = (h * _PRIME + int(t) + 2) & _MASK
    return h


def _bulk_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """``ngram_key`` of the n-gram ending at each position ``>= n - 1`` of ``tokens``."""
    values = tokens.astype(np.uint64) + np.uint64(2)
    length = len(tokens) - n + 1
    h = np.zeros(length, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            h = h * np.uint64(_PRIME) + values[i : i + length]
    return h


def gram_keys(grams: Sequence[Sequence[int]]) -> list[int]:
    """:func:`ngram_key` of each of ``grams`` (one length; ``[g, n]``), in one vectorized pass."""
    if len(grams) == 0:
        return []
    values = np.asarray(grams, dtype=np.int64).astype(np.uint64) + np.uint64(2)  # [g, n]
    h = np.zeros(len(values), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in values.T:
            h = h * np.uint64(_PRIME) + column
    return h.tolist()


def _add_hit(table: dict[int, array], key: int, end: int) -> None:
    """Index position ``end`` under ``key``."""
    hits = table.get(key)
    if hits is None:
        table[key] = array("q", (end,))
    else:
        hits.append(end)


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of the query's suffix: tokens ``[end - length + 1, end]``."""

    end: int
    length: int


class NgramIndex:
    """Longest-suffix-match index over an append-only token array.

    Args:
        recent: how many of the most recent occurrences of an n-gram are examined.
        earliest: how many of the earliest occurrences are examined as well.
    """

    def __init__(self, recent: int = 24, earliest: int = 4) -> None:
        self.recent = recent
        self.earliest = earliest
        self._tokens = np.full(1024, SEPARATOR, dtype=np.int64)
        self._len = 0
        self._maps: dict[int, dict[int, array]] = {n: {} for n in NGRAM_SIZES}  # n -> key -> ends, ascending

    def __len__(self) -> int:
        return self._len

    @property
    def tokens(self) -> np.ndarray:
        """The indexed tokens (a view; separators are -1)."""
        return self._tokens[: self._len]

    def _grow(self, need: int) -> None:
        if need > len(self._tokens):
            grown = np.full(max(need, 2 * len(self._tokens)), SEPARATOR, dtype=np.int64)
            grown[: self._len] = self._tokens[: self._len]
            self._tokens = grown

    def append(self, token: int) -> None:
        """Index one more token (O(1))."""
        self.append_many((token,))

    def append_many(self, tokens: Sequence[int]) -> None:
        """Index more tokens, as :meth:`append` of each in turn: the n-grams that end in them are indexed,
        those that begin before them included (unlike :meth:`extend`, which keeps a span to itself)."""
        start = self._len
        count = len(tokens)
        self._grow(start + count)
        self._tokens[start : start + count] = tokens
        self._len += count
        # the new tokens and the few before them that their n-grams reach back to, as the hash reads them
        # (None: a separator, which no n-gram spans)
        first = max(start - _LONGEST + 1, 0)
        values = [token + 2 if token != SEPARATOR else None for token in self._tokens[first : start + count].tolist()]
        for n, table in self._maps.items():
            for end in range(max(start, n - 1), start + count):
                key = 0
                for value in values[end - n + 1 - first : end + 1 - first]:
                    if value is None:
                        break
                    key = key * _PRIME + value  # ngram_key's, reduced mod 2**64 once at the end (the same hash)
                else:
                    _add_hit(table, key & _MASK, end)

    def extend(self, tokens: Sequence[int], separate: bool = False) -> int:
        """Index many tokens at once; returns the position of the first one.

        Args:
            tokens: the tokens.
            separate: put a separator after them, so no match runs past their end.
        """
        arr = np.asarray(tokens, dtype=np.int64)
        start = self._len
        self._grow(start + len(arr) + 1)
        self._tokens[start : start + len(arr)] = arr
        self._len += len(arr)
        for n, table in self._maps.items():
            if len(arr) < n:
                continue
            keys = _bulk_keys(arr, n).tolist()
            for offset, key in enumerate(keys, start=start + n - 1):
                _add_hit(table, key, offset)
        if separate:
            self._len += 1  # the slot already holds SEPARATOR
        return start

    def erase(self, start: int, end: int) -> None:
        """Make tokens ``[start, end)`` unmatchable (their index entries go stale)."""
        self._tokens[start:end] = SEPARATOR

    def agreement(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` equal the indexed tokens at the same positions."""
        n = min(len(tokens), self._len)
        if n == 0:
            return 0
        differ = np.flatnonzero(self._tokens[:n] != np.asarray(tokens[:n], dtype=np.int64))
        return int(differ[0]) if len(differ) else n

    def truncate(self, length: int) -> None:
        """Forget every token from position ``length`` on, as if only the first ``length`` had been indexed: the
        entries of the n-grams ending there are removed (each hash keeps its positions in ascending order, so
        they are its last ones). Costs a few hash computations per forgotten token."""
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot truncate an index of {self._len} tokens to {length}")
        window_start = max(length - _LONGEST + 1, 0)
        window = self._tokens[window_start : self._len].tolist()
        for n, table in self._maps.items():
            for end in range(max(length, n - 1), self._len):
                gram = window[end - n + 1 - window_start : end + 1 - window_start]
                if SEPARATOR in gram:
                    continue
                key = ngram_key(gram)
                hits = table.get(key)
                while hits and hits[-1] >= length:
                    hits.pop()
                if hits is not None and not hits:
                    del table[key]
        self._tokens[length : self._len] = SEPARATOR
        self._len = length

    def lookup(self, query: Sequence[int], max_match: int = 64, exclude_end: int | None = None,
               limit: int | None = None) -> list[Match]:
        """Earlier occurrences of the longest suffix of ``query`` found in the index.

        Args:
            query: the context whose suffix is searched (only its last ``max_match``
                tokens are read).
            max_match: cap on the reported match length.
            exclude_end: a position never to report (the query's own end when the
                query is the indexed text itself).
            limit: most matches reported (the most recent ones; None: all), so that a caller
                that reads only the first few pays for no others.

        Returns:
            Matches of the greatest length found, most recent first; empty if no
            token of the suffix occurs.
        """
        tail = query[-max_match:]
        for n in NGRAM_SIZES:
            if len(tail) < n:
                continue
            hits = self._maps[n].get(ngram_key(tail[-n:]))
            if not hits:
                continue
            hits = self._candidates(hits, exclude_end)
            if not hits:
                continue
            reversed_tail = np.array([*tail[::-1], _UNMATCHED], dtype=np.int64)  # [m + 1]
            lengths = self._match_lengths(hits, reversed_tail).tolist()  # [c]
            best = max(lengths)
            if best == 0:
                continue
            latest = [i for i in range(len(hits) - 1, -1, -1) if lengths[i] == best]  # latest first
            return [Match(hits[i], best) for i in (latest if limit is None else latest[:limit])]
        return []

    def _candidates(self, hits: Sequence[int], exclude_end: int | None) -> Sequence[int]:
        if len(hits) > self.recent + self.earliest:
            hits = hits[: self.earliest] + hits[-self.recent :]
        if exclude_end is not None and exclude_end in hits:
            hits = [end for end in hits if end != exclude_end]
        return hits

    def _match_lengths(self, hits: Sequence[int], reversed_tail: np.ndarray) -> np.ndarray:
        """``[c]``: how many tokens before and at each of ``hits`` (ascending) equal the end of the query
        (``reversed_tail``: its last tokens, latest first, then one :data:`_UNMATCHED`, so that every row
        has a first mismatch and its index is the match length)."""
        ends = np.array(hits, dtype=np.int64)  # [c]
        m = len(reversed_tail)
        depth = _DEPTHS[:m] if m <= len(_DEPTHS) else np.arange(m)  # [m]
        if hits[0] >= m - 2:  # every window of real tokens lies in the index (the common case)
            differ = self._tokens.take(ends[:, None] - depth, mode="clip") != reversed_tail  # [c, m]
        else:
            positions = ends[:, None] - depth  # [c, m]
            differ = (positions < 0) | (self._tokens.take(np.maximum(positions, 0)) != reversed_tail)  # [c, m]
        return differ.argmax(axis=1)  # [c]: the first mismatch

    def successor_counts(self, gram: Sequence[int], token: int, limit: int = SUCCESSOR_LIMIT) -> tuple[int, int]:
        """How often the ``len(gram)``-gram ``gram`` (``len(gram)`` in :data:`NGRAM_SIZES`) was followed by
        ``token``, and how often by any token, over its ``limit`` most recent occurrences.

        An occurrence at the end of the index (no successor yet) or before a separator does not count.

        Example::

            index = NgramIndex(); index.extend([1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 1, 2, 3, 4])
            index.successor_counts([1, 2, 3, 4], 9)  ->  (1, 2)   # followed by 9 once, by 7 once
        """
        same, total = self.successor_counts_many([gram], [token], limit)
        return int(same[0]), int(total[0])

    def successor_counts_many(
        self, grams: Sequence[Sequence[int]], tokens: Sequence[int], limit: int = SUCCESSOR_LIMIT,
        keys: Sequence[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`successor_counts` of each ``(gram, token)`` pair, in one pass (``grams`` of one length ``n``;
        ``keys``: their :func:`gram_keys`, when known).

        Returns:
            ``[g]`` how often each gram was followed by its token, ``[g]`` how often by any token.
        """
        return self.successor_table(grams, limit, keys).counts(np.asarray(tokens, dtype=np.int64))

    def successors(
        self, grams: Sequence[Sequence[int]], k: int, limit: int = SUCCESSOR_LIMIT, keys: Sequence[int] | None = None
    ) -> list[dict[int, tuple[int, list[int]]]]:
        """For each of ``grams`` (one length ``n`` in :data:`NGRAM_SIZES`; ``keys``: their :func:`gram_keys`, when
        known), the tokens that followed it over its ``limit`` most recent occurrences: for each token, how
        often, and up to ``k`` tokens from its most recent occurrence on (the token first).

        Example::

            index = NgramIndex(); index.extend([1, 2, 3, 4, 9, 8, 1, 2, 3, 4, 7, 6, 1, 2, 3, 4])
            index.successors([[1, 2, 3, 4]], 2)  ->  [{9: (1, [9, 8]), 7: (1, [7, 6])}]
        """
        table = self.successor_table(grams, limit, keys)
        return [{token: (count, table.continuation(end, k)) for token, (count, end) in followers.items()}
                for followers in table.followers(range(len(grams)))]

    def successor_table(
        self, grams: Sequence[Sequence[int]] | np.ndarray, limit: int = SUCCESSOR_LIMIT,
        keys: Sequence[int] | None = None, read: Callable[[int, int], list[int]] | None = None,
    ) -> SuccessorTable:
        """The ``limit`` most recent occurrences of each of ``grams`` (one length ``n`` in :data:`NGRAM_SIZES`,
        ``[g, n]``; ``keys``: their :func:`gram_keys`, when known) that have a successor, hash collisions,
        erased text and separators left out: what :meth:`successor_counts_many` and :meth:`successors` read.

        Args:
            read: how the table reads text after an occurrence; :meth:`continuation` when None.
        """
        read = read if read is not None else self.continuation
        g = len(grams)
        table = self._maps.get(len(grams[0])) if g else None
        if table is None:
            return SuccessorTable(g, _EMPTY, _EMPTY, _EMPTY, read)
        ends = array("q")  # [c]
        sizes: list[int] = []
        last = self._len - 1  # an occurrence ending here has no successor yet
        for key in keys if keys is not None else gram_keys(grams):
            hits = table.get(key)
            if hits:
                size = len(hits)
                start = size - limit if size > limit else 0
                stop = size - 1 if hits[-1] == last else size  # positions are indexed in order: only the latest
                ends += hits[start:stop]
                sizes.append(stop - start)
            else:
                sizes.append(0)
        if not ends:
            return SuccessorTable(g, _EMPTY, _EMPTY, _EMPTY, read)
        gram_arr = np.asarray(grams, dtype=np.int64)  # [g, n]
        n = gram_arr.shape[1]
        end_arr = np.frombuffer(ends, dtype=np.int64)  # [c], read-only: a view of ends
        row_arr = np.repeat(np.arange(g), sizes)  # [c]
        # each occurrence's n tokens (an n-gram's entries end at n - 1 or later) against its gram's: the bytes of a
        # row of n booleans read as one integer tell whether all are true
        equal = self._tokens.take(end_arr[:, None] + _BACK[n]) == gram_arr.take(row_arr, axis=0)  # [c, n]
        real = equal.view(_ROW_OF_TRUE[n].dtype)[:, 0] == _ROW_OF_TRUE[n]  # [c]: not a collision or erased text
        following = self._tokens.take(end_arr + 1)  # [c]
        counted = real & (following != SEPARATOR)  # [c]
        return SuccessorTable(g, row_arr[counted], end_arr[counted], following[counted], read)

    def continuation(self, end: int, k: int) -> list[int]:
        """Up to ``k`` tokens after position ``end``, stopping at a separator."""
        window = self._tokens[end + 1 : min(end + 1 + k, self._len)].tolist()
        if SEPARATOR in window:
            window = window[: window.index(SEPARATOR)]
        return window
