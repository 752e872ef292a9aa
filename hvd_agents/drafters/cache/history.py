"""Acceptance history: how drafts fared recently, as features for the payoff predictor.

Two small records, both updated from verification outcomes only (never from the
future), so a replay and a live run compute the same values:

* :class:`AcceptanceHistory` (per request): the accepted fraction of the last
  draft, whether it was accepted whole, and an exponential moving average of the
  accepted fraction over the request's drafts.
* :class:`KindRates` (per drafter, across requests): an exponential moving average
  of the accepted fraction of drafts copied from each provenance kind, per session
  and overall; a session's rate starts from the overall one.

Worked example::

    h = AcceptanceHistory()
    h.features()   # HistoryFeatures(drafts=0, last_frac=0.5, last_full=False, ema_frac=0.5)
    h.record(drafted=8, accepted=8)
    h.features()   # HistoryFeatures(drafts=1, last_frac=1.0, last_full=True, ema_frac=0.75)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hvd_agents.policy.features import PRIOR_RATE, HistoryFeatures

__all__ = ["EMA_WEIGHT", "PRIOR_RATE", "AcceptanceHistory", "KindRates"]

EMA_WEIGHT = 0.5  # weight of the newest observation in the moving averages


@dataclass
class AcceptanceHistory:
    """The drafts of one request so far (see the module docstring)."""

    drafts: int = 0
    last_frac: float = PRIOR_RATE
    last_full: bool = False
    ema_frac: float = PRIOR_RATE

    def record(self, drafted: int, accepted: int) -> None:
        """Count one verified draft of ``drafted`` tokens of which ``accepted`` were accepted."""
        frac = accepted / drafted
        self.drafts += 1
        self.last_frac = frac
        self.last_full = accepted == drafted
        self.ema_frac += EMA_WEIGHT * (frac - self.ema_frac)

    def features(self) -> HistoryFeatures:
        """A snapshot for a draft's features."""
        return HistoryFeatures(self.drafts, self.last_frac, self.last_full, self.ema_frac)


@dataclass
class KindRates:
    """Moving averages of the accepted fraction per (session, kind) and per kind."""

    overall: dict[str, float] = field(default_factory=dict)
    by_session: dict[tuple[str, str], float] = field(default_factory=dict)
    max_sessions: int = 4096  # per-session entries kept (oldest dropped first)

    def rate(self, session_id: str | None, kind: str) -> float:
        """The current estimate for drafts of ``kind`` in ``session_id``."""
        base = self.overall.get(kind, PRIOR_RATE)
        if session_id is None:
            return base
        return self.by_session.get((session_id, kind), base)

    def record(self, session_id: str | None, kind: str, frac: float) -> None:
        """Fold in one draft of ``kind`` whose accepted fraction was ``frac``."""
        base = self.overall.get(kind, PRIOR_RATE)
        self.overall[kind] = base + EMA_WEIGHT * (frac - base)
        if session_id is None:
            return
        key = (session_id, kind)
        current = self.by_session.pop(key, base)  # re-inserted last: dict order = recency
        self.by_session[key] = current + EMA_WEIGHT * (frac - current)
        while len(self.by_session) > self.max_sessions:
            del self.by_session[next(iter(self.by_session))]
