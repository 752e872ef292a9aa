"""Clocks that stand in for ``time`` where a test needs the policy's timed decisions to repeat exactly.

The hybrid drafter weighs its own work against the engine's timed steps (the short-match and judging gates,
whole proposals), so on a loaded machine two runs of one greedy request may take different steps to the same
tokens. A test that counts steps reads these clocks instead of the wall clock.
"""

from __future__ import annotations


class FakeClock:
    """Stands in for ``time``: time moves only when the test sets ``now``."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class TickingClock:
    """Stands in for ``time`` (or its ``perf_counter``): every reading is a millisecond after the last."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        self.now += 0.001
        return self.now
