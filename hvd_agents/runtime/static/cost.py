"""The verification cost profile of a static runner, measured through its bucketed steps.

Padding inside a row bucket is free, so verifying ``d`` draft tokens costs what the
smallest bucket of ``d + 1`` rows costs: the profile is a step function of ``d``.
:func:`measure_bucket_cost` times each row bucket's step (after a prefill of
:data:`~hvd_agents.runtime.profile.PROFILE_CONTEXT` tokens, in interleaved rounds,
minimum over rounds) and writes the curve with two points per bucket (its first and last
draft length), so interpolation between them stays flat. On a GPU each step is timed
with CUDA events around the replay (device time, no host overhead); elsewhere with the
host clock.
"""

from __future__ import annotations

import time

import torch

from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.profile import PROFILE_CONTEXT, PROFILE_REPEATS
from hvd_agents.runtime.static.buckets import DEFAULT_ROWS

MAX_PROFILED_DRAFT = 32  # draft lengths beyond the policy's reach are not measured


def measure_bucket_cost(runner, *, context: int = PROFILE_CONTEXT, repeats: int = PROFILE_REPEATS) -> CostModel:
    """The step-function cost curve of ``runner`` (a :class:`~.runner.StaticRunner`), in plain steps."""
    sizes = runner.buckets.rows
    if runner.bitwise:  # one bucket, but path attention's work grows with the real rows: time several counts
        sizes = sorted({r for r in (*DEFAULT_ROWS, *sizes) if r <= runner.buckets.max_rows})
    rows = [r for r in sizes if r - 1 <= MAX_PROFILED_DRAFT] or [sizes[0]]
    context = max(1, min(context, runner.context_window - rows[-1]))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (context + rows[-1],), generator=generator).tolist()
    kv = runner.new_kv()
    try:
        runner.forward(kv, ids[:context], logits_to_keep=1)
        times = {r: float("inf") for r in rows}
        for _ in range(repeats):
            for i in torch.randperm(len(rows), generator=generator).tolist():
                for r in (rows[0], rows[i]):
                    times[r] = min(times[r], _timed(runner, kv, ids[context : context + r]))
                    kv.rollback(context)
    finally:
        kv.release()
    return step_profile(rows, times, context, runner.device)


def step_profile(rows: list[int], seconds: dict[int, float], context: int, device: torch.device) -> CostModel:
    """The curve: draft lengths ``[previous bucket, bucket - 1]`` cost ``seconds[bucket] / seconds[1 row]``.

    >>> m = step_profile([1, 2, 5], {1: 1.0, 2: 1.0, 5: 1.5}, 512, torch.device("cpu"))
    >>> [m.verify(d) for d in range(5)]
    [1.0, 1.0, 1.5, 1.5, 1.5]
    """
    base = seconds[rows[0]]
    points: list[tuple[int, float]] = [(0, 1.0)]
    cheapest_after = float("inf")
    costs = {}
    for r in reversed(rows):  # a larger bucket never costs less: one disturbed timing cannot raise the curve
        cheapest_after = min(cheapest_after, seconds[r])
        costs[r] = max(cheapest_after / base, 1.0)
    previous = rows[0]
    for r in rows[1:]:
        first, last = previous, r - 1  # draft lengths this bucket serves
        points.append((first, costs[r]))
        if last > first:
            points.append((last, costs[r]))
        previous = r
    summary = ", ".join(f"{r} rows {costs[r]:.2f}" for r in rows)
    return CostModel(tuple(points), source=f"measured through the static runner's buckets on {device} at {context} "
                                           f"tokens of context, {base * 1e3:.2f} ms per step; {summary}")


def _timed(runner, kv, token_ids: list[int]) -> float:
    """Seconds of one forward over ``token_ids`` (CUDA events on a GPU)."""
    if runner.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.forward(kv, token_ids)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    runner.forward(kv, token_ids)
    return time.perf_counter() - begin
