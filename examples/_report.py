"""The end-of-run summary every example prints: turn latencies, tokens/s, where accepted tokens came from.

Each model call's drafting stats come from the integrations as a plain dict
(``hvd_stats``: :meth:`hvd_agents.engine.RequestStats.to_dict`): LangChain's
``response_metadata["hvd_stats"]``, LlamaIndex's ``response.raw["hvd_stats"]``, or
``ReplySummary.hvd_stats`` on the framework-neutral path. A :class:`Report` collects
them per user turn, with each turn's wall-clock time (model calls and tools together),
and prints one table; :func:`side_by_side` sets two runs of one conversation (a
speculative method and plain ``ar`` decoding) against each other.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MODEL_NOTE = ("The embedded SmolLM2-135M shows the speed and the identical tokens; steered (the turn's tool forced "
              "by tool_choice) it makes the planned calls, but it often misreads their results in its answers. For an "
              "agent that reasons, run your model: python examples/own_model.py --model HUB_ID_OR_PATH_OR_GGUF")


@dataclass
class Turn:
    """One user turn: its wall-clock time and the stats of each model call it made."""

    label: str
    wall_s: float = 0.0
    calls: list[Mapping[str, Any]] = field(default_factory=list)

    def total(self, key: str) -> float:
        return sum(call.get(key, 0) for call in self.calls)


@dataclass
class Report:
    """Per-turn timings and drafting stats of one example run.

    Usage::

        report = Report("airline agent", method="hvd")
        with report.turn("look up the user"):
            ...                        # run the agent; for each model call:
            report.add_call(hvd_stats)
        report.print()
    """

    title: str
    method: str
    turns: list[Turn] = field(default_factory=list)

    @contextmanager
    def turn(self, label: str) -> Iterator[Turn]:
        """Time one user turn; model calls added meanwhile belong to it."""
        current = Turn(label)
        self.turns.append(current)
        started = time.perf_counter()
        try:
            yield current
        finally:
            current.wall_s = time.perf_counter() - started

    def add_call(self, hvd_stats: Mapping[str, Any] | None) -> None:
        """Record one model call's stats (``hvd_stats``) in the current turn."""
        if not self.turns:
            raise RuntimeError("add_call outside a turn")
        if hvd_stats:
            self.turns[-1].calls.append(hvd_stats)

    @property
    def calls(self) -> list[Mapping[str, Any]]:
        return [call for turn in self.turns for call in turn.calls]

    def sources(self) -> dict[str, dict[str, int]]:
        """Steps, drafted and accepted tokens per draft source, over the whole run."""
        out: dict[str, dict[str, int]] = {}
        for call in self.calls:
            for source, per in call.get("per_source", {}).items():
                row = out.setdefault(source, {"steps": 0, "drafted": 0, "accepted": 0})
                for key in row:
                    row[key] += per.get(key, 0)
        return out

    def totals(self) -> dict[str, float]:
        """Run totals: wall time, model time (prefill + decode), tokens, steps, drafted/accepted."""
        calls = self.calls
        total = {key: sum(call.get(key, 0) for call in calls)
                 for key in ("prompt_tokens", "reused_prefix_tokens", "new_tokens", "prefill_s", "decode_s",
                             "steps", "drafted_tokens", "accepted_tokens")}
        total["wall_s"] = sum(turn.wall_s for turn in self.turns)
        total["model_calls"] = len(calls)
        return total

    def lines(self) -> list[str]:
        """The summary as text lines (what :meth:`print` prints)."""
        header = (f"{'turn':<34} {'wall s':>7} {'calls':>5} {'prompt':>7} {'reused':>7} {'prefill s':>9} "
                  f"{'new tok':>7} {'tok/s':>7} {'tok/step':>8}")
        out = [f"== {self.title}: method {self.method}, {len(self.turns)} turns", header]
        for turn in self.turns:
            out.append(_row(turn.label[:34], turn.wall_s, turn.calls))
        out.append(_row("total", sum(t.wall_s for t in self.turns), self.calls))
        totals = self.totals()
        drafted, accepted = int(totals["drafted_tokens"]), int(totals["accepted_tokens"])
        rate = f"{accepted / drafted:.0%}" if drafted else "-"
        out.append(f"accepted/drafted: {accepted}/{drafted} ({rate}); accepted tokens by source:")
        for source, row in sorted(self.sources().items(), key=lambda item: -item[1]["accepted"]):
            out.append(f"  {source:<28} {row['accepted']:>6} accepted of {row['drafted']:>6} drafted "
                       f"in {row['steps']:>5} steps")
        return out

    def print(self) -> None:
        print("\n".join(self.lines()), flush=True)


def _row(label: str, wall_s: float, calls: list[Mapping[str, Any]]) -> str:
    new = sum(call.get("new_tokens", 0) for call in calls)
    decode_s = sum(call.get("decode_s", 0.0) for call in calls)
    steps = sum(call.get("steps", 0) for call in calls)
    tok_s = new / decode_s if decode_s > 0 else 0.0
    per_step = new / steps if steps else 0.0
    return (f"{label:<34} {wall_s:>7.2f} {len(calls):>5} {sum(c.get('prompt_tokens', 0) for c in calls):>7} "
            f"{sum(c.get('reused_prefix_tokens', 0) for c in calls):>7} "
            f"{sum(c.get('prefill_s', 0.0) for c in calls):>9.2f} {new:>7} {tok_s:>7.1f} {per_step:>8.2f}")


def side_by_side(fast: Report, plain: Report, fast_calls: Sequence[Any], plain_calls: Sequence[Any]) -> list[str]:
    """Two runs of one conversation, turn by turn: wall time, decode tokens/s, tokens per step, the speedup and
    whether every model call produced the same tokens.

    Args:
        fast: the report of the speculative run.
        plain: the report of the plain (``ar``) run of the same turns.
        fast_calls: the speculative run's recorded model calls, in order (each with ``token_ids``).
        plain_calls: the plain run's.
    """
    header = (f"{'turn':<34} {plain.method + ' s':>7} {fast.method + ' s':>7} {'speedup':>7} "
              f"{plain.method + ' tok/s':>9} {fast.method + ' tok/s':>9} {fast.method + ' tok/step':>12} "
              f"{'same tokens':>11}")
    out = [f"== {fast.method} against plain decoding ({plain.method}): same model, same prompts, greedy", header]
    fast_turns, plain_turns = _split(fast_calls, fast.turns), _split(plain_calls, plain.turns)
    rows = list(zip(fast.turns, plain.turns, fast_turns, plain_turns))
    for fast_turn, plain_turn, fast_ids, plain_ids in rows:
        out.append(_pair(fast_turn.label[:34], fast_turn.wall_s, plain_turn.wall_s, fast_turn.calls,
                         plain_turn.calls, fast_ids == plain_ids))
    same_calls = sum(a == b for a, b in zip(_ids(fast_calls), _ids(plain_calls)))
    identical = same_calls == len(fast_calls) == len(plain_calls)
    fast_total, plain_total = fast.totals(), plain.totals()
    out.append(_pair("total", fast_total["wall_s"], plain_total["wall_s"], fast.calls, plain.calls, identical))
    decode = plain_total["decode_s"] / fast_total["decode_s"] if fast_total["decode_s"] > 0 else 0.0
    out.append(f"identical tokens: {'yes' if identical else 'no'} ({same_calls} of {len(plain_calls)} model calls)")
    out.append(f"speedup: {_ratio(plain_total['wall_s'], fast_total['wall_s']):.2f}x end to end (prompt processing "
               f"{fast_total['prefill_s']:.1f} s of {fast.method}'s {fast_total['wall_s']:.1f} s, alike in both), "
               f"{decode:.2f}x in decoding")
    return out


def _ids(calls: Sequence[Any]) -> list[tuple[int, ...]]:
    return [tuple(call.token_ids) for call in calls]


def _split(calls: Sequence[Any], turns: Sequence[Turn]) -> list[list[tuple[int, ...]]]:
    """The recorded calls' token ids, grouped by the turn that made them (in order)."""
    ids, out, start = _ids(calls), [], 0
    for turn in turns:
        out.append(ids[start:start + len(turn.calls)])
        start += len(turn.calls)
    return out


def _ratio(base: float, other: float) -> float:
    return base / other if other > 0 else 0.0


def _pair(label: str, fast_s: float, plain_s: float, fast_calls: list, plain_calls: list, same: bool) -> str:
    def rate(calls: list, key: str) -> float:
        return _ratio(sum(c.get("new_tokens", 0) for c in calls), sum(c.get(key, 0) for c in calls))

    return (f"{label:<34} {plain_s:>7.2f} {fast_s:>7.2f} {_ratio(plain_s, fast_s):>6.2f}x "
            f"{rate(plain_calls, 'decode_s'):>9.1f} {rate(fast_calls, 'decode_s'):>9.1f} "
            f"{rate(fast_calls, 'steps'):>12.2f} {'yes' if same else 'no':>11}")
