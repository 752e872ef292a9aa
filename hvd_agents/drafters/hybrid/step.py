"""One ``hvd`` step's records: what each phase of ``propose`` found, and the decision made of them.

:meth:`~.drafter.HybridDrafter.propose` runs its phases in order, each returning a small frozen
record: :class:`CacheStep` (phases 1-2: the cache drafter's proposal, the predictor's judgement
of it and the tree cut from it) and :class:`ModelStep` (phase 3: the model drafter's draft, if
any, and what asking it cost). :func:`decide` builds the step's :class:`StepDecision` from them,
by keyword: the record ``observe`` learns from, which ``decision()`` and ``probe()`` read between
``propose`` and ``observe``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hvd_agents.drafters.base import Draft
from hvd_agents.drafters.hybrid.pricing import StepPrices
from hvd_agents.drafters.hybrid.tree import TreePlan
from hvd_agents.policy.features import CacheDraftFeatures
from hvd_agents.policy.selection import Choice


@dataclass(frozen=True)
class StepDecision:
    """What one ``propose`` chose, kept with its request until ``observe``.

    Attributes:
        source: the draft verified: ``"cache"``, ``"model"`` or ``"none"`` (a plain step).
        features: the cache draft's features (with the target's signal), whether or not it was used
            (None: the cache drafter had no draft).
        main: the cache draft's main-branch tokens, the draft's first ones (0 unless ``source`` is ``"cache"``;
            a tree of alternatives only has none).
        cost: the step's cost in plain steps, as priced.
        verified: the draft tokens the target verifies (a tree's nodes included).
        draft_s: seconds the model drafter took (0 when it was not asked).
        policy_s: the policy's own seconds in ``propose``: cache drafting and the decision,
            model drafting excluded.
        cache_tokens: the cache drafter's whole proposal, used or not (empty: none).
        predicted: the predictor's median accepted length of that whole proposal (None: no proposal): above
            ``n`` exactly where it gives the first ``n`` tokens more than an even chance.
        ask_cost: where a gated model drafter was asked with nothing better to verify, what the ask cost in
            plain steps as priced (its forward and its catch-up of the prompt); None where it was not asked so.
        survival: the predictor's survivals of the cache proposal, before calibration (empty: no proposal).
        hazards: the predictor's per-position acceptance probabilities they are the running product of (the
            online step's predictions).
        forks: the verified tree's fork alternatives, as :attr:`~.tree.TreePlan.forks` (empty: none).
        short: the cache proposal was of the gated short-match class (``HybridConfig.short_match``) and was
            computed: what it brought moves that class's running gain.
        beyond: the verified tree's cut alternatives' next tokens, as :attr:`~.tree.TreePlan.beyond` (empty: none).
        plan: how the cache proposal was handled: ``"planned"`` (predictor, tree, cut), ``"whole"`` (verified as
            it is, where planning could not pay for itself), ``""`` (no proposal, or not timed).
        judge_s: the policy's seconds judging alternatives with the predictor, where that work is gated (greedy,
            unbatched, costs calibrated to the engine; 0: none judged, or not gated): what the judged alternatives
            brought moves the gate's gain.
        judged: the verified tree's nodes (indices in the draft) on judged alternatives.
        judged_cost: what verifying those nodes added to the step's cost, in plain steps as priced.
    """

    source: str = "none"
    features: CacheDraftFeatures | None = None
    main: int = 0
    cost: float = 1.0
    verified: int = 0
    draft_s: float = 0.0
    policy_s: float = 0.0
    cache_tokens: tuple[int, ...] = ()
    predicted: float | None = None
    ask_cost: float | None = None
    survival: tuple[float, ...] = ()
    hazards: tuple[float, ...] = ()
    forks: tuple[tuple[int, float], ...] = ()
    beyond: tuple[tuple[int, int], ...] = ()
    short: bool = False
    plan: str = ""
    judge_s: float = 0.0
    judged: tuple[int, ...] = ()
    judged_cost: float = 0.0


@dataclass(frozen=True)
class Candidate:
    """A draft the step could verify, with its figures (``source``: ``"cache"``, ``"model"`` or ``"none"``)."""

    source: str
    choice: Choice
    draft: Draft = field(default_factory=Draft)


@dataclass(frozen=True)
class CacheStep:
    """Phases 1-2: the cache drafter's proposal, the predictor's judgement of it and the tree cut from it.

    Attributes:
        proposal: the cache drafter's whole proposal (empty: none).
        features: its features with the target's signal (None: no proposal).
        hazards: the predictor's per-position acceptance probabilities (empty: no proposal).
        predicted: their running product, the predictor's survivals before calibration.
        median: the proposal's predicted median accepted length, from the calibrated survivals
            (:func:`~hvd_agents.policy.payoff.median_accepted`; None: no proposal).
        short: the proposal is of the gated short-match class and was computed.
        plan: the tree cut from it where it beats a plain step (None: no cache draft pays).
        judge_s: the seconds judging alternatives, where that work is gated (0: not judged, or not gated).
        judged_cost: what verifying the plan's judged nodes added to its cost, in plain steps.
    """

    proposal: Draft = field(default_factory=Draft)
    features: CacheDraftFeatures | None = None
    hazards: tuple[float, ...] = ()
    predicted: tuple[float, ...] = ()
    median: float | None = None
    short: bool = False
    plan: TreePlan | None = None
    judge_s: float = 0.0
    judged_cost: float = 0.0

    def candidate(self, plain: Candidate) -> Candidate:
        """The cache draft as a candidate, or ``plain`` where no cache draft pays."""
        return plain if self.plan is None else Candidate("cache", self.plan.choice, self.plan.draft)


@dataclass(frozen=True)
class ModelStep:
    """Phase 3: the step's best candidate once the model drafter was asked or passed over.

    Attributes:
        best: the model drafter's draft where it drafted and beats the cache's, else the candidate before it.
        draft_s: the seconds it took (0: not asked).
        ask_cost: where a gated drafter was asked with nothing better to verify, what the ask cost in plain steps
            (None: not asked so).
    """

    best: Candidate
    draft_s: float = 0.0
    ask_cost: float | None = None


def decide(prices: StepPrices, cache: CacheStep, model: ModelStep, policy_s: float) -> StepDecision:
    """The step's decision, made of its phases' records (``policy_s``: the policy's own seconds)."""
    best = model.best
    plan = cache.plan if best.source == "cache" else None
    proposed = bool(cache.proposal.token_ids)
    return StepDecision(
        source=best.source,
        features=cache.features,
        main=plan.main if plan is not None else 0,
        cost=best.choice.cost,
        verified=len(best.draft),
        draft_s=model.draft_s,
        policy_s=policy_s,
        cache_tokens=cache.proposal.token_ids,
        predicted=cache.median,
        ask_cost=model.ask_cost,
        survival=cache.predicted,
        hazards=cache.hazards,
        forks=plan.forks if plan is not None else (),
        beyond=plan.beyond if plan is not None else (),
        short=cache.short,
        plan="planned" if proposed and prices.times_itself else "",
        judge_s=cache.judge_s,
        judged=plan.judged if plan is not None else (),
        judged_cost=cache.judged_cost if plan is not None else 0.0,
    )


def whole_decision(proposal: Draft, prices: StepPrices, policy_s: float) -> StepDecision:
    """The decision of a step that verifies the cache drafter's proposal as it is (phase 0)."""
    n = len(proposal)
    return StepDecision(source="cache", main=n, cost=float(prices.cost.verify(n)), verified=n, policy_s=policy_s,
                        cache_tokens=proposal.token_ids, plan="whole")
