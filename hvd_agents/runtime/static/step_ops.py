"""The decode step's small operations in PyTorch: what :mod:`.fused_kernels` computes in three Triton kernels.

The static decoder calls one of the two through the same three functions (:func:`add_rms`, :func:`rope_store`,
:func:`silu_mul`): these off CUDA, or where the kernels are unavailable; and the kernels are checked against
these (:func:`~.fused.self_check`). The arithmetic is HF's: RMSNorm in float32, rounded to the activations'
dtype before its weight; RoPE on the model-dtype tables.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def add_rms(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, weight * rmsnorm(x + delta))`` for ``x`` ``[rows, n]`` (``delta`` None: ``x`` itself)."""
    x = x if delta is None else x + delta
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return x, weight * h.to(x.dtype)


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor, write: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               heads: int, kv_heads: int) -> torch.Tensor:
    """Rotated queries ``[heads, rows, hd]``; rotated keys and the values written into ``keys``/``values``
    (``[kv_heads, capacity, hd]``) at slots ``write``. ``q``/``k``/``v`` are ``[rows, heads * hd]`` projections,
    ``cos``/``sin`` the ``[capacity, hd / 2]`` tables."""
    rows = q.shape[0]
    hd = q.shape[1] // heads
    c, s = cos[positions], sin[positions]  # [R, hd / 2]

    def rope(x: torch.Tensor, n: int) -> torch.Tensor:  # [rows, n * hd] -> [n, rows, hd]
        x = x.reshape(rows, n, hd).transpose(0, 1)
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    keys.index_copy_(1, write, rope(k, kv_heads))
    values.index_copy_(1, write, v.reshape(rows, kv_heads, hd).transpose(0, 1))
    return rope(q, heads)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    return F.silu(gate) * up
