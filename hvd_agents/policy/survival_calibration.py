"""The predictor's survivals as the target's outcomes bear them out: a monotone recalibration learned online.

The payoff predictor (:mod:`hvd_agents.policy.payoff`) is fitted on other models' agent traces and adapts
only its intercepts, per session. Where it is overconfident (a copied tool call it gives ``S = 0.9``
over 30 tokens, which the target rejects at the first), every wasted token is verified at the
machine's price; on a CPU where a verified row costs a quarter of a plain step, a few such drafts
cost more than all the accepted ones save.

:class:`SurvivalCalibration` maps a predicted survival ``S`` to the frequency with which drafts
given that survival were accepted that far: every verified main-branch position ``i`` of a cache
draft is one observation ``(S_i, accepted > i)``. Observations fall into :data:`BINS` equal bins of
``S``, each starting from :data:`PRIOR_WEIGHT` pseudo-observations on the identity (the predictor
as trained), with exponential forgetting (:data:`FORGET` per observation). The map is the
weighted isotonic (pool-adjacent-violators) fit of the bins' observed frequencies against their
mean predictions, interpolated linearly between them (and through ``(0, 0)``): non-decreasing in
``S``, so a calibrated survival still never rises along a draft.

Outcomes only, never timings or drawn tokens: sampled requests stay exact.

Worked example: after many drafts given ``S ~ 0.9`` of which a half were accepted that far, and
drafts given ``S ~ 0.5`` accepted as predicted, ``S = 0.9`` maps to about 0.5: a 0.25-per-token
verification at ``R = 1.5`` no longer pays for those positions (0.5 < 1.5 * 0.25 + ...), and the
draft is cut where the target's history says it stops.
"""

from __future__ import annotations

import numpy as np

BINS = 10
PRIOR_WEIGHT = 4.0  # pseudo-observations per bin on the identity
FORGET = 0.998  # weight kept by earlier observations at each new one


class SurvivalCalibration:
    """A monotone map of predicted survivals, learned from verified drafts (see the module docstring)."""

    def __init__(self) -> None:
        centers = (np.arange(BINS) + 0.5) / BINS
        self._weight = np.full(BINS, PRIOR_WEIGHT)  # [B]
        self._predicted = centers * PRIOR_WEIGHT  # [B]: weighted sum of the predictions in each bin
        self._accepted = centers * PRIOR_WEIGHT  # [B]: weighted count of the positions accepted
        self._map: tuple[np.ndarray, np.ndarray] | None = None

    def apply(self, survival: np.ndarray) -> np.ndarray:
        """``survival`` (``[n]``, non-increasing) mapped through the calibration (non-increasing too)."""
        if len(survival) == 0:
            return survival
        xs, ys = self._fitted()
        return np.interp(survival, xs, ys)

    def observe(self, survival: np.ndarray, accepted: int) -> None:
        """Fold in a verified draft: ``survival`` ``[n]`` of its ``n`` verified positions as predicted (before
        calibration), ``accepted`` of which the target accepted."""
        n = len(survival)
        if n == 0:
            return
        decay = FORGET**n
        # a draft's few positions are folded in one by one on lists: NumPy's overhead would outweigh the work
        weight, predicted, hits = ((sums * decay).tolist() for sums in (self._weight, self._predicted, self._accepted))
        for i, alive in enumerate(np.asarray(survival, dtype=np.float64).tolist()):
            bin_ = max(min(int(alive * BINS), BINS - 1), 0)
            weight[bin_] += 1.0
            predicted[bin_] += alive
            hits[bin_] += 1.0 if i < accepted else 0.0
        self._weight, self._predicted, self._accepted = np.array(weight), np.array(predicted), np.array(hits)
        self._map = None

    def _fitted(self) -> tuple[np.ndarray, np.ndarray]:
        if self._map is None:
            x = self._predicted / self._weight
            y = _isotonic(self._accepted / self._weight, self._weight)
            self._map = (np.concatenate(([0.0], x)), np.concatenate(([0.0], y)))
        return self._map


def _isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values.tolist(), weights.tolist()):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    return np.array([mean for mean, _, count in blocks for _ in range(count)])
