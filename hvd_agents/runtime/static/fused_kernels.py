"""The decode step's small operations fused into three Triton kernels (imported only where Triton is).

A captured step of a small model is bound by its kernel count, not its bytes: each tiny
kernel costs a few microseconds however little it does, and the plain PyTorch layer issues
about 46 of them (RMSNorm alone is eight, RoPE seven per tensor). These kernels cut a layer
to about 13 (with the matrix products and path attention):

* :func:`add_rms`: ``x + delta`` (the residual) and the RMSNorm of the sum, scaled by its weight;
* :func:`rope_store`: RoPE of the queries (written in ``[heads, rows, head_dim]``, what path
  attention reads) and of the keys, the keys and values written straight into their KV slots;
* :func:`silu_mul`: ``silu(gate) * up``.

Each program handles one row (and one head), with every reduction inside it, so a row's
result does not depend on how many rows the call has: they keep the bitwise mode's
invariance, in prefill chunks too. Arithmetic is float32, rounded once to the model's dtype
per output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms(x_ptr, d_ptr, w_ptr, x_out_ptr, h_out_ptr, n, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n
    x = tl.load(x_ptr + r * n + cols, mask=inside, other=0.0)
    if HAS_DELTA:
        delta = tl.load(d_ptr + r * n + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x_out_ptr.dtype.element_ty)
        tl.store(x_out_ptr + r * n + cols, x, mask=inside)
    h = x.to(tl.float32)
    h = h * (1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n + eps))
    h = h.to(x_out_ptr.dtype.element_ty).to(tl.float32)  # RMSNorm rounds to the activations' dtype before the weight
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(h_out_ptr + r * n + cols, (w * h).to(h_out_ptr.dtype.element_ty), mask=inside)


def add_rms(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, weight * rmsnorm(x + delta))`` for ``x`` ``[rows, n]`` (``delta`` None: ``x`` itself)."""
    rows, n = x.shape
    x = x.contiguous()
    out = torch.empty_like(x) if delta is not None else x
    h = torch.empty_like(x)
    _add_rms[(rows,)](x, delta.contiguous() if delta is not None else x, weight, out, h, n, eps,
                      HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(n))
    return out, h


@triton.jit
def _rope_store(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, write_ptr, kc_ptr, vc_ptr, q_out_ptr, rows,
                stride_q, stride_k, stride_v, stride_kh, stride_kc,
                NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, HALF: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    inside = i < HD // 2
    pos = tl.load(pos_ptr + r)
    cos = tl.load(cos_ptr + pos * (HD // 2) + i, mask=inside, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * (HD // 2) + i, mask=inside, other=0.0).to(tl.float32)
    if h < NH:
        src = q_ptr + r * stride_q + h * HD
        dst = q_out_ptr + (h * rows + r) * HD
    else:
        kh = h - NH
        slot = tl.load(write_ptr + r)
        src = k_ptr + r * stride_k + kh * HD
        dst = kc_ptr + kh * stride_kh + slot * stride_kc
        v_src = v_ptr + r * stride_v + kh * HD
        v_dst = vc_ptr + kh * stride_kh + slot * stride_kc
        tl.store(v_dst + i, tl.load(v_src + i, mask=inside), mask=inside)
        tl.store(v_dst + HD // 2 + i, tl.load(v_src + HD // 2 + i, mask=inside), mask=inside)
    a = tl.load(src + i, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(src + HD // 2 + i, mask=inside, other=0.0).to(tl.float32)
    tl.store(dst + i, (a * cos - b * sin).to(q_out_ptr.dtype.element_ty), mask=inside)
    tl.store(dst + HD // 2 + i, (b * cos + a * sin).to(q_out_ptr.dtype.element_ty), mask=inside)


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor, write: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               heads: int, kv_heads: int) -> torch.Tensor:
    """Rotated queries ``[heads, rows, hd]``; rotated keys and the values written into ``keys``/``values``
    (``[kv_heads, capacity, hd]``) at slots ``write``. ``q``/``k``/``v`` are ``[rows, heads * hd]`` projections
    (rows may be strided, as slices of one stacked product), ``cos``/``sin`` the ``[capacity, hd / 2]`` tables."""
    rows = q.shape[0]
    hd = q.shape[1] // heads
    q, k, v = (t if t.stride(1) == 1 else t.contiguous() for t in (q, k, v))
    q_out = torch.empty(heads, rows, hd, dtype=q.dtype, device=q.device)
    _rope_store[(rows, heads + kv_heads)](
        q, k, v, cos, sin, positions, write, keys, values, q_out, rows, q.stride(0), k.stride(0), v.stride(0),
        keys.stride(0), keys.stride(1), NH=heads, NKV=kv_heads, HD=hd, HALF=triton.next_power_of_2(hd // 2))
    return q_out


@triton.jit
def _silu_mul(g_ptr, u_ptr, out_ptr, n, stride_g, stride_u, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n
    g = tl.load(g_ptr + r * stride_g + cols, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + r * stride_u + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * n + cols, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=inside)


SILU_BLOCK = 1024


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``[rows, n]`` tensors (rows may be strided, as slices of one stacked product)."""
    rows, n = gate.shape
    gate, up = (t if t.stride(1) == 1 else t.contiguous() for t in (gate, up))
    out = torch.empty(rows, n, dtype=gate.dtype, device=gate.device)
    _silu_mul[(rows, triton.cdiv(n, SILU_BLOCK))](gate, up, out, n, gate.stride(0), up.stride(0), BLOCK=SILU_BLOCK)
    return out
