"""Measuring the target's verification cost profile on this machine, and keeping it.

:func:`measure_cost_model` times the target at draft lengths from 0 to 32 on a
real context, in interleaved rounds, and keeps the minimum over rounds (other
load on the machine only ever adds time); the curve runs through those timings,
each lowered to the cheapest timing of any longer draft (a forward over more
tokens never costs less, so one disturbed timing cannot raise the curve).
No shape is assumed: a CPU's first draft token can cost far more than the next
ones (a one-token forward runs matrix-vector kernels, a longer one
matrix-matrix kernels), or about as little as the next ones (a row-streaming
kernel), and the cost can jump where a kernel changes strategy at some number
of rows. :func:`cached_cost_model` keeps the result per model, device, dtype,
thread count and torch version under the cache directory, so it is measured
once per machine, at first use: when the first ``hvd`` request starts, before its prefill and
decoding are timed (one-time work, logged with its own seconds, never part of a request's figures).
A profile that breaks ``verify(d) <= 1 + d`` (timings disturbed by other load) is measured again; after a few failures the
linear model at :data:`~hvd_agents.policy.cost.FALLBACK_VERIFY_COST` is used for the process and nothing is cached;
so is it when the measurement fails (a warning names the cause): the profile never fails a load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from hvd_agents.policy.cost import FALLBACK_VERIFY_COST, CostModel
from hvd_agents.runtime.cpu.kernels import linear_kernel
from hvd_agents.runtime.cpu.row_linear import build_key
from hvd_agents.runtime.cpu.threads import team_threads
from hvd_agents.runtime.kv import cache_argument, new_cache
from hvd_agents.runtime.paths import cache_root
from hvd_agents.runtime.progress import waiting

logger = logging.getLogger(__name__)

PROFILE_DRAFT_LENGTHS: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PROFILE_VERSION = 4  # part of the cache key: profiles measured by an older method are measured again
PROFILE_CONTEXT = 512  # tokens of context the profile is measured at
PROFILE_REPEATS = 5
PROFILE_ATTEMPTS = 3  # measurements tried before giving up on a disturbed machine


class _ModelSteps:
    """A transformers model seen through the runner calls :func:`measure_runner_cost` makes."""

    def __init__(self, model: torch.nn.Module, context_window: int) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_window = context_window
        self._cache_arg = cache_argument(model)

    def new_kv(self):
        return new_cache(self.model.config)

    def forward(self, kv, token_ids: Sequence[int], *, logits_to_keep: int = 0) -> None:
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            self.model(input_ids=ids, **{self._cache_arg: kv}, use_cache=True, logits_to_keep=logits_to_keep)


def measure_cost_model(
    model: torch.nn.Module,
    *,
    lengths: Sequence[int] = PROFILE_DRAFT_LENGTHS,
    context: int = PROFILE_CONTEXT,
    repeats: int = PROFILE_REPEATS,
) -> CostModel:
    """Time one verification forward of ``1 + d`` tokens after ``context`` cached tokens, per ``d``, on the
    model's own forward (:func:`measure_runner_cost`)."""
    window = int(getattr(model.config, "max_position_embeddings", context + max(lengths) + 1))
    return measure_runner_cost(_ModelSteps(model, window), lengths=lengths, context=context, repeats=repeats)


def measure_runner_cost(
    runner,
    *,
    lengths: Sequence[int] = PROFILE_DRAFT_LENGTHS,
    context: int = PROFILE_CONTEXT,
    repeats: int = PROFILE_REPEATS,
) -> CostModel:
    """Time one verification forward of ``1 + d`` tokens after ``context`` cached tokens, per ``d``, through a
    runner's own ``new_kv``/``forward``/``rollback`` (its kernels, its cache).

    Every round visits the lengths in a new order, each after a plain step: the plain step, which every
    ratio divides by, is timed len(lengths) times per round, and no length always follows the same one.
    """
    if 0 not in lengths:
        raise ValueError("a cost profile needs a timing at 0 draft tokens")
    context = max(1, min(context, runner.context_window - max(lengths) - 1))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, runner.vocab_size, (context + max(lengths) + 1,), generator=generator).tolist()
    kv = runner.new_kv()
    times = {d: float("inf") for d in lengths}
    order = [d for d in lengths if d != 0]
    runner.forward(kv, ids[:context], logits_to_keep=1)
    for _ in range(repeats):
        for i in torch.randperm(len(order), generator=generator).tolist():
            for d in (0, order[i]):
                _sync(runner.device)
                start = time.perf_counter()
                runner.forward(kv, ids[context : context + d + 1])
                _sync(runner.device)
                times[d] = min(times[d], time.perf_counter() - start)
                kv.rollback(context)
    return _robust_profile(lengths, [times[d] for d in lengths], context)


def _robust_profile(lengths: Sequence[int], seconds: Sequence[float], context: int) -> CostModel:
    """The cost curve through the (minimum) timings ``seconds`` of forwards over ``1 + d`` tokens.

    ``verify(0) = 1`` is the measured plain step. Each other point is the cheapest
    timing at ``d`` or any longer draft, over the plain step (and at least 1): the
    true cost never falls as ``d`` grows, so a timing above a longer draft's was
    disturbed and is replaced by that bound, while the shape the kernels give
    (a jump at the first draft token, steps where a kernel changes strategy) is kept.
    """
    xs = np.asarray(lengths, dtype=np.float64)
    ts = np.asarray(seconds, dtype=np.float64)
    if not (xs == 0).any():
        raise ValueError("a cost profile needs a timing at 0 draft tokens")
    order = np.argsort(xs)
    xs, ts = xs[order], ts[order]
    base = float(ts[xs == 0].min())
    drafted = xs >= 1
    dx, dt = xs[drafted], ts[drafted]
    if len(dx) == 0:
        return CostModel(((0, 1.0),), source=f"measured at {context} tokens of context, {base * 1e3:.1f} ms per step")
    bound = np.minimum.accumulate(dt[::-1])[::-1]  # cheapest timing at d or beyond
    costs = np.maximum(bound / base, 1.0)
    points = ((0, 1.0), *((int(d), float(c)) for d, c in zip(dx, costs)))
    at = {d: c for d, c in points}
    summary = ", ".join(f"d={d} {at[d]:.2f}" for d in (1, 4, 8, 16, 32) if d in at)
    return CostModel(points, source=f"measured at {context} tokens of context, {base * 1e3:.1f} ms per step; "
                                    f"verify cost in steps: {summary}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_key(model: torch.nn.Module) -> str:
    """What a cost profile depends on: the model and its kernels (linear layers, attention), device, dtype,
    threads, torch and the machine."""
    param = next(model.parameters())
    kernel = linear_kernel(model)
    if kernel == "row":
        kernel = f"row {build_key()}"  # a rebuilt kernel may cost differently
    parts = [
        kernel,
        str(getattr(model.config, "_attn_implementation", "")),
        str(getattr(model.config, "_name_or_path", "")),
        json.dumps(model.config.to_diff_dict(), sort_keys=True, default=str),
        str(param.device),
        str(param.dtype),
        *machine_key_parts(),
    ]
    if param.device.type == "cuda":
        parts.append(torch.cuda.get_device_name(param.device))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def machine_key_parts() -> list[str]:
    """The parts of a profile key that are not the model: profile method, threads, torch, machine."""
    return [f"profile v{PROFILE_VERSION}", str(torch.get_num_threads()), torch.__version__, platform.machine(),
            platform.processor(), str(os.cpu_count())]


def cached_cost_model(model: torch.nn.Module, directory: Path | None = None, *, key: str | None = None,
                      measure=None, min_cpu_share: float | None = None) -> CostModel:
    """The model's measured cost profile, from the cache or measured now and cached.

    ``key`` names the profile (default :func:`profile_key`) and ``measure`` takes it
    (default :func:`measure_cost_model` on ``model``): a runner with its own kernels
    passes both. A missing, unreadable or malformed profile file is measured again (and logged). A
    measurement that fails (raises) is logged as a warning and the default linear model
    (:meth:`~hvd_agents.policy.cost.CostModel.fallback`) is used for the process, not cached: a profile
    only tunes how much the ``hvd`` policy drafts, and never fails a load.

    ``min_cpu_share``: for a runner whose forwards keep every thread busy (the native CPU forward), the
    least share of its team's cores (:func:`~hvd_agents.runtime.cpu.threads.team_threads`) this process must
    have run on while it measured;
    below it, other load took the cores and the timings are disturbed (under sustained load a profile
    comes out too flat or too steep, and a cached one would misprice drafts on this machine for good), so
    it is measured again, as an implausible one is.
    """
    if directory is None:
        directory = cache_root() / "cost-profiles"
    try:
        path = directory / f"{key or profile_key(model)}.json"
    except Exception as exc:  # noqa: BLE001 - as for a failed measurement below
        return _default(exc)
    try:
        return CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("cost profile %s is unreadable (%s); measuring again", path, exc)
    began = time.perf_counter()
    try:
        profile = _measure(model, measure, min_cpu_share)
    except Exception as exc:  # noqa: BLE001 - a profile only tunes drafting: it must never fail a load
        return _default(exc)
    if profile is None:
        logger.warning("no plausible, undisturbed cost profile after %d attempts; using c=%s, not cached",
                       PROFILE_ATTEMPTS, FALLBACK_VERIFY_COST)
        return CostModel.fallback()
    # one-time work, its own figure: never part of a request's timed prefill or decoding (the ``hvd`` drafter
    # resolves its profile when a request starts)
    logger.info("measured the verification cost profile in %.1f s: %s", time.perf_counter() - began,
                profile.to_dict())
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(profile.to_dict()), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("cannot cache the cost profile in %s: %s", directory, exc)
    return profile


def _default(exc: Exception) -> CostModel:
    """The default profile, used (not cached) where measuring one failed with ``exc``; the warning says so."""
    logger.warning("cannot measure the verification cost profile (%s: %s); using the default linear model c=%s "
                   "(not cached)", type(exc).__name__, exc, FALLBACK_VERIFY_COST)
    return CostModel.fallback()


def _measure(model: torch.nn.Module, measure, min_cpu_share: float | None = None) -> CostModel | None:
    """A plausible measured profile (``measure()``, else :func:`measure_cost_model`), measured while this
    process had at least ``min_cpu_share`` of its threads' cores (when given), or None after
    :data:`PROFILE_ATTEMPTS` implausible or disturbed ones."""
    with waiting("measuring the verification cost profile (once per model and machine)"):
        for _ in range(PROFILE_ATTEMPTS):
            cpu, wall = _cpu_seconds(), time.perf_counter()
            measured = measure() if measure is not None else measure_cost_model(model)
            threads = max(team_threads(), 1)
            share = (_cpu_seconds() - cpu) / max(time.perf_counter() - wall, 1e-9) / threads
            if min_cpu_share is not None and share < min_cpu_share:
                logger.warning("cost profile measured on %.0f%% of %d cores (other load took the rest); measuring "
                               "again", 100 * share, threads)
                continue
            if measured.plausible:
                return measured
            logger.warning("implausible cost profile %s (timing disturbed by other load?); measuring again",
                           measured.to_dict())
    return None


def _cpu_seconds() -> float:
    """CPU seconds this process has run, all its threads together."""
    return time.process_time()
