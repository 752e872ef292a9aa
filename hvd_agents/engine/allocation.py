"""How one batched step's verification is shared among its requests: which draft tokens it verifies.

Every request verifies at least its last token (its root row). A draft token's worth is its
expected acceptance, estimated before verification: the drafter's own figure
(``Draft.survival``, the payoff predictor's) where it gives one, else ``rate ** position`` at
the request's acceptance rate so far. The step takes tokens best first, and, with the runner's
measured cost of a forward over ``n`` rows, keeps the number of them that gives the most
expected tokens per unit of the step's cost (:func:`allocate`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hvd_agents.drafters import Draft
from hvd_agents.policy.cost import CostModel


def allocate(drafts: Sequence[Draft], rates: Sequence[float], max_rows: int, cost: CostModel | None = None,
             keep_whole: Sequence[bool] | None = None) -> list[Draft]:
    """Cut ``drafts`` to the rows one batched step verifies best.

    Every request keeps its root row. A draft token's worth is its expected acceptance:
    the drafter's own estimate (``Draft.survival``, the payoff predictor's figure) where it
    gives one, else ``rate ** position`` at the request's acceptance so far; a draft keeps a
    prefix (its later tokens are worth less). Tokens are taken best first, ties to the
    earlier request, at most ``max_rows`` rows in all; with a ``cost`` model of the step
    (its cost over all rows, in plain steps) the step keeps the number of them that gives
    the most expected tokens per unit of cost, so a token is verified only where it pays
    for the rows it adds. Drafts marked ``keep_whole`` (a sampled request's: its random
    numbers follow its drafts, which must not depend on its company) are kept as they are.
    A tree that must be cut keeps its main branch.

    >>> a, b = Draft((1, 2, 3)), Draft((4, 5))
    >>> [len(d) for d in allocate([a, b], [0.6, 0.5], 5)]  # 3 rows for drafts: 0.6, 0.5, 0.36
    [2, 1]
    >>> flat, steep = CostModel.linear(0.0), CostModel.linear(1.0)  # rows free / each row a whole step
    >>> [len(d) for d in allocate([a, b], [0.6, 0.5], 64, flat)], [len(d) for d in allocate([a, b], [0.6, 0.5], 64, steep)]
    ([3, 2], [0, 0])
    """
    whole = list(keep_whole) if keep_whole is not None else [False] * len(drafts)
    fixed = sum(len(d) for d, w in zip(drafts, whole) if w)
    room = max_rows - len(drafts) - fixed
    scored = []
    for i, d in enumerate(drafts):
        if whole[i]:
            continue
        worth = 1.0
        for j in range(len(d)):
            estimate = d.survival[j] if d.survival is not None and j < len(d.survival) else rates[i] ** (j + 1)
            worth = min(worth, max(0.0, float(estimate)))  # a prefix is worth at least what follows it
            scored.append((worth, -i, i))
    ranked = sorted(scored, reverse=True)[: max(0, room)]
    take = len(ranked)
    if cost is not None and ranked:
        base_rows = len(drafts) + fixed
        base = len(drafts) + sum(_expected(d, rates[i]) for i, d in enumerate(drafts) if whole[i])
        curve = cost.verify_curve(base_rows + len(ranked))
        gains = np.concatenate([[0.0], np.cumsum([w for w, _, _ in ranked])])
        rows = np.arange(len(ranked) + 1) + base_rows
        value = (base + gains) / curve[rows - 1]
        take = int(np.argmax(value))  # the first of equal values: fewer rows
    keep = [0] * len(drafts)
    for _, _, i in ranked[:take]:
        keep[i] += 1
    out = []
    for d, n, w in zip(drafts, keep, whole):
        if w or n >= len(d):
            out.append(d)
            continue
        if d.is_tree:
            d = d.main_branch()
        out.append(d.truncated(n))
    return out


def _expected(draft: Draft, rate: float) -> float:
    """Expected accepted tokens of a draft kept whole (main branch; by its survival, else ``rate ** position``)."""
    if draft.survival is not None:
        return float(sum(draft.survival))
    return float(sum(rate ** (j + 1) for j in range(draft.main_length)))
