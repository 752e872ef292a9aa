"""Growing a cache draft into a tree of alternatives, and what a verified tree says about them.

Where the cache drafter's candidates disagree, the chosen cache draft (the *main
branch*, cut to its best length) grows into a tree: each alternative continuation
(:meth:`~hvd_agents.drafters.cache.suffix.SuffixDrafter.alternatives`) keeps
tokens while its own survival pays for them, the same rule as the main branch
(:mod:`hvd_agents.policy.selection`: a token is worth verifying iff its survival
exceeds ``R`` times what it adds to the cost).

With the main branch's survivals ``S_i`` (``S_{-1} = 1``) and hazards
``h_i = S_i / S_{i-1}``, an alternative that departs at depth ``j`` (it replaces
the main branch's token ``j``) survives its first token with::

    S_{j-1} * (1 - h_j) * a

(the target reaches depth ``j``, rejects the main token there, and this token is
its choice), where ``a`` is the rate at which verified alternatives were the
target's choice, learned online (:func:`tried_alternatives`). Its later tokens
survive with the main branch's hazards at the same depths. Accepted alternatives
and main tokens are disjoint events, so the tree's expected tokens are one plus
the sum of all its tokens' survivals.

Worked example: main branch ``S = [0.9, 0.45]`` (``h = [0.9, 0.5]``), ``a = 0.3``,
cost ``1 + 0.01 d`` at ``R = 2`` (a token pays iff its survival exceeds 0.02). An
alternative departing at depth 1 starts at ``0.9 * 0.5 * 0.3 = 0.135``: kept; its
next token, at depth 2 with the last hazard ``0.5``, ``0.0675``: kept too. The
tree verifies 4 tokens and expects ``1 + 0.9 + 0.45 + 0.135 + 0.0675`` of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from hvd_agents.drafters.base import Draft
from hvd_agents.drafters.cache.suffix import Alternative
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.selection import Choice


def grow_tree(
    draft: Draft,
    choice: Choice,
    alternatives: Sequence[Alternative],
    survival: np.ndarray,
    alternative_rate: float,
    cost: CostModel,
    rate: float,
    k: int,
) -> tuple[Choice, Draft]:
    """The cache draft (cut to ``choice.length``) with the alternatives' tokens that pay for themselves.

    Args:
        draft: the main branch, a chain of ``choice.length`` tokens.
        choice: its figures at the best length.
        alternatives: the other candidates' continuations, each departing at its ``depth``.
        survival: ``[n]``: the main branch's predicted survivals before it was cut.
        alternative_rate: ``a`` (see the module docstring).
        cost: the verification cost the step is priced with.
        rate: the running rate ``R``.
        k: the most tokens the tree may have.

    Returns:
        The tree's figures and the tree, or ``(choice, draft)`` when no alternative token pays.
    """
    main = len(draft)
    tokens, parents = list(draft.token_ids), list(range(-1, main - 1))
    expected = choice.expected_tokens
    reach = np.concatenate([[1.0], survival])  # [n + 1]: reach[j] = S_{j-1}
    hazard = np.divide(survival, reach[:-1], out=np.zeros_like(survival), where=reach[:-1] > 0)  # [n]
    for alternative in alternatives:
        depth = alternative.depth
        if depth > main or depth >= len(survival):
            continue
        alive = reach[depth] * (1.0 - hazard[depth]) * alternative_rate
        parent = depth - 1
        for offset, token in enumerate(alternative.tokens):
            if len(tokens) >= k:
                break
            if offset:
                alive *= hazard[min(depth + offset, len(hazard) - 1)]
            if alive <= rate * (cost.verify(len(tokens) + 1) - cost.verify(len(tokens))):
                break
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
            expected += alive
    if len(tokens) == main:
        return choice, draft
    step_cost = cost.verify(len(tokens))
    tree = Draft(tuple(tokens), None, draft.score, draft.source, draft.features, tuple(parents))
    return Choice(len(tokens), expected, step_cost, expected - rate * step_cost), tree


def tried_alternatives(draft: Draft, main: int, main_accepted: int, path: set[int]) -> Iterator[bool]:
    """For each alternative the target tried, whether it was the target's choice.

    An alternative is tried when it departs where the main branch was rejected
    (its first token's parent is the last accepted main token); it was the
    target's choice when its first token is on the accepted ``path``.

    Args:
        draft: the verified tree; its first ``main`` tokens are the main branch.
        main: the main branch's length.
        main_accepted: how many main-branch tokens the target accepted.
        path: the indices of the accepted tokens.
    """
    for node, parent in enumerate(draft.parents or ()):
        if node < main or parent >= main or parent != main_accepted - 1:
            continue  # not an alternative's first token, or not where the main branch was rejected
        yield node in path
