"""What a combining drafter tells a trace replay about its step: the cache draft it saw and its prediction.

Between ``propose`` and ``observe``, the drafters that combine a cache drafter with a
policy (``hvd``, ``hvd-paper``, the merge baselines) answer ``probe(req_id)`` with a
:class:`CacheProbe`: the cache drafter's whole proposal of the step (used or not), the
policy's predicted accepted length of it (None: the policy predicts none) and the arm
the step took. ``hvd-agents analyze`` scores the proposal against the recorded reply
(how many of its tokens the target would have accepted) to report how often cache drafts
are high-payoff and how well each predictor finds them, and with the proposal's features
writes its ``--proposals`` records (what ``train-payoff`` fits a predictor on, in the
distribution the policy itself drafts from).
"""

from __future__ import annotations

from dataclasses import dataclass

from hvd_agents.policy.features import CacheDraftFeatures

ARMS: tuple[str, ...] = ("cache", "model", "merged", "none")


@dataclass(frozen=True)
class CacheProbe:
    """One step's cache proposal and the policy's judgement of it.

    Attributes:
        cache_tokens: the cache drafter's whole proposal (empty: it had none).
        predicted: the policy's predicted accepted length of that whole proposal (None: no prediction).
        arm: what the step verified: ``"cache"``, ``"model"``, ``"merged"`` (model and cache tokens in one
            draft) or ``"none"`` (a plain step).
        features: the proposal's features as the policy saw them (None: not known).
    """

    cache_tokens: tuple[int, ...] = ()
    predicted: float | None = None
    arm: str = "none"
    features: CacheDraftFeatures | None = None

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {ARMS}, got {self.arm!r}")
