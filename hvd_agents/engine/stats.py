"""Per-request statistics and the events the engine streams."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SourceStats:
    """Counts for one draft source (``"pld"``, ``"suffix"``, ``"none"``, ...)."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class VerifyStepRecord:
    """One verification step, kept when the request asks for step records.

    Attributes:
        step: index of the step in the request (0-based).
        position: number of output tokens before this step.
        source: the draft's source.
        drafted: number of draft tokens verified.
        accepted: number of them accepted.
        emitted: tokens appended (accepted + recovered/bonus, after stop cuts).
        features: the draft's features by name, as step records carry them
            (:func:`~hvd_agents.policy.features.feature_record` of ``Draft.features``),
            for training the payoff predictor.
    """

    step: int
    position: int
    source: str
    drafted: int
    accepted: int
    emitted: int
    features: dict[str, float]


StepRecord = VerifyStepRecord  # the earlier name, kept for existing imports


@dataclass
class RequestStats:
    """What one request cost and how drafting went.

    Prefill covers ``prompt[:-1]`` (the last prompt token is fed with the first
    draft): ``reused_prefix_tokens + prefilled_tokens == prompt_tokens - 1``.
    ``prefix_break_at`` is the prompt position where the conversation's earlier
    prompt was not reproduced (history rewritten: no reuse past it);
    ``reply_mismatch_at`` the position where the earlier reply, as rendered back,
    differs from the tokens generated (see :mod:`hvd_agents.engine.prefix_cache`).
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    reused_prefix_tokens: int = 0
    prefilled_tokens: int = 0
    prefix_break_at: int | None = None
    reply_mismatch_at: int | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    grammar_s: float = 0.0  # of decode_s: the constraint's masks and draft cuts (0 without a constraint)
    steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    per_source: dict[str, SourceStats] = field(default_factory=dict)
    step_records: list[VerifyStepRecord] | None = None

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per target forward pass in decode (1.0 for plain AR)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens per drafted token."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def record(self, source: str, drafted: int, accepted: int) -> None:
        """Count one verification step."""
        self.steps += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        per = self.per_source.setdefault(source, SourceStats())
        per.steps += 1
        per.drafted += drafted
        per.accepted += accepted

    def summary(self) -> str:
        """A short human-readable report (what ``hvd-agents generate`` prints)."""
        lines = [
            (f"prompt {self.prompt_tokens} tok ({self.reused_prefix_tokens} reused, {self.prefilled_tokens} prefilled), "
             f"prefill {self.prefill_s:.2f} s | "
             f"{self.new_tokens} new tok in {self.decode_s:.2f} s ({self.decode_tokens_per_s:.1f} tok/s)"),
            (f"steps {self.steps}, tokens/step {self.tokens_per_step:.2f}, "
             f"drafted {self.drafted_tokens}, accepted {self.accepted_tokens} ({self.acceptance_rate:.0%})"),
        ]
        if self.prefix_break_at is not None:
            lines.append(f"prefix break at prompt token {self.prefix_break_at}: earlier history was rewritten")
        if self.reply_mismatch_at is not None:
            lines.append(f"earlier reply rendered differently from its generated tokens at {self.reply_mismatch_at}")
        for source, per in sorted(self.per_source.items()):
            lines.append(f"  {source:<28} {per.steps:>4} steps {per.drafted:>5} drafted {per.accepted:>5} accepted")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, derived figures included."""
        out = asdict(self)
        if self.step_records is None:
            out.pop("step_records")
        out["tokens_per_step"] = self.tokens_per_step
        out["acceptance_rate"] = self.acceptance_rate
        out["decode_tokens_per_s"] = self.decode_tokens_per_s
        return out


@dataclass(frozen=True)
class TokenEvent:
    """What one decode step adds to the output.

    Attributes:
        token_ids: the tokens emitted this step (several when a draft was accepted).
        text: the new text they complete (never a broken UTF-8 character, never
            part of a stop string); may be empty.
        finish_reason: None while generating; ``"stop"`` (end-of-turn token or stop
            string) or ``"length"`` (max_new_tokens or context window) on the last event.
        stats: the request's stats, on the last event only.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    stats: RequestStats | None = None
