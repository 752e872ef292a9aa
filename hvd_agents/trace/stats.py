"""Per-step records of a trace replay and their per-policy totals.

Cost model (the same for every policy): verifying a step with ``d`` draft tokens
costs ``1 + c * d`` target forward-equivalents (``c`` = ``verify_cost``; plain
decoding costs 1 per token), so the estimated speedup over plain decoding is
``output tokens / sum over steps of (1 + c * drafted)``.

The paper's measures, per policy (:meth:`PolicyStats.figures`): of the steps where the
cache drafter had a proposal (``cache_drafts``), the share that is *high-payoff* (its
whole proposal would have kept at least ``payoff_threshold`` tokens, 6 by default); for
a policy that predicts that length (``hvd``, ``hvd-paper``), the precision and recall of
"predicted above the threshold" for high-payoff proposals; the share of steps on each
arm (cache, model, merged, none); verification cycles (target forwards) per 1,000
output tokens. And the tokens a policy's steps accepted *off the proposal's path*: beyond
what the cache proposal itself would have kept (``cache_accepted``), i.e. taken from a tree's
alternatives (``hvd``) or from another continuation (``oracle-tree``).

Provenance kind of a draft: the part after ``:`` of ``Draft.source`` (the cache
drafter reports ``"suffix:<span kind>"``), else the whole source (``"pld"``,
``"arctic"``). Tokens the target produced itself (the one bonus / recovered token
of every step) have kind :data:`TARGET_KIND`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hvd_agents.policy.features import DraftFeatures, feature_record
from hvd_agents.policy.paper import FLAG_NAMES, PAPER_THRESHOLD

TARGET_KIND = "target"
ARMS: tuple[str, ...] = ("cache", "model", "merged", "none")


def source_kind(source: str) -> str:
    """The provenance kind of a draft source (``"suffix:tool_output"`` -> ``"tool_output"``)."""
    return source.split(":", 1)[1] if ":" in source else source


@dataclass(frozen=True)
class ReplayStepRecord:
    """One verification step of one policy (a line of ``--steps``).

    Attributes:
        policy: the policy name.
        conversation: the conversation id.
        turn: the ordinal of the assistant turn in its conversation (0-based).
        message_index: the index of that assistant message in ``messages``.
        position: tokens of the reply already emitted before this step.
        source: ``Draft.source`` (``"none"`` when nothing was proposed).
        drafted: draft tokens verified.
        accepted: how many of them were accepted.
        features: the draft's features (``Draft.features``: a typed record such as
            :class:`~hvd_agents.policy.features.CacheDraftFeatures`); :meth:`to_dict`
            writes them by name (:func:`~hvd_agents.policy.features.feature_record`),
            which ``hvd-agents train-payoff`` reads back.
        arm: what the step verified: ``"cache"``, ``"model"``, ``"merged"`` or ``"none"``.
        cache_drafted: the cache drafter's whole proposal this step, in tokens (0: none), used or not.
        cache_accepted: how many of them the reply would have accepted.
        predicted: the policy's predicted accepted length of that proposal (None: it predicts none).
        flags: punctuation and bracket flags of the last context token and the proposal's first token
            (:data:`~hvd_agents.policy.paper.FLAG_NAMES`; the ``hvd-paper`` predictor's inputs).
        proposal: the cache proposal's features as the policy saw them, verified or not (None: not known);
            not part of :meth:`to_dict` (``--steps``): :meth:`proposal_dict` (``--proposals``) writes them.
    """

    policy: str
    conversation: str
    turn: int
    message_index: int
    position: int
    source: str
    drafted: int
    accepted: int
    features: DraftFeatures | Mapping[str, float]
    arm: str = "none"
    cache_drafted: int = 0
    cache_accepted: int = 0
    predicted: float | None = None
    flags: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    proposal: DraftFeatures | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "proposal"}
        out["features"] = _named(self.features)
        out["flags"] = dict(zip(FLAG_NAMES, map(float, self.flags)))
        return out

    def proposal_dict(self) -> dict[str, Any] | None:
        """The step's whole cache proposal as a ``train-payoff`` record: its features, its length as
        ``drafted`` and what the reply would have accepted of it as ``accepted``, whatever the step verified
        (None: no proposal, or its features are not known)."""
        if not self.cache_drafted or self.proposal is None:
            return None
        return {"policy": self.policy, "conversation": self.conversation, "turn": self.turn,
                "message_index": self.message_index, "position": self.position, "drafted": self.cache_drafted,
                "accepted": self.cache_accepted,
                "features": _named(self.proposal)}


def _named(features: DraftFeatures | Mapping[str, float]) -> dict[str, float]:
    """A draft's features by name, as floats (what ``train-payoff`` reads back)."""
    return {key: float(value) for key, value in feature_record(features).items()}


StepRecord = ReplayStepRecord  # the earlier name, kept for existing imports


@dataclass
class PolicyStats:
    """Totals of one policy over a replay."""

    policy: str
    requests: int = 0
    output_tokens: int = 0
    steps: int = 0
    drafted_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_lengths: Counter = field(default_factory=Counter)  # accepted per drafted step -> count
    accepted_by_kind: Counter = field(default_factory=Counter)  # kind -> accepted tokens
    payoff_threshold: float = PAPER_THRESHOLD
    arm_steps: Counter = field(default_factory=Counter)  # arm -> steps
    cache_drafts: int = 0  # steps with a cache proposal
    high_payoff: int = 0  # ... whose whole proposal would have kept >= payoff_threshold tokens
    predicted_drafts: int = 0  # ... that the policy predicted a length for
    predicted_high: int = 0  # ... those with a high-payoff actual, among the predicted
    flagged: int = 0  # ... predicted above the threshold
    hits: int = 0  # ... flagged and high-payoff
    off_path_tokens: int = 0  # accepted beyond what the step's cache proposal would have kept

    def add_request(self, output_tokens: int) -> None:
        """Count one assistant turn of ``output_tokens`` tokens."""
        self.requests += 1
        self.output_tokens += output_tokens

    def add_step(self, step: ReplayStepRecord) -> None:
        """Count one step."""
        self.steps += 1
        self.arm_steps[step.arm] += 1
        if step.cache_drafted:
            self.off_path_tokens += max(step.accepted - step.cache_accepted, 0)
            high = step.cache_accepted >= self.payoff_threshold
            self.cache_drafts += 1
            self.high_payoff += high
            if step.predicted is not None:
                flagged = step.predicted > self.payoff_threshold
                self.predicted_drafts += 1
                self.predicted_high += high
                self.flagged += flagged
                self.hits += flagged and high
        if step.drafted:
            self.drafted_steps += 1
            self.drafted_tokens += step.drafted
            self.accepted_tokens += step.accepted
            self.accepted_lengths[step.accepted] += 1
            if step.accepted:
                self.accepted_by_kind[source_kind(step.source)] += step.accepted

    def total_cost(self, verify_cost: float) -> float:
        """Sum over steps of ``1 + verify_cost * drafted``."""
        return self.steps + verify_cost * self.drafted_tokens

    def figures(self, verify_cost: float) -> dict[str, Any]:
        """The report figures (JSON-ready)."""
        cost = self.total_cost(verify_cost)
        wasted = self.drafted_tokens - self.accepted_tokens
        accepted = sum(self.accepted_by_kind.values())
        return {
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "tokens_per_step": _ratio(self.output_tokens, self.steps),
            "pct_steps_drafted": 100.0 * _ratio(self.drafted_steps, self.steps),
            "mean_accepted_when_drafted": _ratio(self.accepted_tokens, self.drafted_steps),
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "wasted_tokens": wasted,
            "pct_wasted": 100.0 * _ratio(wasted, self.drafted_tokens),
            "total_cost": cost,
            "est_speedup": _ratio(self.output_tokens, cost) if cost else 1.0,
            "accepted_by_kind": {k: v / accepted for k, v in sorted(self.accepted_by_kind.items(), key=_by_count)},
            "accepted_tokens_by_kind": dict(sorted(self.accepted_by_kind.items(), key=_by_count)),
            "accepted_length_hist": {str(k): v for k, v in sorted(self.accepted_lengths.items())},
            "cycles_per_1k": 1000.0 * _ratio(self.steps, self.output_tokens),
            "pct_steps_by_arm": {arm: 100.0 * _ratio(self.arm_steps[arm], self.steps) for arm in ARMS},
            "cache_drafts": self.cache_drafts,
            "pct_high_payoff": 100.0 * _ratio(self.high_payoff, self.cache_drafts),
            "payoff_threshold": self.payoff_threshold,
            "precision": _ratio(self.hits, self.flagged) if self.predicted_drafts else None,
            "recall": _ratio(self.hits, self.predicted_high) if self.predicted_drafts else None,
            "off_path_tokens": self.off_path_tokens,
        }


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]
