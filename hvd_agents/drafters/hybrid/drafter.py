"""The HVD drafter (method ``hvd``): payoff-guided choice between a cache draft, a model draft or none.

Each step:

1. the cache drafter (:class:`~hvd_agents.drafters.cache.suffix.SuffixDrafter`)
   proposes up to ``k`` tokens with its features;
2. the payoff predictor turns the features (plus the target's signal from the
   previous verification) into survival probabilities ``S_i`` BEFORE any
   verification, and the selection rule (:mod:`hvd_agents.policy.selection`)
   picks the length with the best expected tokens per unit of cost;
3. when a model drafter is configured: where no cache draft pays, it is asked,
   and its first forward decides: it drafts iff its own confidence in its first
   token (its *reach*, :mod:`hvd_agents.drafters.model.loop`) makes the step
   beat a plain one (``1 + p - R * verify(1) > 1 - R``), then goes on while
   further tokens pay; where a cache draft pays, the model drafter only runs
   (and costs its forwards) when its running per-token acceptance in this
   request says it beats that draft, and then under the same first-token rule
   against the cache draft's value. A drafter forward costs about a tenth of a
   target step, and the drafter's confidence tells the steps it gets right from
   those it does not far better than its average acceptance does;
4. otherwise no draft: a plain decoding step.

Where the cache drafter's candidates disagree, the chosen cache draft grows into
a tree: each alternative continuation (:meth:`SuffixDrafter.alternatives`) keeps
tokens while its own survival pays for them, the same rule as the main branch.
An alternative that departs at position ``j`` survives its first token with
``S_{j-1} * (1 - h_j) * a`` (reach ``j``, the main token rejected there, then
this one is the target's choice), where ``a`` is the rate at which verified
alternatives were the target's choice, learned online from a prior of 0.1 (on
agent traces the candidates' shares barely predicted it: about 10% whatever the
share); later tokens survive with the main branch's hazards at the same depths.
Accepted alternatives and main tokens are disjoint events, so the tree's
expected tokens are one plus the sum of its tokens' survivals.

Observation feeds everything back: the cache drafter indexes the new tokens (and
learns from its own draft's outcome only when that draft was used), the
predictor takes an online step for the session, the rate estimate ``R`` moves,
and the model drafter sees every outcome (it must follow the context). Each
step is also timed: a measured profile is calibrated to what the engine's steps
cost (:mod:`hvd_agents.policy.calibration`), and a model drafter's tokens are
priced in the engine's plain steps.

Worked example (cost ``1 + 0.02 d``, ``R = 5``): a draft copied from an earlier
tool call with ``S = [0.97, 0.95, 0.9, 0.3, 0.08]`` keeps tokens while
``S_i > 0.1``: the target verifies 4 tokens, not 5 (and not K = 16).

Correctness does not depend on any of this: verification accepts exactly what the
target would have produced, whatever is drafted.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, Outcome
from hvd_agents.drafters.cache.suffix import Alternative, SuffixDrafter
from hvd_agents.policy.calibration import StepCalibration
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.features import CacheDraftFeatures, ChosenDraftFeatures, TargetSignal
from hvd_agents.policy.payoff import PayoffPredictor
from hvd_agents.policy.selection import Choice, RateEstimate, best_length, no_draft
from hvd_agents.structure import PromptStructure

MODEL_PRIOR_ACCEPTANCE = 0.5  # per-token acceptance assumed for a model drafter before any outcome
MODEL_RATE_EMA = 0.2
# A drafted token's cost in the engine's plain steps before it is timed: about one drafter forward per
# drafted token (`hvd-agents bench-model` reports the shipped head's drafting per step against a target step).
MODEL_PRIOR_TOKEN_COST = 0.1
# What the model drafter's catching up on one context token costs before it is timed, in plain steps: the
# new tokens go through the drafter in one batch, so each costs a small share of a drafted token's forward.
MODEL_PRIOR_INGEST_COST = 0.002
BRANCHES = 8  # alternative continuations a cache draft may grow into a tree
ALTERNATIVE_PRIOR = 0.1  # P(an alternative is the target's choice | the main token was rejected there)
ALTERNATIVE_EMA = 0.05
TIMING_EMA = 0.1


@dataclass
class _Step:
    """What was proposed in the current step (for observe)."""

    used: str = "none"  # "cache", "model" or "none"
    features: CacheDraftFeatures | None = None  # the cache draft's (with the target's signal)
    main: int = 0  # tokens of the cache draft's main branch
    cost: float = 1.0
    verified: int = 0  # draft tokens the target verifies (a tree's nodes included)
    started: float = 0.0  # perf_counter at propose
    draft_s: float = 0.0  # time the model drafter took


@dataclass
class _RequestState:
    session_id: str | None
    model_acceptance: float = MODEL_PRIOR_ACCEPTANCE
    target: TargetSignal | None = None
    step: _Step = field(default_factory=_Step)
    model_drafted: bool = False  # the previous step was a model draft (so the drafter is caught up)
    model_seen: int = 0  # context tokens when the model drafter last drafted (it has ingested them)


class HybridDrafter:
    """Payoff-guided hybrid drafting (see the module docstring).

    Args:
        cache: the cache drafter.
        predictor: the payoff predictor (packaged default weights when None).
        cost: the target's cost model, or a callable that returns it on first use
            (measuring a profile takes a few forwards, done lazily).
        model: an optional model drafter (its drafts carry their probabilities q).
        model_cost: the cost of a step with a model draft, drafting included;
            when None it is ``cost`` plus the model drafter's cost per drafted
            token, timed online against the engine's plain steps (starting from the
            drafter's ``cost_prior`` attribute, else :data:`MODEL_PRIOR_TOKEN_COST`;
            a draft is timed only when the drafter drafted at the step before, so
            catching up on the context since it last ran is not charged to its
            tokens). Its acceptance starts from the drafter's ``acceptance_prior``
            attribute when it has one (else 0.5) and is learned from its outcomes.
            The context the drafter must ingest before drafting (its ``pending(ctx)``
            when it has one, else the tokens since it last drafted) is charged to the
            step that drafts, per token timed online from catch-up drafts (starting
            from its ``ingest_cost_prior``, else :data:`MODEL_PRIOR_INGEST_COST`).
        branches: most alternative continuations a cache draft grows (0: chains only).
        calibrate: scale ``cost`` to what the engine's steps are timed to cost
            (:mod:`hvd_agents.policy.calibration`); by default only when ``cost`` is
            a callable (a profile measured on first use), not for a given CostModel.

    When a model drafter's ``propose`` takes ``min_survival`` (the project's
    model drafters do), it is told to stop drafting once its own estimate that
    the draft survives falls below what a token costs; when it also takes
    ``min_first``, the policy asks it wherever no cache draft pays and it drafts
    only when its first token is worth verifying (see
    :mod:`hvd_agents.drafters.model.loop`); any other Drafter works too, drafting
    where its running acceptance says it pays.
    """

    def __init__(
        self,
        cache: SuffixDrafter,
        predictor: PayoffPredictor | None = None,
        cost: CostModel | Callable[[], CostModel] | None = None,
        *,
        model: Drafter | None = None,
        model_cost: CostModel | Callable[[], CostModel] | None = None,
        branches: int = BRANCHES,
        calibrate: bool | None = None,
    ) -> None:
        self.cache = cache
        self.branches = branches
        self.alternative_rate = ALTERNATIVE_PRIOR
        self.predictor = predictor if predictor is not None else PayoffPredictor()
        self._cost = cost if cost is not None else CostModel.linear(0.02)
        # a profile measured on this machine is calibrated against the engine's step timings; a cost given as a
        # CostModel (trace replays, where no step is a forward) is taken as is
        self.calibrate = callable(cost) if calibrate is None else calibrate
        self.calibration = StepCalibration()
        self._calibrated: tuple[float, CostModel] | None = None  # (alpha, the profile scaled by it)
        self.model = model
        self._model_cost = model_cost
        self.rate = RateEstimate()
        # across requests: each request starts from it; a model drafter may know its own (a trained head's
        # held-out agreement with the target)
        self.model_acceptance = float(getattr(model, "acceptance_prior", None) or MODEL_PRIOR_ACCEPTANCE)
        self._token_cost_prior = float(getattr(model, "cost_prior", MODEL_PRIOR_TOKEN_COST))
        self._ingest_cost_prior = float(getattr(model, "ingest_cost_prior", MODEL_PRIOR_INGEST_COST))
        self._token_cost, self._ingest_cost = self._token_cost_prior, self._ingest_cost_prior
        self._untimed_model_cost: CostModel | None = None
        self._draft_token_s = 0.0  # EMA of a drafted token's seconds
        self._last_step: _Step | None = None
        self._drafting_cost: tuple[float, CostModel, CostModel] | None = None  # (per drafted token, cost, with it)
        takes = inspect.signature(model.propose).parameters if model is not None else {}
        self._takes_min_survival = "min_survival" in takes
        self._takes_min_first = self._takes_min_survival and "min_first" in takes
        self._requests: dict[str, _RequestState] = {}

    @property
    def profile(self) -> CostModel:
        """The target's cost model as given or measured (resolved on first use when given as a callable)."""
        if not isinstance(self._cost, CostModel):
            self._cost = self._cost()
        return self._cost

    @property
    def cost(self) -> CostModel:
        """The cost model the policy uses: :attr:`profile`, calibrated against the engine's step timings
        when ``calibrate`` (see :mod:`hvd_agents.policy.calibration`)."""
        profile = self.profile
        if not self.calibrate:
            return profile
        alpha = round(self.calibration.alpha, 2)  # the curve is rebuilt only when the calibration moves
        if alpha == 1.0:
            return profile
        if self._calibrated is None or self._calibrated[0] != alpha:
            self._calibrated = (alpha, profile.scaled(alpha))
        return self._calibrated[1]

    @property
    def uses_hidden_states(self) -> bool:
        """Whether the model drafter drafts from the target's hidden states."""
        return bool(getattr(self.model, "uses_hidden_states", False))

    def model_cost(self, timed: bool = True) -> CostModel:
        """The cost of a step with a model draft of ``d`` tokens, drafting included (``timed=False``:
        from the profile and the priors alone, no timing)."""
        if self._model_cost is not None:
            if not isinstance(self._model_cost, CostModel):
                self._model_cost = self._model_cost()
            return self._model_cost
        if not timed:
            if self._untimed_model_cost is None:
                self._untimed_model_cost = self.profile.with_drafting(self._token_cost_prior)
            return self._untimed_model_cost
        token_cost = round(self._token_cost, 3)  # the curve is rebuilt only when the timed cost moves
        cost = self.cost
        if self._drafting_cost is None or self._drafting_cost[0] != token_cost or self._drafting_cost[1] is not cost:
            self._drafting_cost = (token_cost, cost, cost.with_drafting(token_cost))
        return self._drafting_cost[2]

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        self.cache.start(req_id, prompt_ids, structure)
        if self.model is not None:
            self.model.start(req_id, prompt_ids, structure)
        session = structure.session_id if structure is not None else None
        self._requests[req_id] = _RequestState(session, model_acceptance=self.model_acceptance)
        self._last_step = None

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        state = self._requests.get(ctx.req_id)
        if state is None or k <= 0:
            return Draft()
        started = time.perf_counter()
        self._time_step(started)
        rate = max(self.rate.rate, 1.0)
        # Under sampling the drafts decide which random numbers are drawn, so a seeded request's output must not
        # depend on how long steps took: timings (calibration, the model drafter's timed costs) inform greedy
        # requests only, whose output never depends on the drafts.
        timed = ctx.temperature <= 0.0
        cost = self.cost if timed else self.profile
        best, draft, features = no_draft(cost, rate), Draft(), None
        cached = self.cache.propose(ctx, k)
        if cached.token_ids:
            features = cached.features.with_target(state.target)
            survival = self.predictor.survival(features, len(cached), state.session_id)
            choice = best_length(survival, cost, rate)
            if choice.length > 0 and choice.value > best.value:
                best, draft = choice, cached.truncated(choice.length)
                if self.branches:
                    alternatives = self.cache.alternatives(ctx.req_id, cached.token_ids, self.branches)
                    best, draft = _grow_tree(draft, best, alternatives, survival, self.alternative_rate, cost,
                                             rate, k)
        used = "cache" if draft.token_ids else "none"
        main = draft.main_length
        draft_s = 0.0
        model_cost = self.model_cost(timed) if self.model is not None else cost
        # with nothing better to verify, a drafter that can gate its first token on its own confidence is asked:
        # one drafter forward buys a per-step judgement instead of the running average acceptance
        gated = self._takes_min_first and used == "none"
        model_choice = None if gated else self._model_choice(state, k, rate, model_cost)
        pending = self._pending(state, ctx) if model_choice is not None or gated else 0
        # the context the drafter must ingest first, charged to this step
        catch_up = pending * (self._ingest_cost if timed else self._ingest_cost_prior)
        if gated or (model_choice is not None and model_choice.value - rate * catch_up > best.value):
            # a further token is worth its cost iff S > R * marginal (whether to draft at all was decided above,
            # so the first token's dearer share of the cost is not charged to the tokens after it)
            min_survival = rate * float(model_cost.marginal(2)[-1])
            model_started = time.perf_counter()
            if self._takes_min_first:
                # by its first token the drafter's forward is spent: the token is drafted iff, at the drafter's
                # confidence p, the step beats the best other choice: 1 + p - R * verify(1) > best
                min_first = best.value - 1.0 + rate * float(cost.verify(1))
                proposed = self.model.propose(ctx, k, min_survival=min_survival, min_first=min_first)
            elif self._takes_min_survival:
                proposed = self.model.propose(ctx, model_choice.length, min_survival=min_survival)
            else:
                proposed = self.model.propose(ctx, model_choice.length)
            draft_s = time.perf_counter() - model_started
            state.model_seen = len(ctx.token_ids)
            if proposed.token_ids:
                if state.model_drafted:  # caught up: no context to ingest beyond the last step's tokens
                    self._time_draft(draft_s, proposed.main_length)
                elif pending > 0 and self._draft_token_s:
                    self._time_ingest(draft_s - self._draft_token_s * proposed.main_length, pending)
                n = len(proposed)
                expected = 1.0 + float(_model_survival(state, proposed.main_length).sum())
                step_cost = float(model_cost.verify(n)) + catch_up
                best, draft, used = Choice(n, expected, step_cost, expected - rate * step_cost), proposed, "model"
        state.step = _Step(used, features, main if used == "cache" else 0, best.cost, len(draft), started, draft_s)
        self._last_step = state.step
        if used != "cache":
            return draft
        return Draft(draft.token_ids, draft.probs, draft.score, draft.source,
                     ChosenDraftFeatures(features, len(cached), best.expected_tokens - 1.0, rate), draft.parents)

    def _model_choice(self, state: _RequestState, k: int, rate: float, model_cost: CostModel) -> Choice | None:
        if self.model is None:
            return None
        survival = _model_survival(state, k)
        choice = best_length(survival, model_cost, rate)
        return choice if choice.length > 0 else None

    def _pending(self, state: _RequestState, ctx: DraftContext) -> int:
        """Context tokens the model drafter would ingest before drafting: its own count when it keeps
        one (``pending(ctx)``: a draft head and a draft LM keep theirs across requests), else those since it
        last drafted."""
        own = getattr(self.model, "pending", None)
        if own is not None:
            return int(own(ctx))
        return max(len(ctx.token_ids) - state.model_seen, 0)

    def _time_ingest(self, seconds: float, tokens: int) -> None:
        """Fold a catch-up's seconds (its drafted tokens' share taken out) per ingested token, in plain steps."""
        step_s = self.calibration.step_s
        if step_s > 0 and self._model_cost is None:
            per_token = max(seconds, 0.0) / tokens / step_s
            self._ingest_cost += TIMING_EMA * (per_token - self._ingest_cost)

    def _time_step(self, now: float) -> None:
        """Fold the time since the last propose (one target step, model drafting excluded) into the
        calibration of the cost profile and of the plain step's seconds."""
        last = self._last_step
        if last is not None and last.started:
            extra = self.profile.verify(last.verified) - 1.0 if last.verified else 0.0
            self.calibration.observe(now - last.started - last.draft_s, extra)
            self._update_token_cost()

    def _time_draft(self, seconds: float, tokens: int) -> None:
        per_token = seconds / max(tokens, 1)
        ema = self._draft_token_s
        self._draft_token_s = per_token if not ema else ema + TIMING_EMA * (per_token - ema)
        self._update_token_cost()

    def _update_token_cost(self) -> None:
        if self._draft_token_s and self.calibration.step_s > 0 and self._model_cost is None:
            self._token_cost = self._draft_token_s / self.calibration.step_s

    def observe(self, outcome: Outcome) -> None:
        state = self._requests.get(outcome.req_id)
        if state is None:
            return
        step, drafted = state.step, len(outcome.draft)
        from_cache = step.used == "cache"
        if from_cache and outcome.draft.is_tree:  # the cache drafter and the predictor learn from the main branch
            path = outcome.draft.path(outcome.new_token_ids)
            main_accepted = sum(1 for node in path if node < step.main)
            cache_outcome = Outcome(outcome.req_id, outcome.draft.main_branch(), main_accepted, outcome.new_token_ids)
            self._learn_alternatives(outcome.draft, step.main, main_accepted, set(path))
        elif from_cache:
            cache_outcome = outcome
        else:
            cache_outcome = Outcome(outcome.req_id, Draft(), 0, outcome.new_token_ids)
        self.cache.observe(cache_outcome)
        if self.model is not None:
            self.model.observe(outcome)
        if from_cache and drafted:
            self.predictor.update(step.features, len(cache_outcome.draft), cache_outcome.num_accepted,
                                  state.session_id)
        if step.used == "model" and drafted:
            drafted = outcome.draft.main_length  # a tree's first-token alternatives are not part of the chain's rate
            trials = outcome.num_accepted + int(outcome.num_accepted < drafted)  # geometric: tries until a rejection
            observed = outcome.num_accepted / trials
            state.model_acceptance += MODEL_RATE_EMA * (observed - state.model_acceptance)
            self.model_acceptance += MODEL_RATE_EMA * (observed - self.model_acceptance)
        self.rate.observe(len(outcome.new_token_ids), step.cost)
        state.target = _target_features(outcome)
        state.model_drafted = step.used == "model"
        state.step = _Step()

    def _learn_alternatives(self, draft: Draft, main: int, main_accepted: int, path: set[int]) -> None:
        """Move the alternative rate by the alternatives the target reached (its main token rejected there)."""
        for node, parent in enumerate(draft.parents or ()):
            if node < main or parent >= main or parent != main_accepted - 1:
                continue  # not an alternative's first token, or not where the main branch was rejected
            self.alternative_rate += ALTERNATIVE_EMA * (float(node in path) - self.alternative_rate)

    def stop(self, req_id: str) -> None:
        self.cache.stop(req_id)
        if self.model is not None:
            self.model.stop(req_id)
        self._requests.pop(req_id, None)


def _grow_tree(
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

    See the module docstring for the survival of an alternative's tokens; a token
    is added while its survival exceeds ``rate`` times what it adds to the cost.
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


def _model_survival(state: _RequestState, n: int) -> np.ndarray:
    """``[n]``: the chance a model draft survives its first 1..n tokens, at the request's running acceptance."""
    return np.cumprod(np.full(n, state.model_acceptance))


def _target_features(outcome: Outcome) -> TargetSignal | None:
    """The target's signal at the last emitted token, when the engine reported it."""
    if outcome.target_logprob is None or outcome.target_entropy is None:
        return None
    return TargetSignal(outcome.target_logprob, outcome.target_entropy)
