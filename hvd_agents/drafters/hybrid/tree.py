"""The cache draft as a tree over the cache drafter's candidates, and what a verified tree teaches.

Where the cache drafter's candidates disagree (an earlier tool call went on one
way, another the other way), one path through them is a bet on one of them. The
step instead verifies a *tree*: the proposed path (the *main branch*) and the
other candidates' continuations, and at the draft's forks (where the few tokens
before a position went on in other ways elsewhere) those other ways
(:meth:`~hvd_agents.drafters.cache.suffix.SuffixDrafter.alternatives`), branching
off it where they depart. The target accepts the longest root path it would have
produced itself, so a tree accepts at least what any of its branches would.

Every node has a survival: the chance that the target's output follows the
tree down to it. With the main branch's predicted survivals ``S_i``
(``S_{-1} = 1``) and hazards ``h_i = S_i / S_{i-1}``:

* main node ``i``: ``S_i``;
* the first token of an alternative departing at depth ``j``:
  ``S_{j-1} * (1 - h_j) * t * w / W_j``: the target reaches depth ``j``,
  rejects the main token there, and takes one of the alternatives departing
  there (rate ``t``, learned online), this one by its weight ``w`` (its share of
  the candidates, :data:`BACKUP_WEIGHT` for a shorter match's continuation) over
  the weights ``W_j`` of all alternatives departing there;
* the first token of a *fork* alternative departing at depth ``j`` (a token
  that followed the same few tokens before depth ``j`` elsewhere, in a share
  ``s`` of their occurrences): ``S_{j-1} * min(f * s, 1 - h_j)``: the target
  takes it about as often as the same text went on with it before (times ``f``,
  learned online: how often fork alternatives were taken where tried, against
  the chances their shares gave them), and never more often than it rejects the
  main token there;
* each later token of an alternative: its parent's survival times ``g``, the
  rate at which a taken alternative goes on (learned online from every taken
  alternative: its accepted tokens, then its next one, verified or cut; a cut
  one is judged by the target's own next token, so ``g`` does not depend on
  how many of an alternative's tokens the plans chose to verify).

Where a *judge* is given (the payoff predictor's survivals ``A`` along a
candidate's alternative, described as the proposal would be had that candidate
been the main branch), a candidate's alternative departing at depth ``j`` is
judged too: its first token survives the mean of the rates' chance above and
``A_j`` (the ``A_j`` of those departing at one depth scaled together to at most
``S_{j-1} - S_j``, what the main branch leaves there), each later token ``i``
its parent's survival times ``A_i / A_{i-1}`` instead of ``g``. Only those whose
first node could pay even at the predictor's most are judged; fork alternatives
are not (no candidate goes their way).

Accepted nodes on different branches are disjoint events, so a tree's expected
emitted tokens are one plus the sum of its nodes' survivals. Which nodes to
verify is the selection rule's question (:mod:`hvd_agents.policy.selection`) over
a tree: nodes are taken best first (a child never survives more than its
parent, so every prefix of that order is a tree), and the tree is cut at the
count ``L`` with the best value ``1 + sum of the first L survivals - R *
verify(L)``, at most ``k`` nodes. A node that survives no more than ``R`` times
the cheapest node's cost can never pay, nor can any node below it: such nodes
are not built. Main tokens and alternatives compete for the
same ``k``: a main token deep in a doubtful draft gives way to an alternative
where the candidates split near the start.

Worked example: main branch ``S = [0.9, 0.45]`` (``h = [0.9, 0.5]``), one
alternative departing at depth 1 (``w / W = 1``), ``t = 0.3``, ``g = 0.8``, cost
``1 + 0.01 d`` at ``R = 2`` (a node pays iff its survival exceeds 0.02). The
alternative's first token survives ``0.9 * 0.5 * 0.3 = 0.135`` and its next
``0.108``: all four nodes pay, and the tree expects ``1 + 0.9 + 0.45 + 0.135 +
0.108`` tokens.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from hvd_agents.drafters.base import Draft
from hvd_agents.drafters.cache.suffix import Alternative
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.selection import Choice

BACKUP_WEIGHT = 0.1
"""An alternative's weight when it has no share of the longest-match candidates (the other source's continuation
at a shorter match), against the shares of those that have one."""


FORK_PRIOR = 2.0
"""The chances (and takes) of tried fork alternatives the running sums start from: the scale starts at 1, the
shares as seen, held with the weight of two expected takes."""


@dataclass
class AlternativeRates:
    """The rates the alternatives' survivals are built from, learned from verified trees.

    Attributes:
        taken: ``t``, P(the target takes one of the candidates' alternatives departing where it rejected the main
            branch).
        goes_on: ``g``, P(a taken alternative's next token is accepted too | the ones before it were).
        ema: weight of the newest observation.
        fork_taken: running count of the fork alternatives the target took where they were tried.
        fork_expected: running sum of the chances their shares gave them there (both sums weigh each earlier
            alternative down by ``1 - ema``); ``fork_taken / fork_expected`` is :attr:`fork_scale`.
    """

    taken: float
    goes_on: float
    ema: float
    fork_taken: float = FORK_PRIOR
    fork_expected: float = FORK_PRIOR

    @property
    def fork_scale(self) -> float:
        """``f``: how much more (or less) often the target takes a fork alternative than its share says."""
        return self.fork_taken / self.fork_expected

    def observe(self, draft: Draft, main: int, emitted: Sequence[int], proposal: Sequence[int],
                forks: Sequence[tuple[int, float]] = (), beyond: Sequence[tuple[int, int]] = ()) -> None:
        """Learn from a verified tree whose first ``main`` tokens are the main branch: ``emitted`` are the
        step's new tokens, ``proposal`` the whole main branch the cache drafter proposed (beyond the cut too),
        ``forks`` the fork alternatives' first nodes and the chance each had, as seen, where the main token
        before it was rejected (:attr:`TreePlan.forks`), ``beyond`` each cut alternative's last verified node
        and its next, unverified token (:attr:`TreePlan.beyond`)."""
        if main >= len(draft):
            return  # no alternative was verified
        path = draft.path(emitted)
        on_path = set(path)
        main_accepted = sum(1 for node in path if node < main)
        # the target's token where the main branch stopped: the main token there (verified or not) was right,
        # so the alternatives departing there were not tried against it
        at = main_accepted
        rejected = at < len(proposal) and at < len(emitted) and emitted[at] != proposal[at]
        fork_nodes = {node for node, _ in forks}
        tried = list(tried_alternatives(draft, main, main_accepted, on_path, fork_nodes)) if rejected else []
        if tried:
            self.taken += self.ema * (float(any(tried)) - self.taken)
        parents = draft.parents or ()
        # a fork the engine cut off (a draft is cut to a prefix: the budget, a tree's limit, a grammar) was not tried
        tried_forks = [(node, chance) for node, chance in forks
                       if rejected and node < len(parents) and parents[node] == main_accepted - 1]
        for node, chance in tried_forks:  # running sums, each earlier one weighed down by 1 - ema
            self.fork_taken = (1.0 - self.ema) * self.fork_taken + float(node in on_path)
            self.fork_expected = (1.0 - self.ema) * self.fork_expected + chance
        taken = [node for node in path if node >= main]
        if not taken:
            return
        # the taken alternative's later tokens: the accepted ones, then the next one, whether verified (and
        # rejected) or cut (the target's own next token tells whether it would have been accepted): every taken
        # alternative ends in one observation, so the rate does not depend on how many of its tokens were verified
        for _ in taken[1:]:
            self.goes_on += self.ema * (1.0 - self.goes_on)
        if draft.children().get(taken[-1]):
            self.goes_on += self.ema * (0.0 - self.goes_on)
        elif len(path) < len(emitted):
            following = dict(beyond).get(taken[-1])
            if following is not None:
                self.goes_on += self.ema * (float(emitted[len(path)] == following) - self.goes_on)


@dataclass(frozen=True)
class TreePlan:
    """A cache draft grown into a tree and cut where it pays.

    Attributes:
        choice: the tree's figures (its length counts every node).
        draft: the tree: its first ``main`` tokens are the main branch (a chain), then each alternative's
            tokens in order; a chain when no alternative pays.
        main: how many main-branch tokens it keeps.
        survival: each node's survival, in the draft's order.
        forks: each kept fork alternative's first node (its index in the draft) and its chance, as seen, where
            the main token before it is rejected (``min(s, 1 - h) / (1 - h)``): what :attr:`AlternativeRates.fork_scale`
            is learned against.
        beyond: for each alternative cut short, its last kept node (its index in the draft) and the alternative's
            next token: what :attr:`AlternativeRates.goes_on` learns from when the target takes it to that node.
        judged: the kept nodes (their indices in the draft) of the alternatives the predictor judged.
    """

    choice: Choice
    draft: Draft
    main: int
    survival: tuple[float, ...]
    forks: tuple[tuple[int, float], ...] = ()
    beyond: tuple[tuple[int, int], ...] = ()
    judged: tuple[int, ...] = ()


def plan_tree(
    draft: Draft,
    survival: np.ndarray,
    alternatives: Sequence[Alternative],
    rates: AlternativeRates,
    cost: CostModel,
    rate: float,
    k: int,
    judge: Callable[[int], np.ndarray | None] | None = None,
) -> TreePlan:
    """The nodes of the main branch and its alternatives worth verifying together (see the module docstring).

    Args:
        draft: the cache drafter's whole proposal (the main branch, a chain).
        survival: ``[n]``: its predicted survivals, ``n = len(draft)``.
        alternatives: the other candidates' continuations, each departing from ``draft`` at its ``depth``.
        rates: ``t`` and ``g``.
        cost: the verification cost the step is priced with.
        rate: the running rate ``R``.
        k: the most nodes the tree may have.
        judge: ``judge(i)``: the predictor's survivals along alternative ``i``'s whole path (the main branch
            before its depth, then its tokens) had its candidate been the main branch, or None where it cannot
            tell; asked only for the candidates' alternatives whose first node could pay. None: the rates alone.

    Returns:
        The plan; ``choice.length == 0`` (an empty draft) when no node pays.
    """
    n = min(len(draft), len(survival))
    # a node that survives no more than the rate times the cheapest node's cost can never pay, nor can any node
    # below it (a child never survives more than its parent): such nodes are not built
    floor = rate * cost.cheapest(k) if k > 0 else np.inf
    floor -= 1e-9 * max(abs(floor), 1.0)  # so that rounding never drops a node that could pay
    main_survival = survival[:n].tolist()  # [n]: read one by one, as floats
    nodes = _Nodes()
    for i, alive in enumerate(main_survival):
        if not alive > floor:
            break
        nodes.add(draft.token_ids[i], alive, i - 1, -1)
    # each alternative's first node as the rates price it, and where a judge is given, as the predictor does
    firsts = _first_nodes(alternatives, main_survival, len(nodes.values), rates)
    judged = _judged(alternatives, firsts, floor, judge) if judge is not None else {}
    for owner, (alive, left, _) in firsts.items():
        nodes.grow(alternatives[owner], owner, alive, left, judged.get(owner), rates.goes_on, floor, k)
    # best first, cut at the count with the best value
    order = nodes.best_first(k)
    curve = cost.verify_curve(k + 1)[: len(order) + 1]  # [L + 1]
    gains = np.concatenate([[1.0], 1.0 + np.cumsum([nodes.values[node] for node in order])])  # [L + 1]
    scores = gains - rate * curve
    length = int(np.argmax(scores))
    choice = Choice(length, float(gains[length]), float(curve[length]), float(scores[length]))
    return nodes.plan(choice, order[:length], draft, set(judged))


@dataclass
class _Nodes:
    """The candidate nodes of a tree being planned, in the order they are built."""

    values: list[float] = field(default_factory=list)  # every candidate node's survival
    parents: list[int] = field(default_factory=list)  # its parent among the candidate nodes (-1: the root)
    tokens: list[int] = field(default_factory=list)
    branch: list[int] = field(default_factory=list)  # -1 for a main node, else the index of its alternative
    children: dict[int, list[int]] = field(default_factory=dict)
    fork_chance: dict[int, float] = field(default_factory=dict)  # a fork's first node: its chance if main rejected
    following: dict[int, int] = field(default_factory=dict)  # an alternative's node: the alternative's token after it

    def add(self, token: int, value: float, parent: int, owner: int) -> int:
        node = len(self.values)
        self.values.append(value)
        self.parents.append(parent)
        self.tokens.append(token)
        self.branch.append(owner)
        self.children.setdefault(parent, []).append(node)
        return node

    def grow(self, alternative: Alternative, owner: int, alive: float, left: float, path: np.ndarray | None,
             goes_on: float, floor: float, k: int) -> None:
        """Alternative ``owner``'s nodes while they could pay: its first survives ``alive`` (the mean of that and
        the predictor's where it was judged, ``path``), each later one its parent's times ``goes_on`` or, judged,
        the predictor's hazard."""
        depth = alternative.depth
        if path is not None:  # the mean of the rates' and the predictor's chance, then the predictor's hazards
            alive = 0.5 * (alive + path[0])
        parent = depth - 1
        for i, token in enumerate(alternative.tokens[: max(k - depth, 0)]):
            if not alive > floor:
                break
            parent = self.add(token, alive, parent, owner)
            if i == 0 and alternative.fork and left > 0:
                self.fork_chance[parent] = min(alternative.share, left) / left
            if i + 1 < len(alternative.tokens):
                self.following[parent] = alternative.tokens[i + 1]
            if path is None:
                alive *= goes_on
            else:
                alive *= path[i + 1] / path[i] if i + 1 < len(path) and path[i] > 0 else 0.0

    def best_first(self, k: int) -> list[int]:
        """At most ``k`` nodes, best first: a node becomes a candidate once its parent is taken."""
        order: list[int] = []
        frontier = [(-self.values[node], node) for node in self.children.get(-1, [])]
        heapq.heapify(frontier)
        while frontier and len(order) < k:
            _, node = heapq.heappop(frontier)
            order.append(node)
            for child in self.children.get(node, []):
                heapq.heappush(frontier, (-self.values[child], child))
        return order

    def plan(self, choice: Choice, kept: list[int], draft: Draft, judged: set[int]) -> TreePlan:
        """The plan of the ``kept`` nodes, in the draft's order: the main branch, then each alternative's tokens
        (``judged``: the alternatives the predictor judged)."""
        branch = self.branch
        main = sum(1 for node in kept if branch[node] < 0)
        ordered = sorted(kept, key=lambda node: (branch[node] >= 0, branch[node], node))
        position = {node: i for i, node in enumerate(ordered)}
        out_tokens = tuple(self.tokens[node] for node in ordered)
        out_parents = tuple(position[self.parents[node]] if self.parents[node] >= 0 else -1 for node in ordered)
        # a draft with an alternative keeps its parents even where they form a chain (one departing right after
        # the cut)
        tree = Draft(out_tokens, None, draft.score, draft.source, draft.features,
                     out_parents if main < choice.length else None)
        forks = tuple((position[node], self.fork_chance[node]) for node in ordered if node in self.fork_chance)
        kept_nodes = set(kept)
        leaves = [node for node in ordered if branch[node] >= 0 and node in self.following
                  and not any(child in kept_nodes for child in self.children.get(node, []))]
        beyond = tuple((position[node], self.following[node]) for node in leaves)
        judged_nodes = tuple(position[node] for node in ordered if branch[node] in judged)
        return TreePlan(choice, tree, main, tuple(self.values[node] for node in ordered), forks, beyond, judged_nodes)


def _first_nodes(alternatives: Sequence[Alternative], main_survival: list[float], built: int,
                 rates: AlternativeRates) -> dict[int, tuple[float, float, float]]:
    """Each alternative that departs below a built main node (or at the root): its first node's survival as the
    rates price it, the main token's rejection there and what the main branch leaves there, by its index."""
    n = len(main_survival)
    departing: dict[int, float] = {}
    for alternative in alternatives:
        if alternative.depth < n and alternative.tokens and not alternative.fork:
            departing[alternative.depth] = departing.get(alternative.depth, 0.0) + _weight(alternative)
    firsts: dict[int, tuple[float, float, float]] = {}
    for owner, alternative in enumerate(alternatives):
        depth = alternative.depth
        if depth >= n or depth > built or not alternative.tokens:
            continue
        reach = main_survival[depth - 1] if depth > 0 else 1.0  # S_{depth-1}: the main branch alive before it
        left = 1.0 - (main_survival[depth] / reach if reach > 0 else 0.0)  # the main token's rejection there
        if alternative.fork:
            alive = reach * min(alternative.share * rates.fork_scale, left)
        else:
            alive = reach * left * rates.taken * _weight(alternative) / departing[depth]
        firsts[owner] = (alive, left, reach * left)
    return firsts


def paying_reach(survival: np.ndarray, cost: CostModel, rate: float, k: int) -> int:
    """How many of a draft's first positions an alternative may depart at and still pay: depth 0, and each
    depth ``j`` whose main branch before it survives above ``rate`` times the cheapest node's cost (an
    alternative's first token survives less than that)."""
    if not len(survival):
        return 0
    floor = rate * (cost.cheapest(k) if k > 0 else 0.0)
    reach = 1
    for alive in survival.tolist():  # the leading positions whose main branch pays
        if not alive > floor:
            break
        reach += 1
    return reach


def _judged(alternatives: Sequence[Alternative], firsts: dict[int, tuple[float, float, float]], floor: float,
            judge: Callable[[int], np.ndarray | None]) -> dict[int, np.ndarray]:
    """For each candidate alternative ``judge`` can tell about and whose first node could pay (the mean of its
    rates' chance and the most the predictor may give it, what the main branch leaves there), the predictor's
    survivals from its first token on, with the first tokens of those departing at one depth scaled together to at
    most what the main branch leaves there: ``[m]``."""
    out: dict[int, np.ndarray] = {}
    for owner, (alive, _, room) in firsts.items():
        alternative = alternatives[owner]
        depth = alternative.depth
        if alternative.fork or not 0.5 * (alive + room) > floor:
            continue
        survival = judge(owner)
        if survival is None or len(survival) <= depth:
            continue
        out[owner] = np.asarray(survival[depth:], dtype=np.float64)  # [m]: A_j, A_{j+1}, ...
    by_depth: dict[int, float] = {}
    for owner, path in out.items():
        depth = alternatives[owner].depth
        by_depth[depth] = by_depth.get(depth, 0.0) + float(path[0])
    for owner, path in out.items():
        room = firsts[owner][2]
        total = by_depth[alternatives[owner].depth]
        if total > room:
            out[owner] = path * (room / total)
    return out


def _weight(alternative: Alternative) -> float:
    return alternative.share if alternative.share > 0 else BACKUP_WEIGHT


def tried_alternatives(draft: Draft, main: int, main_accepted: int, path: set[int],
                       skip: set[int] | frozenset[int] = frozenset()) -> Iterator[bool]:
    """For each alternative the target tried, whether it was the target's choice.

    An alternative is tried when it departs where the main branch was rejected
    (its first token's parent is the last accepted main token, or the root when
    none was); it was the target's choice when its first token is on the
    accepted ``path``. Nothing was tried when the whole main branch was accepted.

    Args:
        draft: the verified tree; its first ``main`` tokens are the main branch.
        main: the main branch's length.
        main_accepted: how many main-branch tokens the target accepted.
        path: the indices of the accepted tokens.
        skip: first nodes not to count (the fork alternatives', whose rate is learned apart).
    """
    for node, parent in enumerate(draft.parents or ()):
        if node < main or parent >= main or parent != main_accepted - 1 or node in skip:
            continue  # not an alternative's first token, or not where the main branch was rejected
        yield node in path
