"""A drafter's linear layers on the native forward's int8 kernel and thread team.

A draft head drafts one token at a time between the target's forwards, inside the
engine's step, where torch runs on one thread (:mod:`hvd_agents.runtime.cpu.threads`
keeps torch's OpenMP workers off the native team's cores). A float32 product there
reads every weight at 4 bytes on one core. :class:`QuantLinear` holds an
``nn.Linear``'s weight a second time as Q8_0 blocks (one float16 scale per 32 int8
weights, about 1.06 bytes a weight) and multiplies its input rows with the native
forward's own ``linear`` kernel on the native team (no second thread pool), the
kernel's :data:`MAX_ROWS` rows a call: a quarter of the bytes. A catch-up of 112 context
rows through the shipped head's five layers takes 2.4 ms on one thread there against
11 ms in float32 (2-core AMD EPYC). ``threads`` says how many of the team's threads a
product takes (0: the caller's team size,
:func:`~hvd_agents.runtime.cpu.threads.team_threads`). A drafter's matrices are small
(0.3 to 4.5 MB as Q8_0, about 10 MB for the shipped head's drafted token), but the target's forward between
two drafted tokens evicts them from the caches, so a product reads them from memory: inside the engine the
shipped head's step took 1.6 ms against 0.6 ms when repeated alone, and a second thread draws twice the
bandwidth. Measured on the 2-core benchmark machine, quiet, with the head shipped on 2026-12-06 (model arm
against ``ar``, interleaved in one process): 0.93x / 0.94x on chat on two threads against 0.87x / 0.89x and
0.88x / 0.90x on one (two pairs, at two drafting thresholds), the same order on the agent prompts; on that
machine loaded by other work one thread had been faster (a hand-over then waits on a busy core). Hence
:data:`DRAFT_THREADS`.

Contract: inference only. With gradients enabled the layer is ``F.linear`` on its
float ``weight`` (the Q8_0 copy is taken once, when the layer is built: change the
weight afterwards and build a new layer). The native kernel also quantizes its input rows per block of 32, so results
differ from the float layer's by quantization error (about 1e-2 relative): use it
only where a result steers speed, never output (a draft, which the target
verifies). For a given input row the result is bitwise the same whatever the team
size and whatever other rows share the call (the native kernel computes every
element in one order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.threads import team_threads
from hvd_agents.runtime.cpu.weights import QK, quantize_q8_0

MAX_ROWS = 1024  # rows per call of the native kernel (quant_forward.cpp's kMaxRows): more go in several calls
DRAFT_THREADS = 2  # a drafter's products take two of the team's threads (see the module docstring)


def supported(linear: nn.Linear) -> bool:
    """Whether ``linear`` can be held as a :class:`QuantLinear`: float32 on the CPU, columns in blocks of 32,
    and the native kernel available here."""
    weight = linear.weight
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.shape[1] % QK == 0
            and native_forward.available())


class QuantLinear(nn.Module):
    """``y = x W^T`` on the native int8 kernel and team (see the module docstring).

    Keeps ``weight`` (and ``bias``) as the ``nn.Linear`` it replaces (same state dict); the Q8_0 copy
    is not part of the state. ``threads``: the team threads a product takes (0: the caller's team size).

    Raises:
        ValueError: ``linear`` is not :func:`supported`.
    """

    def __init__(self, linear: nn.Linear, threads: int = DRAFT_THREADS) -> None:
        super().__init__()
        if threads < 0:
            raise ValueError(f"threads must be >= 0, got {threads}")
        self.threads = threads
        if not supported(linear):
            raise ValueError("QuantLinear takes a float32 CPU linear layer with columns in blocks of 32, "
                             f"and the native kernel ({native_forward.unavailable_reason() or 'available'})")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.matrix = quantized_matrix(linear.weight.detach(),
                                       None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_product(x, self.matrix, self.weight, self.bias, threads=self.threads)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, q8_0"


def quantized_matrix(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """The native module's ``Matrix`` of a float32 ``[N, K]`` weight as Q8_0 blocks (K a multiple of 32)."""
    rows, cols = weight.shape
    blocks = torch.from_numpy(quantize_q8_0(weight.detach().float().contiguous().numpy()).reshape(-1))
    native = native_forward.module()
    return native.Matrix(native_forward.Q8_0, rows, cols, blocks,
                         None if bias is None else bias.detach().float().contiguous())


def quant_product(x: torch.Tensor, matrix, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  threads: int = DRAFT_THREADS) -> torch.Tensor:
    """``x @ weight.T (+ bias)``: on ``matrix`` (:func:`quantized_matrix` of ``weight``) and ``threads`` of the
    native team (0: the caller's team size) for float32 inference inputs, :data:`MAX_ROWS` rows a call, else
    ``F.linear`` on ``weight``. A row's result does not depend on ``threads`` or on the other rows, so neither on
    how many calls the rows took."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if torch.is_grad_enabled() or x.dtype != torch.float32 or rows == 0:
        return F.linear(x, weight, bias)
    native, team = native_forward.module(), threads or team_threads()
    flat = x.reshape(rows, x.shape[-1])
    if rows <= MAX_ROWS:
        y = native.linear(matrix, flat, threads=team)
    else:
        y = torch.cat([native.linear(matrix, flat[start : start + MAX_ROWS], threads=team)
                       for start in range(0, rows, MAX_ROWS)])
    return y.reshape(*x.shape[:-1], y.shape[-1])
