"""The cost model of the target: what verifying a draft of ``d`` tokens costs, in target steps.

``CostModel.verify(d)`` is the cost of one verification forward over ``[last] +
d draft tokens``, in units of a plain decoding step (``verify(0) == 1``), as a
piecewise-linear curve through measured points (extrapolated linearly past the
last one). ``CostModel.linear(c)`` is the ``1 + c * d`` model that trace replays use.
``draft_cost`` is what producing a draft costs per step (cache drafting is a
dictionary lookup, about 0; a model drafter costs forwards of its own).

This module is the one home of "what a step costs": the curve, its units (plain decoding
steps), the fallback ``c`` (:data:`FALLBACK_VERIFY_COST`) every layer uses where nothing is
measured, and a request's share of a batched step (:func:`request_cost`). Every other module
only uses it: how a profile is measured on a machine, and where it is kept, is
:mod:`hvd_agents.runtime.profile`; how it is calibrated against the engine's timed steps,
:mod:`hvd_agents.policy.calibration`; how the ``hvd`` drafter turns it into one proposal's
prices (its model drafter's forwards added, decided once per proposal),
:mod:`hvd_agents.drafters.hybrid.pricing`.

Worked example: points ``[(0, 1.0), (8, 1.16), (16, 1.4)]`` give
``verify(4) = 1.08``, ``verify(12) = 1.28`` and ``verify(24) = 1.64``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

CURVE_CACHE = 257  # verify costs precomputed for drafts up to 256 tokens
# c of the linear model 1 + c d where no profile is measured (no model to time, a disturbed machine, a
# drafter built without one): the order of a small model's on a CPU at batch 1.
FALLBACK_VERIFY_COST = 0.02


@dataclass(frozen=True)
class CostModel:
    """Verification cost as a function of the number of draft tokens (see the module docstring).

    Attributes:
        points: ``(draft tokens, cost in target steps)`` pairs, sorted, starting at ``(0, 1.0)``.
        draft_cost: cost of producing a draft, in target steps (0 for cache drafts).
        source: where the figures came from (``"linear c=0.02"``, ``"measured ..."``).
    """

    points: tuple[tuple[int, float], ...]
    draft_cost: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 0:
            raise ValueError("a cost model needs a point at 0 draft tokens")
        lengths = [d for d, _ in self.points]
        if lengths != sorted(set(lengths)):
            raise ValueError(f"cost model points must have increasing lengths, got {lengths}")

    @classmethod
    def linear(cls, c: float) -> CostModel:
        """``verify(d) = 1 + c * d``."""
        if c < 0:
            raise ValueError(f"verify cost per token must be >= 0, got {c}")
        return cls(((0, 1.0), (1, 1.0 + c)), source=f"linear c={c:g}")

    @classmethod
    def fallback(cls) -> CostModel:
        """The linear model at :data:`FALLBACK_VERIFY_COST`, used where no profile is measured."""
        return cls.linear(FALLBACK_VERIFY_COST)

    def verify(self, draft_tokens: int) -> float:
        """Cost of a step verifying ``draft_tokens`` draft tokens in one forward (plus ``draft_cost`` if > 0)."""
        return float(self.verify_curve(draft_tokens + 1)[draft_tokens])

    def verify_curve(self, length: int) -> np.ndarray:
        """``[verify(0), ..., verify(length - 1)]`` (a read-only view; computed once up to ``CURVE_CACHE``)."""
        if length <= CURVE_CACHE:
            return self._curve[:length]
        return self._interpolate(length)

    @cached_property
    def _curve(self) -> np.ndarray:
        curve = self._interpolate(CURVE_CACHE)
        curve.flags.writeable = False
        return curve

    def _interpolate(self, length: int) -> np.ndarray:
        xs = np.array([d for d, _ in self.points], dtype=np.float64)
        ys = np.array([c for _, c in self.points], dtype=np.float64)
        d = np.arange(length, dtype=np.float64)
        curve = np.interp(d, xs, ys)
        if len(xs) >= 2:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            beyond = d > xs[-1]
            curve[beyond] = ys[-1] + slope * (d[beyond] - xs[-1])
        curve[1:] += self.draft_cost  # a step without a draft does not draft
        return curve

    def marginal(self, length: int) -> np.ndarray:
        """``[verify(i + 1) - verify(i) for i < length]``: what the i-th draft token adds."""
        return np.diff(self.verify_curve(length + 1))

    def cheapest(self, length: int) -> float:
        """The least any of the first ``length`` draft tokens adds (``min(marginal(length))``, ``length >= 1``):
        the floor under which no draft node pays; read at every step, so computed once per length."""
        known = self._cheapest.get(length)
        if known is None:
            known = self._cheapest[length] = float(self.marginal(length).min())
        return known

    @cached_property
    def _cheapest(self) -> dict[int, float]:
        return {}

    def with_drafting(self, per_token: float) -> CostModel:
        """This cost plus ``per_token`` target steps for each drafted token (a model drafter's forwards)."""
        points = tuple((d, c + per_token * d) for d, c in self.points)
        if len(points) == 1:
            points = (*points, (1, points[0][1] + per_token))
        return CostModel(points, self.draft_cost, f"{self.source} + draft {per_token:.3f}/token")

    def scaled(self, alpha: float) -> CostModel:
        """This cost with every draft's extra cost multiplied by ``alpha``: ``1 + alpha * (verify(d) - 1)``
        (see :mod:`hvd_agents.policy.calibration`)."""
        if alpha < 0:
            raise ValueError(f"a cost scale must be >= 0, got {alpha}")
        points = tuple((d, 1.0 + alpha * (c - 1.0)) for d, c in self.points)
        return CostModel(points, self.draft_cost, f"{self.source} x{alpha:.2f} in the engine")

    @property
    def plausible(self) -> bool:
        """Whether ``verify(d) <= 1 + d``: one forward over ``1 + d`` tokens can never cost more than
        ``1 + d`` single-token steps, so a profile that says otherwise was disturbed while measured."""
        return all(cost <= 1.0 + d + 1e-9 for d, cost in self.points)

    @property
    def per_token(self) -> float:
        """Mean marginal cost of a draft token over the measured range (``c`` of the linear model)."""
        (d0, c0), (d1, c1) = self.points[0], self.points[-1]
        return (c1 - c0) / (d1 - d0) if d1 > d0 else 0.0

    def to_dict(self) -> dict:
        return {"points": [list(p) for p in self.points], "draft_cost": self.draft_cost, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        points = tuple((int(d), float(c)) for d, c in data["points"])
        return cls(points, float(data.get("draft_cost", 0.0)), str(data.get("source", "")))


@functools.lru_cache(maxsize=256)  # one per (profile, batch size): its curve is then interpolated once, not per step
def request_cost(cost: CostModel, n: int, window: int = 32) -> tuple[CostModel, float]:
    """What draft tokens cost one request of a step of ``n``, in units of its share of the step; and the share.

    The step's cost over ``n`` root rows, ``cost.verify(n - 1)`` plain steps, is shared
    evenly: each request's share is ``verify(n - 1) / n``. Its ``d`` draft tokens add the
    step's cost over ``d`` more rows, ``verify(n - 1 + d) - verify(n - 1)``, which is
    ``(that) / share`` of its share. A drafter priced with this spends rows only where
    they pay at this batch size: about free on a GPU, close to a whole share each for 16
    requests on a 2-core CPU.

    >>> c, share = request_cost(CostModel.linear(0.25), 4)  # a step of 4 rows costs 1.75 steps
    >>> round(share, 4), round(c.verify(2), 4)  # 2 more rows: 0.5 / 0.4375
    (0.4375, 2.1429)
    """
    curve = cost.verify_curve(n + window)
    base = float(curve[n - 1])
    share = base / n
    points = tuple((d, 1.0 + (float(curve[n - 1 + d]) - base) / share) for d in range(window + 1))
    return CostModel(points, source=f"{cost.source}, a request's share of a step of {n}"), share
