"""Which sequence each row of a vLLM proposer call is, without request ids.

vLLM calls a custom proposer with the rows of its persistent batch: per row the
tokens sampled this step and the row's whole token buffer, but no request id, and
rows move when requests finish (the batch is condensed) or are not scheduled. So a
sequence is recognised by its content: a row whose context, before this step's
tokens, has the length a tracked sequence had at its last call and the same first
and last :data:`WINDOW` tokens is that sequence (the row it sat in is tried first).
Two rows whose contexts agree that far are, for drafting, the same sequence: they
would get the same draft from the same state; each tracked sequence is claimed by
one row per call, so such twins keep one state each.

A tracked sequence absent from a call (finished, preempted or not scheduled) is
released at that call, as vLLM's own suffix proposer releases requests that left the
batch; one that comes back later is tracked anew, its context so far taken as its
prompt.

Worked example: a sequence seen with 12 tokens and given a 3-token draft comes back
at 14 tokens with 2 sampled tokens (one draft token accepted, then the target's
own): 14 - 2 = 12 and the windows agree, so it is the same sequence, wherever
its row now is.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hvd_agents.drafters.base import Draft

WINDOW = 16  # tokens compared at each end of a context: enough to tell agent turns apart, cheap per row


@dataclass
class Tracked:
    """One sequence between proposer calls.

    Attributes:
        seq_id: the id its drafter state is kept under (``vllm-<n>``).
        length: its context length at its last call (what the next call's row, less
            the tokens sampled then, must have).
        head: its first tokens at its last call (up to :data:`WINDOW`).
        tail: its last tokens at its last call (up to :data:`WINDOW`).
        row: the row it was in at its last call.
        prompt_len: its context length when it was first seen, less that call's sampled tokens: its prompt.
        draft: the draft proposed for it at its last call (empty: none).
    """

    seq_id: str
    length: int
    head: tuple[int, ...]
    tail: tuple[int, ...]
    row: int
    prompt_len: int
    draft: Draft = field(default_factory=Draft)


@dataclass(frozen=True)
class RowMatch:
    """A row of the call and the sequence it is.

    Attributes:
        row: the row.
        tracked: the sequence's state (updated by :meth:`SequenceTable.settle`).
        new: True when the row starts a sequence (its context before this step is its prompt).
    """

    row: int
    tracked: Tracked
    new: bool


@dataclass
class SequenceTable:
    """The sequences of the rows of successive proposer calls (see the module docstring)."""

    sequences: dict[str, Tracked] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    def match(self, rows: Sequence[tuple[int, np.ndarray, int]]) -> tuple[list[RowMatch], list[Tracked]]:
        """Match the call's rows to tracked sequences.

        Args:
            rows: ``(row, tokens, sampled)`` for each row that sampled tokens this step: ``tokens`` its
                context (1-D, every token so far, this step's included), ``sampled`` how many of them
                this step added.

        Returns:
            The matches, in the order of ``rows``, and the tracked sequences no row matched (released:
            the caller stops their drafter state).
        """
        by_key: dict[tuple[int, tuple[int, ...], tuple[int, ...]], list[Tracked]] = {}
        for tracked in self.sequences.values():
            by_key.setdefault((tracked.length, tracked.head, tracked.tail), []).append(tracked)
        matches: list[RowMatch] = []
        claimed: set[str] = set()
        for row, tokens, sampled in rows:
            before = len(tokens) - sampled
            key = (before, _head(tokens, before), _tail(tokens, before))
            candidates = [t for t in by_key.get(key, ()) if t.seq_id not in claimed]
            if candidates:
                tracked = min(candidates, key=lambda t: t.row != row)  # the row it sat in first
                claimed.add(tracked.seq_id)
                matches.append(RowMatch(row, tracked, new=False))
                continue
            tracked = Tracked(f"vllm-{next(self._ids)}", before, key[1], key[2], row, prompt_len=before)
            claimed.add(tracked.seq_id)
            matches.append(RowMatch(row, tracked, new=True))
        released = [t for t in self.sequences.values() if t.seq_id not in claimed]
        self.sequences = {m.tracked.seq_id: m.tracked for m in matches}
        return matches, released

    @staticmethod
    def settle(match: RowMatch, tokens: np.ndarray, draft: Draft) -> None:
        """Record where the sequence stands after this call: its context and the draft it was given."""
        tracked = match.tracked
        tracked.length = len(tokens)
        tracked.head = _head(tokens, len(tokens))
        tracked.tail = _tail(tokens, len(tokens))
        tracked.row = match.row
        tracked.draft = draft


def _head(tokens: np.ndarray, end: int) -> tuple[int, ...]:
    return tuple(int(t) for t in tokens[: min(WINDOW, end)])


def _tail(tokens: np.ndarray, end: int) -> tuple[int, ...]:
    return tuple(int(t) for t in tokens[max(0, end - WINDOW) : end])
