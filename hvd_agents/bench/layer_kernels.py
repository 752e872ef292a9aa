"""One layer's product on every CPU kernel that could hold quantized weights: speed and batch invariance.

The first table of ``hvd-agents bench-kernels``: a 1536 x 576 layer (an MLP
projection of the embedded model), rows alone and in calls of 9 and 33 rows
(minimum milliseconds), and how many of 130 rows computed inside calls of 2 to 64
rows differ from the same rows computed alone. Kernels: PyTorch's weight-only
``int8`` and ``int4`` CPU kernels, PyTorch's float32 ``F.linear``, and the native
runner's Q4_1 and Q8_0 kernels (:mod:`hvd_agents.runtime.cpu.native_forward`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

SIZES = (2, 5, 9, 17, 33, 64)


def _kernels(w: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    from hvd_agents.runtime.cpu import native_forward
    from hvd_agents.runtime.cpu import weights as quant_weights

    n, k = w.shape
    kernels: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    scale = w.abs().amax(1) / 127
    w8 = torch.round(w / scale[:, None]).to(torch.int8)
    kernels["torch int8 (_weight_int8pack_mm)"] = lambda x: torch.ops.aten._weight_int8pack_mm(x, w8, scale)
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
        scales = torch.randn(k // 32, n, 2)
        kernels["torch int4 (_weight_int4pack_mm_for_cpu)"] = \
            lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales)
    except (AttributeError, RuntimeError):  # a torch build without the int4 CPU kernel
        pass
    kernels["torch float32 F.linear"] = lambda x: torch.nn.functional.linear(x, w)
    if native_forward.available():
        module = native_forward.module()
        for name, fmt, quantize in (("native q4_1", native_forward.Q4_1, quant_weights.quantize_q4_1),
                                    ("native q8_0", native_forward.Q8_0, quant_weights.quantize_q8_0)):
            matrix = module.Matrix(fmt, n, k, torch.from_numpy(quantize(w.numpy()).reshape(-1).copy()))
            kernels[name] = lambda x, m=matrix: module.linear(m, x)
    return kernels


def _ms(f: Callable, x: torch.Tensor, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(x)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _differing(f: Callable, x: torch.Tensor) -> int:
    alone = [f(x[i : i + 1])[0] for i in range(x.shape[0])]
    return sum(not torch.equal(f(x[:m])[i], alone[i]) for m in SIZES for i in range(m))


def run_layer_benchmark(rows: int = 1536, cols: int = 576, repeats: int = 200) -> None:
    """Print the table (see the module docstring)."""
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(rows, cols, generator=generator)
    x = torch.randn(64, cols, generator=generator)
    print(f"one {rows} x {cols} layer, {torch.get_num_threads()} threads: minimum ms of a call, and rows of calls "
          f"of {'/'.join(map(str, SIZES))} rows that differ from the same rows alone")
    print(f"{'kernel':<44}{'1 row':>9}{'9 rows':>9}{'33 rows':>9}{'differing rows':>17}")
    for name, f in _kernels(w).items():
        print(f"{name:<44}{_ms(f, x[:1], repeats):>9.3f}{_ms(f, x[:9], repeats):>9.3f}{_ms(f, x[:33], repeats):>9.3f}"
              f"{f'{_differing(f, x)}/{sum(SIZES)}':>17}")
    print()
