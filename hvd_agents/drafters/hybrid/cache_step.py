"""Phases 1-2 of an ``hvd`` step: the cache draft, its payoff, and the tree cut from it; and what they learn.

:meth:`CachePhase.step` asks the cache drafter for its proposal (a short match's only while
what such proposals bring pays for the policy's work on them: the ``short`` gate), turns the
proposal's features into survivals with the payoff predictor (calibrated to what the target
bore out, where costs are calibrated to the engine), reads the other candidates' alternatives
where they could pay, judges them with the predictor too (while that pays: the ``judging``
gate), and cuts the tree at the node count with the best value (:func:`~.tree.plan_tree`). It
returns a :class:`~.step.CacheStep`. :meth:`CachePhase.observe` feeds the step's outcome to the
cache drafter, the predictor, the survival calibration and the alternatives' rates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hvd_agents.drafters.base import Draft, DraftContext, DraftOutcome
from hvd_agents.drafters.cache.suffix import Alternative, SuffixDrafter
from hvd_agents.drafters.hybrid.ask import Gate
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.hybrid.pricing import StepPrices, StepPricing
from hvd_agents.drafters.hybrid.step import CacheStep, Candidate, StepDecision
from hvd_agents.drafters.hybrid.tree import AlternativeRates, paying_reach, plan_tree
from hvd_agents.policy.features import TargetSignal
from hvd_agents.policy.payoff import PayoffPredictor, median_accepted
from hvd_agents.policy.survival_calibration import SurvivalCalibration


@dataclass
class _Judge:
    """``plan_tree``'s judge: the predictor's survivals along a candidate's alternative, timed by ``clock``."""

    path: Callable[[int], np.ndarray | None]
    clock: Callable[[], float]
    seconds: float = 0.0  # spent judging this step

    def __call__(self, i: int) -> np.ndarray | None:
        begun = self.clock()
        path = self.path(i)
        self.seconds += self.clock() - begun
        return path


@dataclass
class CachePhase:
    """The cache side of the ``hvd`` policy (see the module docstring); its parts are the drafter's own.

    Attributes:
        cache: the cache drafter.
        predictor: the payoff predictor.
        rates: how the tree's alternatives fare.
        calibration: the predictor's survivals as the target bears them out (None: taken as they are).
        pricing: the step timings the gates' seconds are weighed against.
        config: the policy's tuning.
        short: the gate of a short match's proposal.
        judging: the gate of judging alternatives with the predictor.
    """

    cache: SuffixDrafter
    predictor: PayoffPredictor
    rates: AlternativeRates
    calibration: SurvivalCalibration | None
    pricing: StepPricing
    config: HybridConfig
    short: Gate
    judging: Gate

    def step(self, ctx: DraftContext, k: int, prices: StepPrices, plain: Candidate, *, target: TargetSignal | None,
             session_id: str | None, clock: Callable[[], float]) -> CacheStep:
        """Phases 1-2 for ``ctx`` (``plain``: a plain step's candidate, which a tree must beat; ``target``: the
        target's signal at the last token; ``clock``: the seconds clock judging is timed by)."""
        short_match, rate, step_s = self.config.short_match, prices.rate, self.pricing.calibration.step_s
        skip_short = short_match > 0 and prices.times_itself and not self.short.pays(rate, self.short.cost(step_s))
        proposal = self.cache.propose(ctx, k, min_match=short_match + 1) if skip_short else self.cache.propose(ctx, k)
        if skip_short and not proposal.token_ids and proposal.score > 0:
            self.short.skipped()
        if not proposal.token_ids:
            return CacheStep(proposal)
        features = proposal.features.with_target(target)
        hazards = self.predictor.hazards(features, len(proposal), session_id)
        predicted = np.cumprod(hazards)
        survival = self.calibration.apply(predicted) if self.calibration is not None else predicted
        # an alternative survives at most as long as the main branch before it: only where that could pay is one read
        reach = paying_reach(survival, prices.cost, rate, k)
        alternatives = (self.cache.alternatives(ctx.req_id, proposal.token_ids[:reach], self.config.branches)
                        if self.config.branches and reach else [])
        judge = self._judge(ctx, proposal, alternatives, target, session_id, prices, clock)
        plan = plan_tree(proposal, survival, alternatives, self.rates, prices.cost, rate, k, judge)
        gated = prices.times_itself and self.pricing.calibrate  # judging weighed against timed steps
        pays = plan.choice.length > 0 and plan.choice.value > plain.choice.value
        judged_cost = plan.choice.cost - float(prices.cost.verify(plan.choice.length - len(plan.judged)))
        return CacheStep(proposal, features, tuple(hazards.tolist()), tuple(predicted.tolist()),
                         median=median_accepted(survival), short=short_match > 0 and proposal.score <= short_match,
                         plan=plan if pays else None, judge_s=judge.seconds if gated and judge is not None else 0.0,
                         judged_cost=judged_cost if pays else 0.0)

    def observe(self, outcome: DraftOutcome, step: StepDecision, session_id: str | None) -> None:
        """The cache drafter and the predictor learn from the cache draft's main branch, and only when it was used;
        a verified tree's alternatives move their rates."""
        cache_outcome = self._cache_outcome(outcome, step)
        self.cache.observe(cache_outcome)
        if step.source == "cache" and step.features is not None and outcome.draft.token_ids:
            self.predictor.update(step.features, len(cache_outcome.draft), cache_outcome.num_accepted,
                                  session_id, np.asarray(step.hazards), next_accepted(cache_outcome, step))
            if self.calibration is not None and step.main:
                self.calibration.observe(np.asarray(step.survival[: step.main]), cache_outcome.num_accepted)

    def _judge(self, ctx: DraftContext, proposal: Draft, alternatives: Sequence[Alternative],
               target: TargetSignal | None, session_id: str | None, prices: StepPrices,
               clock: Callable[[], float]) -> _Judge | None:
        """The judge of the proposal's alternatives (None: none judged): for greedy requests priced by the
        engine's timed steps, only while what judged alternatives bring pays for judging them."""
        if not (self.config.judge_alternatives and alternatives):
            return None
        gated = prices.times_itself and self.pricing.calibrate
        if gated and not self.judging.pays(prices.rate, self.judging.cost(self.pricing.calibration.step_s)):
            self.judging.skipped()
            return None
        return _Judge(functools.partial(self._judged_path, ctx, proposal, alternatives, target, session_id), clock)

    def _judged_path(self, ctx: DraftContext, proposal: Draft, alternatives: Sequence[Alternative],
                     target: TargetSignal | None, session_id: str | None, i: int) -> np.ndarray | None:
        """The predictor's survivals along alternative ``i``'s path, as the proposal would be described had its
        candidate been the main branch (None: the cache drafter cannot describe it)."""
        described = self.cache.described(ctx, proposal, alternatives[i])
        if described is None:
            return None
        path = np.cumprod(self.predictor.hazards(described.with_target(target), len(described.probs), session_id))
        return self.calibration.apply(path) if self.calibration is not None else path

    def _cache_outcome(self, outcome: DraftOutcome, step: StepDecision) -> DraftOutcome:
        """The outcome as the cache drafter sees it: its main branch's (the tree's verified alternatives move the
        alternative rates), an empty draft's when it was not used or the step verified alternatives only."""
        draft = outcome.draft
        if step.source != "cache" or step.main == 0:
            if step.source == "cache":
                self.rates.observe(draft, 0, outcome.new_token_ids, step.cache_tokens, step.forks, step.beyond)
            return DraftOutcome(outcome.req_id, Draft(), 0, outcome.new_token_ids)
        if step.main >= len(draft):
            return outcome
        self.rates.observe(draft, step.main, outcome.new_token_ids, step.cache_tokens, step.forks, step.beyond)
        main_accepted = sum(1 for node in draft.path(outcome.new_token_ids) if node < step.main)
        main = Draft(draft.token_ids[: step.main], None, draft.score, draft.source, draft.features)
        return DraftOutcome(outcome.req_id, main, main_accepted, outcome.new_token_ids)


def next_accepted(outcome: DraftOutcome, step: StepDecision) -> bool | None:
    """Whether the proposal's token after the verified main branch is the target's next one, where the branch
    was cut from a longer proposal and accepted whole (None: else). For a cache draft, a deterministic one, the
    target's next token equals it with the probability that verifying it would have accepted it, greedy or
    sampled: an unbiased label of a position the cut left unverified."""
    cut = len(outcome.draft)
    if not 0 < cut < len(step.cache_tokens) or outcome.num_accepted != cut or len(outcome.new_token_ids) <= cut:
        return None
    return outcome.new_token_ids[cut] == step.cache_tokens[cut]
