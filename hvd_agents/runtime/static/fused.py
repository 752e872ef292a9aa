"""Whether a static decoder uses the fused Triton kernels of :mod:`.fused_kernels`.

On CUDA with Triton, the kernels are compiled and checked once per device against PyTorch's
operations on random inputs; if they fail to build or disagree, the decoder keeps PyTorch's
operations (slower: more kernels per step) and says so in a warning. Elsewhere, or with
``HVD_AGENTS_FUSED_KERNELS=0``, PyTorch's operations run.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from types import ModuleType

import torch

from hvd_agents.runtime.static import step_ops

logger = logging.getLogger(__name__)


def load_fused_kernels(device: torch.device) -> ModuleType | None:
    """:mod:`.fused_kernels` when it can run on ``device`` and agrees with PyTorch there, else None."""
    if device.type != "cuda" or os.environ.get("HVD_AGENTS_FUSED_KERNELS", "1") == "0":
        return None
    return _checked(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))


@cache
def _checked(device: torch.device) -> ModuleType | None:
    try:
        from hvd_agents.runtime.static import fused_kernels

        self_check(fused_kernels, device)
    except Exception as exc:  # noqa: BLE001 - no Triton, a compiler error or a wrong result: PyTorch's operations
        logger.warning("the fused decode kernels are unavailable on %s (%s): the step runs PyTorch's operations",
                       device, exc)
        return None
    return fused_kernels


def self_check(kernels: ModuleType, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Raise unless each kernel matches :mod:`.step_ops` (PyTorch's operations) on random inputs, to rounding.

    Shapes: 3 rows, hidden 72 (not a power of two), 3 query heads and 1 KV head of head_dim 24; q/k/v and
    gate/up as slices of one stacked product, as the decoder passes them.
    """
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    rows, heads, kv_heads, hd, capacity = 3, 3, 1, 24, 16
    x, delta, weight = randn(rows, 72), randn(rows, 72), randn(72)
    for d in (delta, None):
        _close("add_rms", kernels.add_rms(x, d, weight, 1e-5), step_ops.add_rms(x, d, weight, 1e-5))
    q, k, v = randn(rows, (heads + 2 * kv_heads) * hd).split([heads * hd, kv_heads * hd, kv_heads * hd], dim=1)
    cos, sin = randn(capacity, hd // 2), randn(capacity, hd // 2)
    positions = torch.tensor([4, 9, 2], device=device)
    write = torch.tensor([5, 6, 7], device=device)
    slots = []
    for ops in (kernels, step_ops):
        keys = torch.zeros(kv_heads, capacity, hd, device=device, dtype=dtype)
        values = torch.zeros_like(keys)
        slots.append((ops.rope_store(q, k, v, cos, sin, positions, write, keys, values, heads, kv_heads), keys, values))
    _close("rope_store", slots[0], slots[1])  # the queries, and the whole slots: nothing written elsewhere
    gate, up = randn(rows, 3000).split(1500, dim=1)
    _close("silu_mul", kernels.silu_mul(gate, up), step_ops.silu_mul(gate, up))


def _close(name: str, got, want) -> None:
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if not torch.allclose(g, w, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{name} differs from PyTorch by {(g - w).abs().max().item():.3g}")
