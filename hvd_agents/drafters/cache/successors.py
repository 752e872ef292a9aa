"""What followed a few n-grams in an index: one query's occurrences, read as counts or as followers.

:meth:`~hvd_agents.drafters.cache.ngram_index.NgramIndex.successor_table` finds,
once, the recent occurrences of each of a draft's n-grams that have a successor;
a :class:`SuccessorTable` holds them, so the cache drafter reads from one query
both the ``share`` / ``seen`` features of every draft position (:meth:`counts`)
and, at the positions where the draft forks, the other tokens that followed and
the text after them (:meth:`followers`, :meth:`continuation`).

Worked example::

    index = NgramIndex(); index.extend([1, 2, 3, 4, 9, 8, 1, 2, 3, 4, 7, 6, 1, 2, 3, 4])
    table = index.successor_table(np.array([[1, 2, 3, 4]]))
    table.counts(np.array([9]))   ->  (array([1]), array([2]))   # followed by 9 once, by any token twice
    table.followers([0])          ->  [{9: (1, 3), 7: (1, 9)}]   # each follower: how often, its latest end
    table.continuation(9, 2)      ->  [7, 6]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# ``followers`` marks each row by the token to leave out: these are no token (tokens are >= 0)
_NOT_ASKED = -2
_NONE_LEFT_OUT = -3


class SuccessorTable:
    """The occurrences of ``grams`` n-grams (rows) that have a successor, in row order and, within a row,
    in index order (the latest last).

    Args:
        grams: how many n-grams were asked about (the rows).
        rows: ``[c]`` each occurrence's row.
        ends: ``[c]`` each occurrence's last position in the index.
        following: ``[c]`` the token after it.
        read: ``read(end, k)``: up to ``k`` tokens after position ``end`` of the text the occurrences were
            found in (:meth:`~hvd_agents.drafters.cache.ngram_index.NgramIndex.continuation`).
    """

    def __init__(self, grams: int, rows: np.ndarray, ends: np.ndarray, following: np.ndarray,
                 read: Callable[[int, int], list[int]]) -> None:
        self.grams = grams
        self.rows = rows  # [c]
        self.ends = ends  # [c]
        self.following = following  # [c]
        self._read = read

    def counts(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[g]`` how often each row's n-gram was followed by its token of ``tokens`` (``[g]``), and ``[g]``
        how often by any token."""
        total = np.bincount(self.rows, minlength=self.grams)  # [g]
        same = np.bincount(self.rows[self.following == tokens[self.rows]], minlength=self.grams)  # [g]
        return same, total

    def followers(self, rows: Sequence[int], other_than: Sequence[int] | None = None) -> list[dict[int, tuple[int, int]]]:
        """For each of ``rows`` (distinct), the tokens that followed its n-gram (but its token of ``other_than``), in
        the order they first did: for each, how often, and where its latest occurrence ends (for
        :meth:`continuation`)."""
        asked = np.full(self.grams, _NOT_ASKED)  # [g]: each asked row's token to leave out (or none)
        asked[rows] = other_than if other_than is not None else _NONE_LEFT_OUT
        wanted = asked.take(self.rows)  # [c]
        read = (wanted != _NOT_ASKED) & (self.following != wanted)  # [c]
        out: list[dict[int, tuple[int, int]]] = [{} for _ in rows]
        slot = {row: i for i, row in enumerate(rows)}
        for row, end, token in zip(self.rows[read].tolist(), self.ends[read].tolist(), self.following[read].tolist()):
            followers = out[slot[row]]
            seen = followers.get(token)
            followers[token] = (seen[0] + 1 if seen else 1, end)  # occurrences in index order: the last is the latest
        return out

    def continuation(self, end: int, k: int) -> list[int]:
        """Up to ``k`` tokens after position ``end`` (a follower's latest occurrence), the follower first."""
        return self._read(end, k)
