"""The ``hvd`` drafter's prices: one proposal's :class:`StepPrices`, from the curves of :mod:`hvd_agents.policy.cost`.

What a step costs has one home, :mod:`hvd_agents.policy.cost` (the verification curve, its
units, a request's share of a batched step). This module only turns it into the prices of
one ``hvd`` proposal, decided once at its start (:meth:`StepPricing.prices`), and keeps the
timings that move them. Every price is in units of one plain step of the engine (a step that
verifies no draft), so it compares directly with the rate ``R`` in tokens per step
(:mod:`hvd_agents.policy.selection`):

* **verifying** ``d`` draft tokens: the target's cost profile
  (:mod:`hvd_agents.policy.cost`; a callable is measured on first use), scaled
  to what the engine's steps are timed to cost when ``calibrate``
  (:mod:`hvd_agents.policy.calibration`: ``1 + alpha * (p(d) - 1)``);
* **a model draft's step**: that plus the model drafter's forwards, a drafted
  token costing its seconds per drafted token over the plain step's seconds
  (``T0``), from the drafter's ``cost_prior`` until timed;
* **catching up**: the context the model drafter must ingest before drafting
  (its ``pending`` tokens), each priced from its ``ingest_cost_prior`` until timed.

Timing. A step's seconds are the engine's verification seconds
(``DraftOutcome.verify_s``: the target's forward, acceptance and KV rollback) plus the
policy's own seconds in ``propose`` (cache drafting and the decision); model
drafting is timed apart, and whatever the stream's consumer does between steps
is in neither. Every time the model drafter is asked, drafted or not, its seconds
are folded in: per drafted token (an ask that drafted nothing ran one forward, so
it counts as one) when the drafter was caught up (it drafted at the step before,
or had at most :data:`CAUGHT_UP_TOKENS` context tokens to ingest, which go through
the same forward as its first token), else as the catch-up, per ingested token
(the drafted tokens' share taken out, at the prior until a drafted token is timed;
the first timed catch-up replaces the prior outright). So a gated drafter that is
asked at plain steps and mostly declines is still priced at what its forwards take,
and one whose catch-up is dear is priced so from its first one on.

Sampled requests price from the profile and the priors alone (``timed=False``):
under sampling the drafts decide which random numbers are drawn, so a seeded
request's output must not depend on how long steps took. A greedy request that is not
batched also weighs the policy's own timed work against its steps
(:attr:`StepPrices.times_itself`); a batched one is priced by the batch's step.

Worked example: a profile ``p(d) = 1 + 0.05 d`` calibrated to ``alpha = 0.4``
prices a 4-token cache draft at ``1 + 0.4 * 0.2 = 1.08`` plain steps; a model
drafter timed at 5 ms per drafted token against 100 ms plain steps adds 0.05 per
token, so a 4-token model draft costs ``1.08 + 0.2 = 1.28``, plus ``0.002`` per
context token it must ingest first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hvd_agents.drafters.base import DraftContext
from hvd_agents.policy.calibration import StepCalibration
from hvd_agents.policy.cost import CostModel

T = TypeVar("T")

# An ask with at most this many context tokens to ingest (a plain step's token and the one before) is timed as
# the drafter's forwards: the new tokens go through its first forward.
CAUGHT_UP_TOKENS = 2


@dataclass(frozen=True)
class StepPrices:
    """One proposal's prices, decided once at its start (:meth:`StepPricing.prices`).

    Attributes:
        rate: ``R``, the running tokens per plain step (at least 1).
        cost: verifying a draft of ``d`` tokens: the batch's step where batched, else the target's profile
            (calibrated to the engine's timings where ``timed``).
        model_cost: a step with a model draft of ``d`` tokens, drafting included.
        draft_token: one token the model drafter drafts, in plain steps of this request (its share of a batch's).
        ingest: one context token the model drafter ingests before drafting, in plain steps (before ``share``).
        share: this request's share of the step (1 unless batched).
        timed: the request is greedy: timings inform its prices (a sampled one's output must not depend on them).
        batched: the step is priced by the batch's (``DraftContext.step_cost``).
    """

    rate: float
    cost: CostModel
    model_cost: CostModel
    draft_token: float
    ingest: float
    share: float = 1.0
    timed: bool = True
    batched: bool = False

    @property
    def times_itself(self) -> bool:
        """Whether the policy weighs its own timed work against this request's steps: greedy, not batched."""
        return self.timed and not self.batched


class _Memo(Generic[T]):
    """The last value built and the key it was built for: a cost curve is rebuilt only when its key
    changes. The keys are rounded (``alpha`` to 2 decimals, a drafted token's cost to 3), so that
    estimates that barely move do not rebuild the curve at every step."""

    def __init__(self) -> None:
        self._key: Hashable = None
        self._value: T | None = None

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        if self._value is None or self._key != key:
            self._key, self._value = key, build()
        return self._value


class StepPricing:
    """Prices of verification, model drafting and catching up (see the module docstring).

    Args:
        cost: the target's cost model, or a callable that returns it on first use.
        model_cost: the cost of a step with a model draft, drafting included, taken as
            is (timed or not); when None it is built from ``cost`` and the timed
            per-token cost of drafting.
        calibrate: scale ``cost`` to the engine's step timings; by default only when
            ``cost`` is a callable (a profile measured on this machine), not for a
            given CostModel (trace replays, where no step is a forward).
        token_cost_prior: a drafted token's cost in plain steps until timed.
        ingest_cost_prior: one ingested context token's cost in plain steps until timed.
        timing_ema: the weight of the newest timed model draft.
    """

    def __init__(
        self,
        cost: CostModel | Callable[[], CostModel],
        *,
        model_cost: CostModel | Callable[[], CostModel] | None,
        calibrate: bool | None,
        token_cost_prior: float,
        ingest_cost_prior: float,
        timing_ema: float,
    ) -> None:
        self._cost = cost
        self._model_cost = model_cost
        self.calibrate = callable(cost) if calibrate is None else calibrate
        self.calibration = StepCalibration()
        self.token_cost_prior = token_cost_prior
        self.ingest_cost_prior = ingest_cost_prior
        self._timing_ema = timing_ema
        self._token_cost = token_cost_prior  # a drafted token, in plain steps (timed)
        self._ingest_cost = ingest_cost_prior  # an ingested context token, in plain steps (timed)
        self._draft_token_s = 0.0  # running mean of a drafted token's seconds (0: not timed yet)
        self._ingest_timed = False  # whether a catch-up has been timed (else the ingest cost is the prior)
        self._calibrated: _Memo[CostModel] = _Memo()  # by alpha: the profile scaled by it
        self._drafting: _Memo[CostModel] = _Memo()  # by (token cost, verification cost): the two together
        self._untimed_drafting: _Memo[CostModel] = _Memo()  # the profile with the prior token cost

    @property
    def profile(self) -> CostModel:
        """The target's cost model as given or measured (resolved on first use when given as a callable)."""
        if not isinstance(self._cost, CostModel):
            self._cost = self._cost()
        return self._cost

    def target_cost(self, timed: bool = True) -> CostModel:
        """Verifying a draft of ``d`` tokens: :attr:`profile`, calibrated against the engine's step timings
        when ``calibrate`` and ``timed``."""
        profile = self.profile
        if not timed or not self.calibrate:
            return profile
        alpha = round(self.calibration.alpha, 2)
        if alpha == 1.0:
            return profile
        return self._calibrated.get(alpha, lambda: profile.scaled(alpha))

    def model_cost(self, timed: bool = True) -> CostModel:
        """A step with a model draft of ``d`` tokens, drafting included (``timed=False``: from the profile
        and the prior alone)."""
        if self._model_cost is not None:
            if not isinstance(self._model_cost, CostModel):
                self._model_cost = self._model_cost()
            return self._model_cost
        if not timed:
            return self._untimed_drafting.get(None, lambda: self.profile.with_drafting(self.token_cost_prior))
        token_cost = round(self._token_cost, 3)
        cost = self.target_cost()
        return self._drafting.get((token_cost, cost), lambda: cost.with_drafting(token_cost))

    def prices(self, ctx: DraftContext, rate: float) -> StepPrices:
        """The prices of one proposal for ``ctx`` at rate ``rate`` (see :class:`StepPrices`)."""
        # Under sampling the drafts decide which random numbers are drawn, so a seeded request's output must not
        # depend on how long steps took: timings (calibration, the model drafter's timed costs) inform greedy
        # requests only, whose output never depends on the drafts.
        timed = ctx.temperature <= 0.0
        draft_token = self.draft_token_cost(timed) / ctx.step_share
        if ctx.step_cost is not None:  # batched: rows cost what they add to the batch's step
            cost, model_cost = ctx.step_cost, ctx.step_cost.with_drafting(draft_token)
        else:
            cost, model_cost = self.target_cost(timed), self.model_cost(timed)
        return StepPrices(rate, cost, model_cost, draft_token, self.ingest_cost(timed), ctx.step_share, timed,
                          ctx.step_cost is not None)

    def draft_token_cost(self, timed: bool = True) -> float:
        """One token the model drafter drafts, in plain steps (``timed=False``: the prior)."""
        return self._token_cost if timed else self.token_cost_prior

    def ingest_cost(self, timed: bool = True) -> float:
        """One context token the model drafter must ingest before drafting, in plain steps."""
        return self._ingest_cost if timed else self.ingest_cost_prior

    def observe_step(self, seconds: float, verified: int) -> None:
        """Fold in one step's ``seconds`` (verification and the policy, model drafting excluded) for a
        draft of ``verified`` tokens (a tree's nodes included)."""
        extra = self.profile.verify(verified) - 1.0 if verified else 0.0
        self.calibration.observe(seconds, extra)
        self._update_token_cost()

    def observe_model_draft(self, seconds: float, drafted: int, pending: int, caught_up: bool) -> None:
        """Fold in an ask of the model drafter that took ``seconds`` and drafted ``drafted`` chain tokens (0: it
        declined after its first forward), after ``pending`` context tokens to ingest; ``caught_up``: the drafter
        drafted at the step before."""
        if caught_up or pending <= CAUGHT_UP_TOKENS:  # no context to ingest beyond a step's tokens: its forwards'
            per_token = seconds / max(drafted, 1)
            ema = self._draft_token_s
            self._draft_token_s = per_token if not ema else ema + self._timing_ema * (per_token - ema)
            self._update_token_cost()
        elif pending > 0:  # a catch-up: its drafted tokens' share taken out (at the prior until one is timed)
            step_s = self.calibration.step_s
            if step_s > 0 and self._model_cost is None:
                token_s = self._draft_token_s or self.token_cost_prior * step_s
                per_token = max(seconds - token_s * max(drafted, 1), 0.0) / pending / step_s
                # the first timed catch-up replaces the prior: priced at the prior, a drafter whose catch-up costs
                # several plain steps would be asked again and again before a running mean caught up with it
                if self._ingest_timed:
                    self._ingest_cost += self._timing_ema * (per_token - self._ingest_cost)
                else:
                    self._ingest_cost, self._ingest_timed = per_token, True

    def _update_token_cost(self) -> None:
        if self._draft_token_s and self.calibration.step_s > 0 and self._model_cost is None:
            self._token_cost = self._draft_token_s / self.calibration.step_s
