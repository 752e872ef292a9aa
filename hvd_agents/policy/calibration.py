"""The cost profile as the engine pays it: calibrated online against the engine's step timings.

The profile (:mod:`hvd_agents.policy.cost`) times bare forwards back to back. A
decoding step inside the engine also pays work that does not grow with the
draft: choosing the draft, sampling and accepting, cache bookkeeping, the
framework's per-call overhead after other Python work. If a step costs a
forward ``F * p(d)`` plus a fixed ``O``, then in plain steps of the engine::

    c(d) = (F * p(d) + O) / (F + O) = 1 + alpha * (p(d) - 1),   alpha = F / (F + O)

so a draft's extra cost is a smaller share of an engine step than of a bare
forward (``alpha < 1``), and where the engine's step adds cost of its own that
grows with the draft, a larger one (``alpha > 1``).

:class:`StepCalibration` estimates ``alpha`` and the engine's plain-step seconds
``T0`` from the steps it is given: the ``hvd`` policy gives each step's
verification seconds as the engine measured them plus its own seconds choosing
the draft (:mod:`hvd_agents.drafters.hybrid.pricing`; model drafting and the
stream consumer's time between steps excluded). ``T0`` is a running mean of the
plain steps; each drafted step adds its extra time
``s / T0 - 1`` against the profile's ``p(d) - 1`` to a regression through the
origin with exponential forgetting. It starts from ``alpha = 1`` (the profile as
measured), held with the weight of :data:`PRIOR_STEPS` drafted steps, and
moves only once plain steps have been timed (drafted steps alone cannot tell
the fixed part of a step from the draft's). One disturbed step cannot move it
far: a plain step counts at most :data:`OUTLIER` times ``T0``, a drafted step's
extra time at most :data:`OUTLIER` times the profile's.

:attr:`StepCalibration.step_s`, the seconds a model drafter's time is measured
against, is ``T0``, or before any plain step a running mean of the drafted
steps' ``s / c(d)``.

Worked example: the profile says ``p(1) = 1.3``; the engine's plain steps take
60 ms and its one-token drafts 67.2 ms. Each drafted step observes ``0.12``
against ``0.3``, so ``alpha`` moves from 1 towards ``0.4``, and ``c(1)`` from
1.3 towards 1.12.
"""

from __future__ import annotations

PRIOR_STEPS = 8.0  # drafted steps' worth of belief in the profile as measured
PRIOR_EXTRA = 0.3  # the profile's extra cost those prior steps are taken at
FORGET = 0.98  # weight kept by earlier drafted steps at each new one
PLAIN_EMA = 0.1  # weight of the newest plain step in T0
OUTLIER = 3.0
ALPHA_RANGE = (0.25, 2.0)


class StepCalibration:
    """Running estimates of ``alpha`` and ``T0`` (see the module docstring)."""

    def __init__(self) -> None:
        self.plain_s = 0.0  # T0: seconds of a plain step (0 until one is timed)
        self._scaled_s = 0.0  # running mean of every step's s / c(d)
        self._sxx = PRIOR_STEPS * PRIOR_EXTRA**2
        self._sxy = self._sxx  # the prior: alpha = 1
        self.steps = 0  # drafted steps folded into alpha

    @property
    def alpha(self) -> float:
        """The share of the profile's extra cost the engine pays (clamped to :data:`ALPHA_RANGE`)."""
        low, high = ALPHA_RANGE
        return min(max(self._sxy / self._sxx, low), high)

    @property
    def step_s(self) -> float:
        """Seconds of a plain step: ``T0``, or before any plain step is timed, the drafted steps'
        seconds divided by their calibrated cost (0 before any step)."""
        return self.plain_s or self._scaled_s

    def observe(self, seconds: float, extra: float) -> None:
        """Fold in one step: its ``seconds`` (model drafting excluded) and the profile's extra cost
        ``p(d) - 1`` of its draft (0 for a plain step)."""
        if seconds <= 0.0:
            return
        scaled = seconds / (1.0 + self.alpha * max(extra, 0.0))
        if not self._scaled_s:
            self._scaled_s = scaled
        else:
            self._scaled_s += PLAIN_EMA * (min(scaled, OUTLIER * self._scaled_s) - self._scaled_s)
        if extra <= 0.0:
            if not self.plain_s:
                self.plain_s = seconds
            else:
                self.plain_s += PLAIN_EMA * (min(seconds, OUTLIER * self.plain_s) - self.plain_s)
            return
        if not self.plain_s:
            return
        observed = min(max(seconds / self.plain_s - 1.0, 0.0), OUTLIER * extra)
        self._sxx = FORGET * self._sxx + extra * extra
        self._sxy = FORGET * self._sxy + observed * extra
        self.steps += 1
