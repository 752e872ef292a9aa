"""Choosing what to verify: the draft and its length with the best expected payoff per unit of cost.

The goal is the long-run rate ``R`` = tokens emitted per unit of target cost. By
the ratio-maximisation argument (Dinkelbach), a step maximises the long-run rate
when it maximises ``E[tokens] - R * cost``. A draft cut to ``L`` tokens emits
``1 + S_0 + ... + S_{L-1}`` tokens in expectation (``S_i``: survival, see
:mod:`hvd_agents.policy.payoff`) and costs ``verify(L) + draft_cost``, so its
value is::

    value(L) = 1 + sum_{i < L} S_i - R * (verify(L) + draft_cost)

and token ``i`` is worth verifying iff ``S_i > R * (verify(i + 1) - verify(i))``:
because ``S`` decreases, the best ``L`` is where that stops holding. ``R`` is
not known in advance; :class:`RateEstimate` tracks it from the realised steps
(tokens per cost), starting at 1 (plain decoding).

Worked example (linear cost ``c = 0.1``, ``R = 2``): ``S = [0.9, 0.5, 0.15]``
keeps tokens while ``S_i > 0.2``: ``L = 2``, value ``1 + 1.4 - 2 * 1.2 = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hvd_agents.policy.cost import CostModel

RATE_EMA = 0.1  # weight of the newest step in the running rate


@dataclass(frozen=True)
class Choice:
    """A candidate draft cut to ``length`` tokens and its expected figures."""

    length: int
    expected_tokens: float  # 1 + expected accepted
    cost: float
    value: float


def best_length(survival: np.ndarray, cost: CostModel, rate: float) -> Choice:
    """The length ``L`` (0..len(survival)) maximising ``value(L)`` for a draft with this survival."""
    n = len(survival)
    curve = cost.verify_curve(n + 1)  # [n + 1]: step cost at each length, drafting included
    tokens = np.empty(n + 1)  # [n + 1]: expected tokens at each length
    tokens[0] = 1.0
    np.cumsum(survival, out=tokens[1:])
    tokens[1:] += 1.0
    values = tokens - rate * curve  # value(L) for L = 0..n
    length = int(np.argmax(values))
    return Choice(length, float(tokens[length]), float(curve[length]), float(values[length]))


def no_draft(cost: CostModel, rate: float) -> Choice:
    """Plain decoding: one token for one step (``cost.verify(0) == 1``)."""
    return Choice(0, 1.0, 1.0, 1.0 - rate)


@dataclass
class RateEstimate:
    """Running estimate of tokens per unit cost (starts at plain decoding's 1)."""

    rate: float = 1.0

    def observe(self, tokens: int, cost: float) -> None:
        """Fold in one verification step that emitted ``tokens`` for ``cost``."""
        if cost > 0:
            self.rate += RATE_EMA * (tokens / cost - self.rate)
