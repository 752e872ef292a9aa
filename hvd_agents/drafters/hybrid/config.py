"""Every prior, running-estimate weight and limit of the ``hvd`` drafter, in one frozen record.

Estimators the policy shares with other code keep their own constants next to
them: the running rate ``R`` (:data:`hvd_agents.policy.selection.RATE_EMA`), the
step calibration (:mod:`hvd_agents.policy.calibration`) and the payoff
predictor's online step (:mod:`hvd_agents.policy.payoff`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hvd_agents.drafters.model.protocol import DEFAULT_INGEST_COST_PRIOR, DEFAULT_TOKEN_COST_PRIOR
from hvd_agents.policy.cost import FALLBACK_VERIFY_COST


@dataclass(frozen=True)
class HybridConfig:
    """The ``hvd`` drafter's tuning (the defaults are what it ships with)."""

    default_verify_cost: float = FALLBACK_VERIFY_COST
    """Per-token verification cost ``c`` of the linear cost model used when no cost is given: the order of
    a small model's on a CPU at batch 1 (a measured profile replaces it in the engine)."""

    model_prior_acceptance: float = 0.5
    """A model drafter's per-token acceptance before any outcome, when it declares none
    (``acceptance_prior`` None): an even chance, which lets a confident first token decide early steps."""

    model_rate_ema: float = 0.2
    """Weight of the newest model draft in the running acceptance (per request and across requests): a model
    drafter's acceptance moves with the text, so a handful of drafts should be enough to follow it."""

    model_prior_token_cost: float = DEFAULT_TOKEN_COST_PRIOR
    """A drafted token's cost in plain steps, before it is timed, for a drafter wrapped in
    :class:`~hvd_agents.drafters.model.protocol.PlainModelDrafter` (a declared drafter brings its own
    ``cost_prior``): about one drafter forward per drafted token."""

    model_prior_ingest_cost: float = DEFAULT_INGEST_COST_PRIOR
    """One context token's catch-up cost in plain steps, before it is timed, for a wrapped drafter: the new
    tokens go through the drafter in one batch, so each costs a small share of a forward."""

    model_ask_gain_prior: float = 0.5
    """What asking a gated model drafter brings, in tokens per step before the ask's own cost, before any ask
    (:mod:`~hvd_agents.drafters.hybrid.ask`): optimistic, so a drafter is asked at first and shows what it is
    worth."""

    model_ask_ema: float = 0.2
    """Weight of the newest ask in that running gain: a handful of asks decide whether asking pays."""

    model_ask_explore: float = 0.02
    """Weight with which a step that could have asked and did not moves the running gain back towards its prior,
    so a drafter priced out by a bad stretch is asked again after a few dozen such steps."""

    short_match: int = 1
    """Cache proposals whose longest match is at most this many tokens are gated (:mod:`~hvd_agents.drafters.hybrid.ask`):
    their features, prediction and tree are computed only while what they bring pays for that work (0: never gated).
    On free text a one-token match is found at most steps and rarely drafts anything worth its verification."""

    short_gain_prior: float = 0.5
    """What a gated cache proposal brings, in tokens per step beyond a plain step and before its own host work,
    before any is seen: optimistic, so they are computed at first and show what they are worth."""

    short_gain_ema: float = 0.1
    """Weight of the newest gated proposal in that running gain."""

    short_gain_explore: float = 0.01
    """Weight with which a skipped gated proposal moves the running gain back towards its prior, so the class is
    computed again now and then and can show it has become worth it."""

    whole_proposals: bool | None = None
    """Whether a cache proposal may be verified whole where planning it costs more than it can save
    (:meth:`HybridDrafter.propose`). None: where the costs are calibrated to this engine (a measured profile, as
    the engine's own); with a given cost model (tests, trace replays) every proposal is planned, so that the
    decisions do not depend on how long the policy's work took."""

    plan_ema: float = 0.1
    """Weight of the newest step in the running seconds of the policy's work on a cache proposal, planned
    (predictor, tree, cut) and taken whole: where verifying the whole proposal costs less beyond a plain step
    than planning it costs, the proposal is verified as it is (:meth:`HybridDrafter.propose`)."""

    branches: int = 8
    """Most alternative continuations a cache draft grows into a tree (0: chains only). Each is kept only
    while its tokens pay, so the limit bounds the policy's work, not the verified tokens."""

    judge_alternatives: bool = True
    """Price a candidate's alternative with the payoff predictor too: its features as the proposal's would be
    had that candidate been the main branch, its first token surviving the mean of the rates' chance and the
    predictor's, its later tokens by the predictor's hazards (:func:`~.tree.plan_tree`). Only those whose first
    token could pay are judged; for greedy requests priced by the engine's timed steps, only while what the judged
    alternatives bring pays for the host work of judging them (:mod:`~hvd_agents.drafters.hybrid.ask`); with a given
    cost model (tests, trace replays) always, so that the decisions do not depend on how long that work took."""

    judge_gain_prior: float = 0.5
    """What the judged alternatives of a step bring, in tokens beyond their verification and before the host work
    of judging them, before any is seen: optimistic, so they are judged at first and show what they are worth."""

    judge_gain_ema: float = 0.1
    """Weight of the newest judging step in that running gain."""

    judge_gain_explore: float = 0.003
    """Weight with which a step whose alternatives were not judged moves that gain back towards its prior."""

    alternative_taken_prior: float = 0.35
    """P(the target takes one of the alternatives departing where it rejected the main branch), before any
    outcome: on the development agent traces about a third (0.3 to 0.45 with one alternative; with several, their
    chances add up to about as much)."""

    alternative_goes_on_prior: float = 0.8
    """P(a taken alternative's next token is accepted too), before any outcome: a taken alternative ran on for
    3 to 6 tokens on the development agent traces."""

    alternative_ema: float = 0.05
    """Weight of the newest tried alternative in those rates: alternatives are tried rarely and succeed rarely,
    so they move slowly."""

    timing_ema: float = 0.1
    """Weight of the newest timed model draft in the drafter's per-token and per-ingested-token costs."""

    def __post_init__(self) -> None:
        if self.branches < 0:
            raise ValueError(f"branches must be >= 0, got {self.branches}")
        for name, prior in {"alternative_taken_prior": self.alternative_taken_prior,
                            "alternative_goes_on_prior": self.alternative_goes_on_prior}.items():
            if not 0.0 <= prior <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {prior}")
        if self.short_match < 0:
            raise ValueError(f"short_match must be >= 0, got {self.short_match}")
        emas = {"model_rate_ema": self.model_rate_ema, "alternative_ema": self.alternative_ema,
                "judge_gain_ema": self.judge_gain_ema,
                "timing_ema": self.timing_ema, "model_ask_ema": self.model_ask_ema,
                "short_gain_ema": self.short_gain_ema}
        for name, weight in emas.items():
            if not 0.0 < weight <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {weight}")
        for name, explore in {"model_ask_explore": self.model_ask_explore,
                              "short_gain_explore": self.short_gain_explore,
                              "judge_gain_explore": self.judge_gain_explore}.items():
            if not 0.0 <= explore <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {explore}")
