"""Prompt-lookup (n-gram) drafting: HuggingFace's algorithm, as a Drafter.

For n from ``max_ngram`` down to 1, find the EARLIEST position where the last n
tokens of the context occurred before, and propose the (up to ``k``) tokens that
followed that occurrence. This is exactly ``PromptLookupCandidateGenerator`` in
transformers (``prompt_lookup_num_tokens=k``, ``max_matching_ngram_size``), so the
engine with this drafter is the like-for-like peer of ``generate(prompt_lookup_num_tokens=...)``.

Worked example (``max_ngram=2``)::

    context = [5, 6, 7, 8, 9, 5, 6]
    last 2-gram (5, 6) first occurs at 0 -> propose [7, 8, 9, 5, 6][:k]

The drafter keeps its own growing copy of each request's tokens (numpy), extended
by ``observe``, so a proposal costs one vectorised scan of the context.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hvd_agents.drafters.base import Draft, DraftContext, DraftOutcome, started
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.features import PromptLookupFeatures
from hvd_agents.structure import PromptStructure


class _TokenBuffer:
    """An append-only int64 array with amortised O(1) appends."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self._data = np.empty(max(64, 2 * len(tokens)), dtype=np.int64)
        self._len = 0
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        need = self._len + len(tokens)
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=np.int64)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len : need] = tokens
        self._len = need

    @property
    def view(self) -> np.ndarray:
        return self._data[: self._len]


class PromptLookupDrafter:
    """Fixed-K n-gram prompt lookup (HF's algorithm).

    Args:
        max_ngram: longest n-gram to match (HF's ``max_matching_ngram_size``, default 2).
    """

    source = "pld"

    def __init__(self, max_ngram: int = 2) -> None:
        if max_ngram < 1:
            raise InvalidRequestError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self._requests: dict[str, _TokenBuffer] = {}

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        del structure  # prompt lookup ignores structure
        self._requests[req_id] = _TokenBuffer(prompt_ids)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        buf = started(self._requests, ctx.req_id, self.source, "propose")
        if k <= 0:
            return Draft()
        ids = buf.view
        length = len(ids)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            windows = sliding_window_view(ids, n)  # [length - n + 1, n]
            hits = np.flatnonzero((windows == ids[length - n :]).all(axis=1))
            for idx in hits:
                start = int(idx) + n
                end = min(start + k, length)
                if start < end:
                    tokens = tuple(int(t) for t in ids[start:end])
                    return Draft(tokens, score=float(n), source=self.source, features=PromptLookupFeatures(n))
        return Draft()

    def observe(self, outcome: DraftOutcome) -> None:
        started(self._requests, outcome.req_id, self.source, "observe").extend(outcome.new_token_ids)

    def stop(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
