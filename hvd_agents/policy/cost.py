"""The cost model of the target: what verifying a draft of ``d`` tokens costs, in target steps.

``CostModel.verify(d)`` is the cost of one verification forward over ``[last] +
d draft tokens``, in units of a plain decoding step (``verify(0) == 1``), as a
piecewise-linear curve through measured points (extrapolated linearly past the
last one). ``CostModel.linear(c)`` is the ``1 + c * d`` model that trace replays use.
``draft_cost`` is what producing a draft costs per step (cache drafting is a
dictionary lookup, about 0; a model drafter costs forwards of its own).

:func:`measure_cost_model` times the target at draft lengths from 0 to 32 on a
real context, in interleaved rounds, and keeps the minimum over rounds (other
load on the machine only ever adds time); the curve runs through those timings,
each lowered to the cheapest timing of any longer draft (a forward over more
tokens never costs less, so one disturbed timing cannot raise the curve).
No shape is assumed: a CPU's first draft token can cost far more than the next
ones (a one-token forward runs matrix-vector kernels, a longer one
matrix-matrix kernels), or about as little as the next ones (a row-streaming
kernel), and the cost can jump where a kernel changes strategy at some number
of rows. :func:`cached_cost_model` keeps the result per
model, device, dtype, thread count and torch version under the cache
directory, so it is measured once, at first use, per machine. A profile that breaks ``verify(d) <= 1 + d`` (timings
disturbed by other load) is measured again; after a few failures the linear
model with ``c = 0.02`` is used for the process and nothing is cached.

Worked example: points ``[(0, 1.0), (8, 1.16), (16, 1.4)]`` give
``verify(4) = 1.08``, ``verify(12) = 1.28`` and ``verify(24) = 1.64``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)

PROFILE_DRAFT_LENGTHS: tuple[int, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PROFILE_VERSION = 4  # part of the cache key: profiles measured by an older method are measured again
PROFILE_CONTEXT = 512  # tokens of context the profile is measured at
PROFILE_REPEATS = 5
CURVE_CACHE = 257  # verify costs precomputed for drafts up to 256 tokens
PROFILE_ATTEMPTS = 3  # measurements tried before giving up on a disturbed machine
FALLBACK_PER_TOKEN = 0.02  # c used when no plausible profile can be measured


@dataclass(frozen=True)
class CostModel:
    """Verification cost as a function of the number of draft tokens (see the module docstring).

    Attributes:
        points: ``(draft tokens, cost in target steps)`` pairs, sorted, starting at ``(0, 1.0)``.
        draft_cost: cost of producing a draft, in target steps (0 for cache drafts).
        source: where the figures came from (``"linear c=0.02"``, ``"measured ..."``).
    """

    points: tuple[tuple[int, float], ...]
    draft_cost: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 0:
            raise ValueError("a cost model needs a point at 0 draft tokens")
        lengths = [d for d, _ in self.points]
        if lengths != sorted(set(lengths)):
            raise ValueError(f"cost model points must have increasing lengths, got {lengths}")

    @classmethod
    def linear(cls, c: float) -> CostModel:
        """``verify(d) = 1 + c * d``."""
        if c < 0:
            raise ValueError(f"verify cost per token must be >= 0, got {c}")
        return cls(((0, 1.0), (1, 1.0 + c)), source=f"linear c={c:g}")

    def verify(self, draft_tokens: int) -> float:
        """Cost of a step verifying ``draft_tokens`` draft tokens in one forward (plus ``draft_cost`` if > 0)."""
        return float(self.verify_curve(draft_tokens + 1)[draft_tokens])

    def verify_curve(self, length: int) -> np.ndarray:
        """``[verify(0), ..., verify(length - 1)]`` (a read-only view; computed once up to ``CURVE_CACHE``)."""
        if length <= CURVE_CACHE:
            return self._curve[:length]
        return self._interpolate(length)

    @cached_property
    def _curve(self) -> np.ndarray:
        curve = self._interpolate(CURVE_CACHE)
        curve.flags.writeable = False
        return curve

    def _interpolate(self, length: int) -> np.ndarray:
        xs = np.array([d for d, _ in self.points], dtype=np.float64)
        ys = np.array([c for _, c in self.points], dtype=np.float64)
        d = np.arange(length, dtype=np.float64)
        curve = np.interp(d, xs, ys)
        if len(xs) >= 2:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            beyond = d > xs[-1]
            curve[beyond] = ys[-1] + slope * (d[beyond] - xs[-1])
        curve[1:] += self.draft_cost  # a step without a draft does not draft
        return curve

    def marginal(self, length: int) -> np.ndarray:
        """``[verify(i + 1) - verify(i) for i < length]``: what the i-th draft token adds."""
        return np.diff(self.verify_curve(length + 1))

    def with_drafting(self, per_token: float) -> CostModel:
        """This cost plus ``per_token`` target steps for each drafted token (a model drafter's forwards)."""
        points = tuple((d, c + per_token * d) for d, c in self.points)
        if len(points) == 1:
            points = (*points, (1, points[0][1] + per_token))
        return CostModel(points, self.draft_cost, f"{self.source} + draft {per_token:.3f}/token")

    def scaled(self, alpha: float) -> CostModel:
        """This cost with every draft's extra cost multiplied by ``alpha``: ``1 + alpha * (verify(d) - 1)``
        (see :mod:`hvd_agents.policy.calibration`)."""
        if alpha < 0:
            raise ValueError(f"a cost scale must be >= 0, got {alpha}")
        points = tuple((d, 1.0 + alpha * (c - 1.0)) for d, c in self.points)
        return CostModel(points, self.draft_cost, f"{self.source} x{alpha:.2f} in the engine")

    @property
    def plausible(self) -> bool:
        """Whether ``verify(d) <= 1 + d``: one forward over ``1 + d`` tokens can never cost more than
        ``1 + d`` single-token steps, so a profile that says otherwise was disturbed while measured."""
        return all(cost <= 1.0 + d + 1e-9 for d, cost in self.points)

    @property
    def per_token(self) -> float:
        """Mean marginal cost of a draft token over the measured range (``c`` of the linear model)."""
        (d0, c0), (d1, c1) = self.points[0], self.points[-1]
        return (c1 - c0) / (d1 - d0) if d1 > d0 else 0.0

    def to_dict(self) -> dict:
        return {"points": [list(p) for p in self.points], "draft_cost": self.draft_cost, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        points = tuple((int(d), float(c)) for d, c in data["points"])
        return cls(points, float(data.get("draft_cost", 0.0)), str(data.get("source", "")))


def measure_cost_model(
    model: torch.nn.Module,
    *,
    lengths: Sequence[int] = PROFILE_DRAFT_LENGTHS,
    context: int = PROFILE_CONTEXT,
    repeats: int = PROFILE_REPEATS,
) -> CostModel:
    """Time one verification forward of ``1 + d`` tokens after ``context`` cached tokens, per ``d``."""
    from hvd_agents.engine.kv import new_cache, truncate

    if 0 not in lengths:
        raise ValueError("a cost profile needs a timing at 0 draft tokens")
    device = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    window = int(getattr(model.config, "max_position_embeddings", context + max(lengths) + 1))
    context = max(1, min(context, window - max(lengths) - 1))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, context + max(lengths) + 1), generator=generator).to(device)  # [1, n]
    cache = new_cache(model.config)
    times = {d: float("inf") for d in lengths}
    # every round visits the lengths in a new order, each after a plain step: the plain step, which every
    # ratio divides by, is timed len(lengths) times per round, and no length always follows the same one
    order = [d for d in lengths if d != 0]
    with torch.inference_mode():
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(repeats):
            for i in torch.randperm(len(order), generator=generator).tolist():
                for d in (0, order[i]):
                    _sync(device)
                    start = time.perf_counter()
                    model(input_ids=ids[:, context : context + d + 1], past_key_values=cache, use_cache=True)
                    _sync(device)
                    times[d] = min(times[d], time.perf_counter() - start)
                    truncate(cache, context)
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
    from hvd_agents.cpu_kernels import linear_kernel

    param = next(model.parameters())
    kernel = linear_kernel(model)
    if kernel == "row":
        from hvd_agents.native_linear import build_key

        kernel = f"row {build_key()}"  # a rebuilt kernel may cost differently
    parts = [
        f"profile v{PROFILE_VERSION}",
        kernel,
        str(getattr(model.config, "_attn_implementation", "")),
        str(getattr(model.config, "_name_or_path", "")),
        json.dumps(model.config.to_diff_dict(), sort_keys=True, default=str),
        str(param.device),
        str(param.dtype),
        str(torch.get_num_threads()),
        torch.__version__,
        platform.machine(),
        platform.processor(),
        str(os.cpu_count()),
    ]
    if param.device.type == "cuda":
        parts.append(torch.cuda.get_device_name(param.device))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cached_cost_model(model: torch.nn.Module, directory: Path | None = None) -> CostModel:
    """The model's measured cost profile, from the cache or measured now and cached.

    A missing, unreadable or malformed profile file is measured again (and logged).
    """
    if directory is None:
        from hvd_agents.models import cache_root

        directory = cache_root() / "cost-profiles"
    path = directory / f"{profile_key(model)}.json"
    try:
        return CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("cost profile %s is unreadable (%s); measuring again", path, exc)
    profile = None
    for _ in range(PROFILE_ATTEMPTS):
        measured = measure_cost_model(model)
        if measured.plausible:
            profile = measured
            break
        logger.warning("implausible cost profile %s (timing disturbed by other load?); measuring again",
                       measured.to_dict())
    if profile is None:
        logger.warning("no plausible cost profile after %d attempts; using c=%s, not cached",
                       PROFILE_ATTEMPTS, FALLBACK_PER_TOKEN)
        return CostModel.linear(FALLBACK_PER_TOKEN)
    logger.info("measured the verification cost profile: %s", profile.to_dict())
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(profile.to_dict()), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("cannot cache the cost profile in %s: %s", directory, exc)
    return profile
