"""The HVD drafter (method ``hvd``): payoff-guided choice between a cache draft, a model draft or none.

Each ``propose`` is four phases (:meth:`HybridDrafter.propose`), unless planning cannot pay: where
verifying all ``k`` tokens costs, beyond a plain step, no more than the policy's own timed work on a
planned proposal (a GPU's nearly flat profile), the cache drafter's proposal is verified as it is.

1. **the cache draft and its payoff**: the cache drafter
   (:class:`~hvd_agents.drafters.cache.suffix.SuffixDrafter`) proposes up to ``k``
   tokens with their features; the payoff predictor turns the features (plus the
   target's signal from the previous verification) into survival probabilities
   ``S_i`` BEFORE any verification;
2. **the tree and its cut**: where the cache drafter's candidates disagree, the
   other candidates' continuations branch off the proposal where they depart
   (:mod:`.tree`), each judged by the predictor too as a proposal of its own
   (for greedy requests, while that pays for its host work: :mod:`.ask`); the
   nodes of that tree, best first, are cut at the count with
   the best value ``E[tokens] - R * cost`` (:mod:`hvd_agents.policy.selection`'s
   rule), at most ``k`` of them, or dropped when a plain step is worth more;
3. **the model drafter** (:class:`~hvd_agents.drafters.model.protocol.ModelDrafter`),
   when there is one: where no cache draft pays, a drafter that gates its first
   token is asked while asking pays (:mod:`.ask`: the running gain of an ask against
   ``R`` times its timed forward and catch-up, both spent whether or not it drafts),
   and its first forward decides: it drafts iff its own confidence in its first
   token (its *reach*, :mod:`hvd_agents.drafters.model.loop`) makes the step beat a
   plain one (``1 + p - R * verify(1) > 1 - R``), then goes on while further tokens
   pay; otherwise (a cache draft pays, or the drafter cannot gate) it only runs, and
   costs its forwards, when its running per-token acceptance in this request says it
   beats the best draft so far, catching up on the context it has not seen included.
   The drafter's confidence tells the steps it gets right from those it does not far
   better than its average acceptance does;
4. **the record**: what was chosen and what it cost is kept with the request as a
   :class:`StepDecision`, for ``observe``.

No draft means a plain decoding step. Prices come from :mod:`.pricing` (the
target's profile calibrated to the engine's step timings, the model drafter's
timed costs), tuning from :class:`~.config.HybridConfig`.

``observe`` feeds the outcome back: the cache drafter indexes the new tokens (and
learns from its own draft's outcome only when that draft was used), the predictor
takes an online step for the session, the model drafter sees every outcome (it
must follow the context) and its running acceptance moves after its own drafts,
a tree's tried alternatives move the alternative rate, the rate estimate ``R``
moves, and the step's seconds calibrate the prices.

Lifecycle: ``start``, then ``propose`` (skipped when the engine has no room for a
draft) and ``observe`` once per step, then ``stop``; ``propose`` or ``observe``
for a request that is not started raises, ``stop`` is safe to call twice.

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
from dataclasses import dataclass, field, replace

import numpy as np

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, DraftOutcome, started
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.ask import AskGain, ask_gain
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.hybrid.pricing import StepPricing
from hvd_agents.drafters.hybrid.probe import CacheProbe
from hvd_agents.drafters.hybrid.tree import AlternativeRates, plan_tree
from hvd_agents.drafters.model.protocol import ModelDrafter, as_model_drafter
from hvd_agents.policy.calibration import StepCalibration
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.features import CacheDraftFeatures, ChosenDraftFeatures, TargetSignal
from hvd_agents.policy.payoff import PayoffPredictor
from hvd_agents.policy.selection import Choice, RateEstimate, best_length, no_draft
from hvd_agents.policy.survival_calibration import SurvivalCalibration
from hvd_agents.structure import PromptStructure


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
        predicted: the predictor's expected accepted length of that whole proposal (None: no proposal).
        ask_cost: where a gated model drafter was asked with nothing better to verify, what the ask cost in
            plain steps as priced (its forward and its catch-up); None where it was not asked so.
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
class _Candidate:
    """A draft the step could verify, with its figures."""

    source: str  # "cache", "model" or "none"
    choice: Choice
    draft: Draft = field(default_factory=Draft)


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
        cost: the target's cost model, or a callable that returns it on first use
            (measuring a profile takes a few forwards, done lazily); a linear
            ``1 + c d`` (``config.default_verify_cost``) when None.
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
            ``cost`` is a callable (a profile measured on first use).
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
        # what asking a gated model drafter brings, across requests (see .ask)
        self.ask = AskGain(config.model_ask_gain_prior, config.model_ask_ema, config.model_ask_explore)
        # what a cache proposal of a short match brings (see .ask), and the policy's seconds computing one
        self.short = AskGain(config.short_gain_prior, config.short_gain_ema, config.short_gain_explore)
        self.short_seconds = 0.0
        # what judging the alternatives with the predictor brings, across requests (see .ask), and its seconds
        self.judging = AskGain(config.judge_gain_prior, config.judge_gain_ema, config.judge_gain_explore)
        self.judge_seconds = 0.0
        # the policy's running seconds on a cache proposal, planned and taken whole (see _whole_pays)
        self.plan_seconds = 0.0
        self.whole_seconds = 0.0
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
        # Under sampling the drafts decide which random numbers are drawn, so a seeded request's output must not
        # depend on how long steps took: timings (calibration, the model drafter's timed costs) inform greedy
        # requests only, whose output never depends on the drafts.
        timed = ctx.temperature <= 0.0
        rate = max(self.rate.rate, 1.0)
        batched = ctx.step_cost is not None  # priced by the batch's step: rows cost what they add to it
        cost = ctx.step_cost if batched else self.pricing.target_cost(timed)

        # 0. where verifying the whole proposal costs less beyond a plain step than planning it would, it is
        # verified as it is (a GPU's flat profile); greedy requests alone: the work is timed
        if timed and not batched and self._whole_pays(cost, k):
            whole = self.cache.propose(ctx, k, described=False)
            if whole.token_ids:
                n = len(whole)
                request.decision = StepDecision("cache", None, n, float(cost.verify(n)), n, 0.0,
                                                time.perf_counter() - begun, whole.token_ids, plan="whole")
                return whole

        # 1. the cache draft and its payoff; a short match's only while what such proposals bring pays for the
        # policy's work on them (greedy requests alone: the work is timed)
        gate = self.config.short_match
        skip_short = gate > 0 and timed and not batched and not self.short.pays(rate, self._short_cost())
        cached = self.cache.propose(ctx, k, min_match=gate + 1) if skip_short else self.cache.propose(ctx, k)
        if skip_short and not cached.token_ids and cached.score > 0:
            self.short.skipped()
        short = bool(cached.token_ids) and gate > 0 and cached.score <= gate
        features = cached.features.with_target(request.target) if cached.token_ids else None
        best = _Candidate("none", no_draft(cost, rate))
        survival = np.zeros(0)
        node_survival: tuple[float, ...] = ()
        cache_main = 0
        forks: tuple[tuple[int, float], ...] = ()
        beyond: tuple[tuple[int, int], ...] = ()
        judged_nodes: tuple[int, ...] = ()
        judged_cost = 0.0
        judging_s = 0.0  # the seconds spent judging alternatives this step
        judging_gated = timed and not batched and self.pricing.calibrate  # judging weighed against timed steps
        if cached.token_ids:
            hazards = self.predictor.hazards(features, len(cached), request.session_id)
            predicted_survival = np.cumprod(hazards)
            survival = predicted_survival
            if self.survival_calibration is not None:
                survival = self.survival_calibration.apply(predicted_survival)
            # 2. the tree over the candidates, cut at the node count with the best value, or dropped; an alternative
            # survives at most as long as the main branch before it, so only where that could pay is one read
            reach = _paying_reach(survival, cost, rate, k)
            alternatives = (self.cache.alternatives(ctx.req_id, cached.token_ids[:reach], self.config.branches)
                            if self.config.branches and reach else [])
            # alternatives judged by the predictor too; for greedy requests only while that pays for its host work
            judge = None
            if self.config.judge_alternatives and alternatives:
                if not judging_gated or self.judging.pays(rate, self._judge_cost()):
                    def judge(i: int) -> np.ndarray | None:  # the alternative's path as the predictor sees it
                        nonlocal judging_s
                        judging = time.perf_counter()
                        described = self.cache.described(ctx, cached, alternatives[i])
                        path = None
                        if described is not None:
                            path = np.cumprod(self.predictor.hazards(described.with_target(request.target),
                                                                     len(described.probs), request.session_id))
                            calibration = self.survival_calibration
                            path = calibration.apply(path) if calibration is not None else path
                        judging_s += time.perf_counter() - judging
                        return path
                else:
                    self.judging.skipped()
            plan = plan_tree(cached, survival, alternatives, self.alternatives, cost, rate, k, judge)
            if plan.choice.length > 0 and plan.choice.value > best.choice.value:
                best = _Candidate("cache", plan.choice, plan.draft)
                node_survival, cache_main, forks, beyond = plan.survival, plan.main, plan.forks, plan.beyond
                judged_nodes = plan.judged
                judged_cost = plan.choice.cost - float(cost.verify(plan.choice.length - len(judged_nodes)))

        # 3. the model drafter, where it may beat that
        model_cost = (ctx.step_cost.with_drafting(self.pricing.draft_token_cost(timed) / ctx.step_share) if batched
                      else self.pricing.model_cost(timed))
        best, draft_s, ask_cost = self._ask_model(ctx, k, request, best, cost, model_cost, rate, timed)

        # 4. the record observe learns from
        policy_s = time.perf_counter() - begun - draft_s
        main = cache_main if best.source == "cache" else 0
        predicted = float(survival.sum()) if cached.token_ids else None
        raw = tuple(predicted_survival.tolist()) if cached.token_ids else ()
        cache_used = best.source == "cache"
        request.decision = StepDecision(best.source, features, main, best.choice.cost, len(best.draft), draft_s,
                                        policy_s, cached.token_ids, predicted, ask_cost, raw,
                                        tuple(hazards.tolist()) if cached.token_ids else (),
                                        forks if cache_used else (), beyond if cache_used else (), short,
                                        "planned" if cached.token_ids and timed and not batched else "",
                                        judging_s if judging_gated else 0.0,
                                        judged_nodes if cache_used else (), judged_cost if cache_used else 0.0)
        if best.source != "cache":
            return best.draft
        judged = ChosenDraftFeatures(features, len(cached), best.choice.expected_tokens - 1.0, rate)
        return replace(best.draft, features=judged, survival=node_survival)

    def _ask_model(self, ctx: DraftContext, k: int, request: _HybridRequestState, best: _Candidate, cost: CostModel,
                   model_cost: CostModel, rate: float, timed: bool) -> tuple[_Candidate, float, float | None]:
        """Phase 3: the model drafter's draft when it is asked and drafts, else ``best``; the seconds it took;
        and, where a gated drafter was asked with nothing better to verify, what the ask cost (else None)."""
        model = self.model
        if model is None:
            return best, 0.0, None
        # with nothing better to verify, a drafter that gates its first token on its own confidence may be asked:
        # one drafter forward buys a per-step judgement instead of the running average acceptance
        gated = model.gates_first_token and best.source == "none"
        if gated and ctx.step_cost is not None and 2.0 - rate * float(model_cost.verify(1)) <= best.choice.value:
            return best, 0.0, None  # in a batch whose rows are dear, not even a certain first token would pay
        choice = None if gated else self._model_choice(request, k, rate, model_cost)
        if choice is None and not gated:
            return best, 0.0, None
        pending = model.pending(ctx)
        catch_up = pending * self.pricing.ingest_cost(timed) / ctx.step_share  # the context to ingest first
        if not gated and choice.value - rate * catch_up <= best.choice.value:
            return best, 0.0, None
        ask_cost = None
        if gated:  # the forward and the catch-up are spent whether or not it drafts: ask only where asking pays
            ask_cost = self.pricing.draft_token_cost(timed) / ctx.step_share + catch_up
            if not self.ask.pays(rate, ask_cost):
                self.ask.skipped()
                return best, 0.0, None
        # a further token is worth its cost iff S > R * marginal (whether to draft at all was decided above, so the
        # first token's dearer share of the cost is not charged to the tokens after it)
        min_survival = rate * float(model_cost.marginal(2)[-1])
        drafting = time.perf_counter()
        if model.gates_first_token:
            # by its first token the drafter's forward is spent: the token is drafted iff, at the drafter's
            # confidence p, the step beats the best other choice: 1 + p - R * verify(1) > best
            min_first = best.choice.value - 1.0 + rate * float(cost.verify(1))
            proposed = model.propose(ctx, k, min_survival=min_survival, min_first=min_first)
        else:
            proposed = model.propose(ctx, choice.length, min_survival=min_survival)
        draft_s = time.perf_counter() - drafting
        self.pricing.observe_model_draft(draft_s, proposed.main_length, pending, caught_up=request.model_drafted)
        if not proposed.token_ids:
            return best, draft_s, ask_cost
        n = len(proposed)
        survival = _model_survival(request, proposed.main_length)
        proposed = replace(proposed, survival=tuple(float(p) for p in survival))
        expected = 1.0 + float(survival.sum())
        step_cost = float(model_cost.verify(n)) + catch_up
        candidate = _Candidate("model", Choice(n, expected, step_cost, expected - rate * step_cost), proposed)
        return candidate, draft_s, ask_cost

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
        if self.plan_seconds <= 0.0 or step_s <= 0.0:
            return False
        planning = max(self.plan_seconds - self.whole_seconds, 0.0) / step_s
        return float(cost.verify(k)) - 1.0 <= planning

    def _judge_cost(self) -> float:
        """The policy's work judging a step's alternatives, in plain steps (0 until both are timed)."""
        step_s = self.pricing.calibration.step_s
        return self.judge_seconds / step_s if step_s > 0 else 0.0

    def _short_cost(self) -> float:
        """The policy's work on a short match's proposal, in plain steps (0 until both are timed)."""
        step_s = self.pricing.calibration.step_s
        return self.short_seconds / step_s if step_s > 0 else 0.0

    def _model_choice(self, request: _HybridRequestState, k: int, rate: float, model_cost: CostModel) -> Choice | None:
        """The best model draft length by the request's running acceptance (None: no length pays)."""
        choice = best_length(_model_survival(request, k), model_cost, rate)
        return choice if choice.length > 0 else None

    def observe(self, outcome: DraftOutcome) -> None:
        """Learn from the step's outcome (after every verification, proposed or not), and time the step
        when the engine timed its verification (``outcome.verify_s > 0``).

        Raises:
            ValueError: ``outcome.req_id`` is not started.
        """
        request = self._request(outcome.req_id, "observe")
        proposed, request.decision = request.decision, None
        step = proposed if proposed is not None else StepDecision()
        # the cache drafter and the predictor learn from the cache draft's main branch, and only when it was used
        cache_outcome = self._cache_outcome(outcome, step)
        self.cache.observe(cache_outcome)
        if self.model is not None:
            self.model.observe(outcome)
        if step.source == "cache" and step.features is not None and outcome.draft.token_ids:
            self.predictor.update(step.features, len(cache_outcome.draft), cache_outcome.num_accepted,
                                  request.session_id, np.asarray(step.hazards))
            if self.survival_calibration is not None and step.main:
                self.survival_calibration.observe(np.asarray(step.survival[: step.main]), cache_outcome.num_accepted)
        if step.source == "model" and outcome.draft.token_ids:
            self._learn_model_acceptance(request, outcome)
        rate = max(self.rate.rate, 1.0)  # as the step was priced
        if step.ask_cost is not None:  # a gated ask: what it brought (nothing when it drafted nothing)
            drafted = step.source == "model" and bool(outcome.draft.token_ids)
            self.ask.observe(ask_gain(outcome.num_accepted, step.cost, step.ask_cost, rate) if drafted else 0.0)
        if step.short:  # what the short match's proposal brought beyond a plain step (nothing unless verified)
            used = step.source == "cache" and bool(outcome.draft.token_ids)
            self.short.observe(outcome.num_accepted - rate * (step.cost - 1.0) if used else 0.0)
            seconds = step.policy_s - step.judge_s  # judging is charged to its own gate
            if self.short_seconds:
                self.short_seconds += self.config.short_gain_ema * (seconds - self.short_seconds)
            else:
                self.short_seconds = seconds
        if step.judge_s > 0.0:  # what the judged alternatives brought beyond their verification (nothing unverified)
            used = step.source == "cache" and bool(outcome.draft.token_ids)
            taken = len(set(step.judged).intersection(outcome.draft.path(outcome.new_token_ids))) if used else 0
            self.judging.observe(taken - rate * step.judged_cost if used else 0.0)
            ema = self.config.judge_gain_ema
            self.judge_seconds += ema * (step.judge_s - self.judge_seconds) if self.judge_seconds else step.judge_s
        if step.plan:  # the policy's seconds on the proposal, planned or whole
            seconds = step.policy_s
            ema = self.config.plan_ema
            if step.plan == "planned":
                self.plan_seconds += ema * (seconds - self.plan_seconds) if self.plan_seconds else seconds
            else:
                self.whole_seconds += ema * (seconds - self.whole_seconds) if self.whole_seconds else seconds
        self.rate.observe(len(outcome.new_token_ids), step.cost)
        request.target = _target_signal(outcome)
        request.model_drafted = step.source == "model"
        if proposed is not None and outcome.verify_s > 0.0:  # timed by the engine (0: not measured)
            self.pricing.observe_step(outcome.verify_s + step.policy_s, step.verified)

    def _cache_outcome(self, outcome: DraftOutcome, step: StepDecision) -> DraftOutcome:
        """The outcome as the cache drafter sees it: its main branch's (the tree's verified alternatives move the
        alternative rates), an empty draft's when it was not used or the step verified alternatives only."""
        draft = outcome.draft
        if step.source != "cache" or step.main == 0:
            if step.source == "cache":
                self.alternatives.observe(draft, 0, outcome.new_token_ids, step.cache_tokens, step.forks, step.beyond)
            return DraftOutcome(outcome.req_id, Draft(), 0, outcome.new_token_ids)
        if step.main >= len(draft):
            return outcome
        self.alternatives.observe(draft, step.main, outcome.new_token_ids, step.cache_tokens, step.forks,
                                step.beyond)
        main_accepted = sum(1 for node in draft.path(outcome.new_token_ids) if node < step.main)
        main = Draft(draft.token_ids[: step.main], None, draft.score, draft.source, draft.features)
        return DraftOutcome(outcome.req_id, main, main_accepted, outcome.new_token_ids)

    def _learn_model_acceptance(self, request: _HybridRequestState, outcome: DraftOutcome) -> None:
        """Move the model drafter's running acceptance (the request's and across requests) by its draft's
        outcome: accepted tokens over tries until a rejection (a geometric count)."""
        drafted = outcome.draft.main_length  # a tree's first-token alternatives are not part of the chain's rate
        trials = outcome.num_accepted + int(outcome.num_accepted < drafted)
        observed = outcome.num_accepted / trials
        ema = self.config.model_rate_ema
        request.model_acceptance += ema * (observed - request.model_acceptance)
        self.model_acceptance += ema * (observed - self.model_acceptance)


def _paying_reach(survival: np.ndarray, cost: CostModel, rate: float, k: int) -> int:
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


def _model_survival(request: _HybridRequestState, n: int) -> np.ndarray:
    """``[n]``: the chance a model draft survives its first 1..n tokens, at the request's running acceptance."""
    return np.cumprod(np.full(n, request.model_acceptance))


def _target_signal(outcome: DraftOutcome) -> TargetSignal | None:
    """The target's signal at the last emitted token, when the engine reported it."""
    if outcome.target_logprob is None or outcome.target_entropy is None:
        return None
    return TargetSignal(outcome.target_logprob, outcome.target_entropy)
