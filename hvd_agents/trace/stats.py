"""Per-step records of a trace replay and their per-policy totals.

Cost model (the same for every policy): verifying a step with ``d`` draft tokens
costs ``1 + c * d`` target forward-equivalents (``c`` = ``verify_cost``; plain
decoding costs 1 per token), so the estimated speedup over plain decoding is
``output tokens / sum over steps of (1 + c * drafted)``.

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

TARGET_KIND = "target"


def source_kind(source: str) -> str:
    """The provenance kind of a draft source (``"suffix:tool_output"`` -> ``"tool_output"``)."""
    return source.split(":", 1)[1] if ":" in source else source


@dataclass(frozen=True)
class StepRecord:
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

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["features"] = {key: float(value) for key, value in feature_record(self.features).items()}
        return out


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

    def add_request(self, output_tokens: int) -> None:
        """Count one assistant turn of ``output_tokens`` tokens."""
        self.requests += 1
        self.output_tokens += output_tokens

    def add_step(self, step: StepRecord) -> None:
        """Count one step."""
        self.steps += 1
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
        }


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]
