"""The HVD drafter (method ``hvd``): payoff-guided choice between a cache draft, a model draft or none.

Each ``propose`` is four phases (:meth:`HybridDrafter.propose`), unless planning cannot pay: where
verifying all ``k`` tokens costs, beyond a plain step, no more than the policy's own timed work on a
planned proposal (a GPU's nearly flat profile), the cache drafter's proposal is verified as it is.

1. **the cache draft and its payoff** (:mod:`.cache_step`): the cache drafter
   (:class:`~hvd_agents.drafters.cache.suffix.SuffixDrafter`) proposes up to ``k`` tokens with their
   features; the payoff predictor turns the features (plus the target's signal from the previous
   verification) into survival probabilities ``S_i`` BEFORE any verification;
2. **the tree and its cut**: where the cache drafter's candidates disagree, the other candidates'
   continuations branch off the proposal where they depart (:mod:`.tree`), each judged by the
   predictor too as a proposal of its own (for greedy requests, while that pays for its host work:
   :mod:`.ask`); the nodes of that tree, best first, are cut at the count with the best value
   ``E[tokens] - R * cost`` (:mod:`hvd_agents.policy.selection`'s rule), at most ``k`` of them,
   or dropped when a plain step is worth more;
3. **the model drafter** (:mod:`.model_step`), when there is one: where no cache draft pays, a
   drafter that gates its first token is asked while asking pays (:mod:`.ask`: the running gain of
   an ask against ``R`` times its timed forward and catch-up, both spent whether or not it drafts),
   and its first forward decides: it drafts iff its own confidence in its first
   token (its *reach*, :mod:`hvd_agents.drafters.model.loop`) makes the step beat a
   plain one (``1 + p - R * verify(1) > 1 - R``), then goes on while further tokens
   pay; otherwise (a cache draft pays, or the drafter cannot gate) it only runs, and
   costs its forwards, when its running per-token acceptance in this request says it
   beats the best draft so far, catching up on the context it has not seen included.
   The drafter's confidence tells the steps it gets right from those it does not far
   better than its average acceptance does;
4. **the record**: what was chosen and what it cost is kept with the request as a
   :class:`~.step.StepDecision`, built from the phases' records (:mod:`.step`), for ``observe``.

No draft means a plain decoding step. A proposal's prices are decided once, at its start
(:class:`~.pricing.StepPrices`: the target's profile calibrated to the engine's step timings,
the model drafter's timed costs, ``R``, the request's share of a batch, whether the request
times the policy's own work), tuning comes from :class:`~.config.HybridConfig`. The policy's
optional host work (a short match's proposal, judging alternatives, planning rather than taking
a proposal whole, asking a gated model drafter) is four :class:`~.ask.Gate` s, each with its
running gain and seconds.

``observe`` feeds the outcome back, part by part: the cache drafter indexes the new tokens (and learns
from its own draft's outcome only when that draft was used), the predictor takes an online step for the
session, the model drafter sees every outcome (it must follow the context) and its running acceptance
moves after its own drafts, a tree's tried alternatives move the alternative rate, each gate learns what
its work brought and took, the rate estimate ``R`` moves, and the step's seconds calibrate the prices.

Lifecycle: ``start`` (where a profile given as a callable is measured, once: before the request is timed),
then ``propose`` (skipped when the engine has no room for a draft) and ``observe`` once per step, then
``stop``; ``propose`` or ``observe`` for a request that is not started raises, ``stop`` is safe to call twice.

Worked example (cost ``1 + 0.02 d``, ``R = 5``): a draft copied from an earlier
tool call with ``S = [0.97, 0.95, 0.9, 0.3, 0.08]`` keeps tokens while
``S_i > 0.1``: the target verifies 4 tokens, not 5 (and not K = 16). Had the
predictor given ``S = [0.05, ...]``, no cache token would pay; a draft head
asked then drafts only if its first token's reach beats
``R * verify(1) = 5.1 - 5 = 0.1`` above a plain step's value.

Correctness does not depend on any of this: verification accepts exactly what the
target would have produced, whatever is drafted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, DraftOutcome, started
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.ask import Ema, Gate, ask_gain, gate
from hvd_agents.drafters.hybrid.cache_step import CachePhase
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.hybrid.model_step import ask_model
from hvd_agents.drafters.hybrid.pricing import StepPricing
from hvd_agents.drafters.hybrid.probe import CacheProbe
from hvd_agents.drafters.hybrid.step import Candidate, StepDecision, decide, whole_decision
from hvd_agents.drafters.hybrid.tree import AlternativeRates
from hvd_agents.drafters.model.protocol import ModelDrafter, as_model_drafter
from hvd_agents.policy.calibration import StepCalibration
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.features import ChosenDraftFeatures, TargetSignal
from hvd_agents.policy.payoff import PayoffPredictor
from hvd_agents.policy.selection import RateEstimate, no_draft
from hvd_agents.policy.survival_calibration import SurvivalCalibration
from hvd_agents.structure import PromptStructure


@dataclass
class _HybridRequestState:
    """One request's state between ``start`` and ``stop``."""

    session_id: str | None
    model_acceptance: float  # the model drafter's running per-token acceptance in this request
    target: TargetSignal | None = None  # the target's signal at the last emitted token, when reported
    model_drafted: bool = False  # the previous step was a model draft (so the drafter is caught up)
    decision: StepDecision | None = None  # this step's, from propose to observe (None: no propose this step)


class HybridDrafter:
    """Payoff-guided hybrid drafting (see the module docstring).

    Args:
        cache: the cache drafter.
        predictor: the payoff predictor (packaged default weights when None).
        cost: the target's cost model, or a callable that returns it at the first ``start`` (measuring a
            profile takes a few forwards); a linear ``1 + c d`` (``config.default_verify_cost``) when None.
        model: an optional model drafter. A
            :class:`~hvd_agents.drafters.model.protocol.ModelDrafter` (the project's
            drafters are) is priced and steered by what it declares; any other
            Drafter is wrapped in
            :class:`~hvd_agents.drafters.model.protocol.PlainModelDrafter`.
        model_cost: the cost of a step with a model draft, drafting included, taken
            as is; when None it is priced by :class:`~.pricing.StepPricing` from
            ``cost`` and the drafter's timed per-token cost.
        branches: most alternative continuations a cache draft grows (0: chains
            only); ``config.branches`` when None.
        calibrate: scale ``cost`` to the engine's step timings; by default only when
            ``cost`` is a callable (a profile measured on this machine).
        config: priors, running-estimate weights and limits.

    Raises:
        TypeError: ``model`` declares only part of the ModelDrafter protocol.
    """

    def __init__(
        self,
        cache: SuffixDrafter,
        predictor: PayoffPredictor | None = None,
        cost: CostModel | Callable[[], CostModel] | None = None,
        *,
        model: Drafter | None = None,
        model_cost: CostModel | Callable[[], CostModel] | None = None,
        branches: int | None = None,
        calibrate: bool | None = None,
        config: HybridConfig | None = None,
    ) -> None:
        config = config if config is not None else HybridConfig()
        self.config = config if branches is None else replace(config, branches=branches)
        self.cache = cache
        self.predictor = predictor if predictor is not None else PayoffPredictor()
        self.model: ModelDrafter | None = None
        token_prior, ingest_prior, acceptance_prior = config.model_prior_token_cost, config.model_prior_ingest_cost, None
        if model is not None:
            self.model = as_model_drafter(model, cost_prior=token_prior, ingest_cost_prior=ingest_prior)
            token_prior, ingest_prior = self.model.cost_prior, self.model.ingest_cost_prior
            acceptance_prior = self.model.acceptance_prior
        self.pricing = StepPricing(
            cost if cost is not None else CostModel.linear(config.default_verify_cost),
            model_cost=model_cost,
            calibrate=calibrate,
            token_cost_prior=float(token_prior),
            ingest_cost_prior=float(ingest_prior),
            timing_ema=config.timing_ema,
        )
        # running estimates across requests
        self.rate = RateEstimate()  # R: tokens per plain step
        self.alternatives = AlternativeRates(config.alternative_taken_prior, config.alternative_goes_on_prior,
                                             config.alternative_ema)  # how the tree's alternatives fare
        # each request's model acceptance starts from this; a drafter may know its own (a trained head's
        # held-out agreement with the target)
        self.model_acceptance = float(acceptance_prior or config.model_prior_acceptance)
        # the predictor's survivals as the target bears them out, across requests and sessions; only where costs
        # are calibrated to this engine too (a trace replay or a given cost model takes the predictor as it is)
        self.survival_calibration = SurvivalCalibration() if self.pricing.calibrate else None
        # the four gates (see .ask): asking a gated model drafter (its seconds are the drafter's, timed by the
        # pricing), a short match's proposal, judging alternatives, and planning a proposal rather than taking it whole
        self.ask = gate(config.model_ask_gain_prior, config.model_ask_ema, config.model_ask_explore)
        self.short = gate(config.short_gain_prior, config.short_gain_ema, config.short_gain_explore,
                          config.short_gain_ema)
        self.judging = gate(config.judge_gain_prior, config.judge_gain_ema, config.judge_gain_explore,
                            config.judge_gain_ema)
        self.plan = Gate(Ema(config.plan_ema), baseline=Ema(config.plan_ema))
        self.cache_phase = CachePhase(self.cache, self.predictor, self.alternatives, self.survival_calibration,
                                      self.pricing, self.config, self.short, self.judging)
        self._requests: dict[str, _HybridRequestState] = {}

    # ------------------------------------------------------------------ what the engine and tests read

    @property
    def uses_hidden_states(self) -> bool:
        """Whether the model drafter drafts from the target's hidden states."""
        return self.model is not None and bool(self.model.uses_hidden_states)

    @property
    def profile(self) -> CostModel:
        """The target's cost model as given or measured."""
        return self.pricing.profile

    @property
    def cost(self) -> CostModel:
        """The verification cost greedy requests are priced with (:meth:`StepPricing.target_cost`)."""
        return self.pricing.target_cost()

    @property
    def calibrate(self) -> bool:
        return self.pricing.calibrate

    @property
    def calibration(self) -> StepCalibration:
        return self.pricing.calibration

    @property
    def plan_seconds(self) -> float:
        """The policy's running seconds on a planned cache proposal (0: none timed yet)."""
        return self.plan.seconds.value

    def model_cost(self, timed: bool = True) -> CostModel:
        """The cost of a step with a model draft (:meth:`StepPricing.model_cost`)."""
        return self.pricing.model_cost(timed)

    def decision(self, req_id: str) -> StepDecision | None:
        """The step decision ``propose`` made for ``req_id`` and ``observe`` has not consumed yet (None: none,
        or the request is not started)."""
        request = self._requests.get(req_id)
        return None if request is None else request.decision

    def probe(self, req_id: str) -> CacheProbe | None:
        """The step's cache proposal, prediction and arm (:class:`~.probe.CacheProbe`), between ``propose`` and
        ``observe`` (None: no proposal this step, or the request is not started)."""
        decision = self.decision(req_id)
        if decision is None:
            return None
        return CacheProbe(decision.cache_tokens, decision.predicted, decision.source, decision.features)

    # ------------------------------------------------------------------ lifecycle

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        self.cache.start(req_id, prompt_ids, structure)
        if self.model is not None:
            self.model.start(req_id, prompt_ids, structure)
        session = structure.session_id if structure is not None else None
        self._requests[req_id] = _HybridRequestState(session, model_acceptance=self.model_acceptance)
        _ = self.pricing.profile  # one-time work: a profile to measure is measured before the request is timed

    def stop(self, req_id: str) -> None:
        self.cache.stop(req_id)
        if self.model is not None:
            self.model.stop(req_id)
        self._requests.pop(req_id, None)

    def _request(self, req_id: str, call: str) -> _HybridRequestState:
        return started(self._requests, req_id, "hvd", call)

    # ------------------------------------------------------------------ one step

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """The draft to verify this step (at most ``k`` tokens; empty for a plain step), in the four phases
        of the module docstring; the decision is kept with the request for :meth:`observe`.

        Raises:
            ValueError: ``ctx.req_id`` is not started.
        """
        request = self._request(ctx.req_id, "propose")
        if k <= 0:
            return Draft()
        begun = time.perf_counter()
        prices = self.pricing.prices(ctx, max(self.rate.rate, 1.0))
        # 0. where verifying the whole proposal costs less beyond a plain step than planning it would, it is
        # verified as it is (a GPU's flat profile); only where the request times the policy's work
        if prices.times_itself and self._whole_pays(prices.cost, k):
            whole = self.cache.propose(ctx, k, described=False)
            if whole.token_ids:
                request.decision = whole_decision(whole, prices, time.perf_counter() - begun)
                return whole
        # 1-2. the cache draft, its payoff, and the tree over its candidates cut where it pays
        plain = Candidate("none", no_draft(prices.cost, prices.rate))
        cache = self.cache_phase.step(ctx, k, prices, plain, target=request.target, session_id=request.session_id,
                                      clock=time.perf_counter)
        # 3. the model drafter, where it may beat that
        model = ask_model(self.model, ctx, k, cache.candidate(plain), prices, acceptance=request.model_acceptance,
                          caught_up=request.model_drafted, ask=self.ask, pricing=self.pricing,
                          clock=time.perf_counter)
        # 4. the record observe learns from
        request.decision = decide(prices, cache, model, time.perf_counter() - begun - model.draft_s)
        best = model.best
        if best.source != "cache":
            return best.draft
        judged = ChosenDraftFeatures(cache.features, len(cache.proposal), best.choice.expected_tokens - 1.0,
                                     prices.rate)
        return replace(best.draft, features=judged, survival=cache.plan.survival)

    def _whole_pays(self, cost: CostModel, k: int) -> bool:
        """Whether a cache proposal is better verified whole than planned: verifying all ``k`` tokens costs, beyond
        a plain step, no more than the policy's planning (its timed seconds on a planned proposal less those on
        one taken whole), both in plain steps. A plan can save at most that verification (and its trees did not
        make up for the planning on a GPU's profile); until both are timed, proposals are planned. Only where
        ``config.whole_proposals`` allows it (by default: costs calibrated to the engine)."""
        allowed = self.config.whole_proposals
        if not (self.pricing.calibrate if allowed is None else allowed):
            return False
        step_s = self.pricing.calibration.step_s
        if self.plan.seconds.value <= 0.0 or step_s <= 0.0:
            return False
        return float(cost.verify(k)) - 1.0 <= self.plan.cost(step_s)

    # ------------------------------------------------------------------ learning from the outcome

    def observe(self, outcome: DraftOutcome) -> None:
        """Learn from the step's outcome (after every verification, proposed or not), part by part, and time the
        step when the engine timed its verification (``outcome.verify_s > 0``).

        Raises:
            ValueError: ``outcome.req_id`` is not started.
        """
        request = self._request(outcome.req_id, "observe")
        proposed, request.decision = request.decision, None
        step = proposed if proposed is not None else StepDecision()
        self.cache_phase.observe(outcome, step, request.session_id)
        if self.model is not None:  # it sees every outcome: it must follow the context
            self.model.observe(outcome)
        if step.source == "model" and outcome.draft.token_ids:
            self._learn_model_acceptance(request, outcome)
        self._learn_gates(step, outcome, max(self.rate.rate, 1.0))  # at R as the step was priced
        self.rate.observe(len(outcome.new_token_ids), step.cost)
        request.target = _target_signal(outcome)
        request.model_drafted = step.source == "model"
        if proposed is not None and outcome.verify_s > 0.0:  # timed by the engine (0: not measured)
            self.pricing.observe_step(outcome.verify_s + step.policy_s, step.verified)

    def _learn_gates(self, step: StepDecision, outcome: DraftOutcome, rate: float) -> None:
        """Each gate learns what its work brought this step (nothing where its draft was not verified) and took."""
        verified = bool(outcome.draft.token_ids)
        used = step.source == "cache" and verified
        if step.ask_cost is not None:  # a gated ask: what it brought (nothing when it drafted nothing)
            drafted = step.source == "model" and verified
            self.ask.observe(ask_gain(outcome.num_accepted, step.cost, step.ask_cost, rate) if drafted else 0.0)
        if step.short:  # beyond a plain step; judging is charged to its own gate
            gain = outcome.num_accepted - rate * (step.cost - 1.0) if used else 0.0
            self.short.observe(gain, step.policy_s - step.judge_s)
        if step.judge_s > 0.0:  # what the judged alternatives brought beyond their verification
            taken = len(set(step.judged).intersection(outcome.draft.path(outcome.new_token_ids))) if used else 0
            self.judging.observe(taken - rate * step.judged_cost if used else 0.0, step.judge_s)
        if step.plan:  # the policy's seconds on the proposal, planned or whole
            (self.plan.seconds if step.plan == "planned" else self.plan.baseline).observe(step.policy_s)

    def _learn_model_acceptance(self, request: _HybridRequestState, outcome: DraftOutcome) -> None:
        """Move the model drafter's running acceptance (the request's and across requests) by its draft's
        outcome: accepted tokens over tries until a rejection (a geometric count)."""
        drafted = outcome.draft.main_length  # a tree's first-token alternatives are not part of the chain's rate
        trials = outcome.num_accepted + int(outcome.num_accepted < drafted)
        observed = outcome.num_accepted / trials
        ema = self.config.model_rate_ema
        request.model_acceptance += ema * (observed - request.model_acceptance)
        self.model_acceptance += ema * (observed - self.model_acceptance)


def _target_signal(outcome: DraftOutcome) -> TargetSignal | None:
    """The target's signal at the last emitted token, when the engine reported it."""
    if outcome.target_logprob is None or outcome.target_entropy is None:
        return None
    return TargetSignal(outcome.target_logprob, outcome.target_entropy)
