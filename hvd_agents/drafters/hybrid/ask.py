"""The policy's gates: optional work done only while it pays, each with its running gain and timed seconds.

Where no cache draft pays, ``hvd`` may ask a model drafter that gates its first token
(:mod:`hvd_agents.drafters.model.loop`): the drafter catches up on the context it has not
seen and runs one forward, and its confidence in its first token decides whether it drafts.
That forward and the catch-up are spent whether or not it drafts. Where a drafter forward
costs a tenth of a target step it is worth asking nearly everywhere; where it costs half a
step (a draft head in float32 on one core beside a small target), asking at every plain step
makes decoding slower than plain decoding whenever the drafter is rarely right.

:class:`AskGain` keeps the running mean of what an ask brought, in tokens per step before
its own cost: for an ask that drafted, the accepted tokens less the rate ``R`` times the
draft's extra cost over a plain step, the ask's cost added back
(``accepted - R * (cost - 1) + R * ask_cost``); 0 for an ask that drafted nothing. The
policy asks iff that mean exceeds ``R * ask_cost`` (the drafter's forward and its catch-up of the prompt,
in plain steps, as :mod:`.pricing` prices them). A step where it does not ask moves the mean
a little back towards the prior (``explore``), so a drafter priced out by a bad stretch is
asked again after a while and can show it has become worth asking.

The same gain gates two other pieces of the policy's host work: a short match's cache proposal
(its features, prediction and tree; the gain is its accepted tokens less ``R`` times its extra
verification) and judging a step's alternatives with the predictor (the gain is the judged
alternatives' accepted tokens less ``R`` times what their nodes added to the step's cost), each
against its own timed seconds. A fourth gate has no gain: planning a cache proposal (predictor,
tree, cut) against taking it whole, by the policy's seconds on each.

:class:`Gate` is one such piece of work: its :class:`AskGain` (None: priced by seconds alone), its
running seconds (an :class:`Ema`; the model ask's are its drafter's forwards, which :mod:`.pricing` times)
and, for planning, the seconds of the same step without the work (``baseline``). The ``hvd`` drafter
holds four: ``ask``, ``short``, ``judging`` and ``plan``.

The mean depends on outcomes, never on a drawn token or on timings directly (the costs it is
compared with are timed for greedy requests only), so sampling stays exact.

Worked example (prior 0.5, weight 0.2, explore 0.02): a drafter whose asks draft nothing,
at ``R = 1.3`` and an ask cost of 0.2 (threshold 0.26): asks at 0.5, 0.4 and 0.32 (the mean
is then 0.256), then skips until the mean is back above 0.26, one skip later, and so on, a
little more rarely each time the mean falls further below the prior.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AskGain:
    """The running gain of asking a gated model drafter (see the module docstring).

    Attributes:
        prior: the gain assumed before any ask, in tokens per step (optimistic: the drafter is asked at first).
        ema: the weight of the newest ask's gain.
        explore: the weight with which a step that does not ask moves the mean back towards the prior.
        value: the running mean.
    """

    prior: float
    ema: float
    explore: float
    value: float | None = None

    def __post_init__(self) -> None:
        if self.value is None:
            self.value = self.prior

    def pays(self, rate: float, ask_cost: float) -> bool:
        """Whether an ask costing ``ask_cost`` plain steps is worth it at rate ``rate``."""
        return self.value > rate * ask_cost

    def skipped(self) -> None:
        """A step where the drafter could have been asked and was not."""
        self.value += self.explore * (self.prior - self.value)

    def observe(self, gain: float) -> None:
        """Fold in one ask's gain (0 when it drafted nothing)."""
        self.value += self.ema * (gain - self.value)


def ask_gain(accepted: int, step_cost: float, ask_cost: float, rate: float) -> float:
    """An ask's gain before its own cost: ``accepted - rate * (step_cost - 1) + rate * ask_cost`` for a draft of
    which ``accepted`` tokens were accepted, verified in a step priced ``step_cost`` (the ask's cost included)."""
    return accepted - rate * (step_cost - 1.0) + rate * ask_cost


@dataclass
class Ema:
    """A running mean that takes its first observation as it is (``value`` 0: nothing observed yet).

    Attributes:
        weight: the weight of the newest observation.
        value: the running mean.
    """

    weight: float
    value: float = 0.0

    def observe(self, x: float) -> None:
        """Fold in ``x``."""
        self.value += self.weight * (x - self.value) if self.value else x


@dataclass
class Gate:
    """A piece of the policy's optional work, done only while it pays (see the module docstring).

    Attributes:
        seconds: the work's running seconds per step it was done (a step's policy seconds, for planning).
        gain: its running gain (None: the work is weighed by its seconds alone).
        baseline: the running seconds of a step without the work (None: the work's seconds are its own).
    """

    seconds: Ema
    gain: AskGain | None = None
    baseline: Ema | None = field(default=None)

    @property
    def value(self) -> float:
        """The running gain."""
        if self.gain is None:
            raise ValueError("this gate has no gain")
        return self.gain.value

    def cost(self, step_s: float) -> float:
        """The work's seconds in plain steps of ``step_s`` seconds (0 until both are timed)."""
        if step_s <= 0:
            return 0.0
        if self.baseline is None:
            return self.seconds.value / step_s
        return max(self.seconds.value - self.baseline.value, 0.0) / step_s

    def pays(self, rate: float, cost: float) -> bool:
        """Whether the work, costing ``cost`` plain steps, is worth it at rate ``rate``."""
        return self.gain is not None and self.gain.pays(rate, cost)

    def skipped(self) -> None:
        """A step where the work could have been done and was not."""
        if self.gain is not None:
            self.gain.skipped()

    def observe(self, gain: float | None, seconds: float | None = None) -> None:
        """Fold in what the work brought (None: no gain to learn) and the seconds it took (None: not timed here)."""
        if gain is not None and self.gain is not None:
            self.gain.observe(gain)
        if seconds is not None:
            self.seconds.observe(seconds)


def gate(prior: float, ema: float, explore: float, seconds_ema: float = 0.0) -> Gate:
    """A gate with a gain of ``prior``, ``ema`` and ``explore`` whose seconds move with weight ``seconds_ema``."""
    return Gate(Ema(seconds_ema), AskGain(prior, ema, explore))
