"""Row-streaming linear layers for CPU verification forwards (a small native kernel, built at first use).

A verification forward multiplies a handful of rows (the last token plus a
draft) by weights far larger than any cache, so its cost is reading the weights.
PyTorch's CPU kernels read them once for one row (a matrix-vector product) but
switch to matrix-matrix kernels for two rows or more, which on an AVX2 machine
cost far more than a one-row product. ``hvd::row_linear`` (``native/row_linear.cpp``)
streams each weight row once and multiplies it by every input row while it is in
registers: up to 8 input rows in one pass over one weight row at a time, more in tiles of
4 input rows by 3 weight rows. ``hvd-agents bench-kernels`` measures it against
PyTorch's and oneDNN's layers; dated figures are in ``docs/benchmarks.md``.

It also makes verification exact in a stronger sense: every output element is
summed in the same order whatever the number of rows, so a token's logits are
bitwise the same whether it is decoded alone or verified inside a draft.

The kernel is compiled with ``torch.utils.cpp_extension`` (a C++ compiler and
ninja, once per build key) into ``<cache>/native/<key>/`` and reused by later
processes. It needs an x86-64 CPU with AVX2 and FMA; elsewhere, or when it
cannot be built, :func:`available` is False and the loader falls back to the
oneDNN kernels of :mod:`hvd_agents.runtime.cpu.kernels` (the reason is logged once).
Set ``HVD_AGENTS_CPU_LINEAR`` to choose the kernel by hand (``row``, ``packed``, ``dense``).
"""

from __future__ import annotations

import logging
import platform
import threading

import torch
import torch.nn.functional as F
from torch import nn

from hvd_agents.runtime.cpu import native_build
from hvd_agents.runtime.cpu.packed_linear import require_float32_cpu
from hvd_agents.runtime.paths import cache_root

logger = logging.getLogger(__name__)

SOURCE = native_build.NATIVE_DIR / "row_linear.cpp"
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")  # OpenMP: at::parallel_for runs serially without it
MAX_ROWS = 32  # above this (prefill), PyTorch's matrix-matrix kernels are as fast or faster

_lock = threading.Lock()
_state: dict[str, object] = {}


cpu_supports_kernel = native_build.cpu_supports_avx2


def build_key() -> str:
    """What a build of the kernel depends on (source, flags, torch, Python, machine), hashed: its cache directory."""
    return native_build.build_key(SOURCE, FLAGS)


def _build(directory, name: str) -> None:
    """Compile the kernel into ``directory`` and load it into this process (it registers ``torch.ops.hvd``)."""
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    native_build.with_scripts_on_path()
    cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"],
                       build_directory=str(directory), is_python_module=False, verbose=False)


def available() -> bool:
    """Whether ``torch.ops.hvd.row_linear`` is loaded, building it on first call (cached on disk)."""
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        ok, why = False, ""
        if not cpu_supports_kernel():
            why = f"this CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}) has no AVX2"
        else:
            key = build_key()
            name = f"hvd_row_linear_{key}"
            directory = cache_root() / "native" / key
            library = directory / f"{name}.so"
            try:
                if library.exists():
                    torch.ops.load_library(str(library))
                else:
                    logger.info("building the row-streaming linear kernel (once, about 20 s) in %s", directory)
                    _build(directory, name)
                ok = hasattr(torch.ops.hvd, "row_linear")
                why = "" if ok else "the library loaded but registered no hvd::row_linear"
            except Exception as exc:  # noqa: BLE001 (no compiler, no ninja, no headers: fall back, say why)
                why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}"
        if not ok:
            logger.warning("row-streaming linear kernel unavailable (%s); using PyTorch's CPU kernels", why)
        _state["ok"], _state["why"] = ok, why
        return ok


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True or has not been asked)."""
    return str(_state.get("why", ""))


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the kernel for up to :data:`MAX_ROWS` rows, ``F.linear`` for more
    (float32 CPU tensors, a contiguous ``weight``, inference; the kernel must be :func:`available`)."""
    if x.numel() > MAX_ROWS * weight.shape[1]:
        return F.linear(x, weight, bias)
    return torch.ops.hvd.row_linear(x, weight, bias)


class RowLinear(nn.Module):
    """``y = x W^T + b`` with the row-streaming kernel for up to :data:`MAX_ROWS` rows (float32, CPU, inference).

    Keeps ``weight`` and ``bias`` as ``nn.Linear`` does (same state dict); more
    rows than :data:`MAX_ROWS` (a prefill) go to ``F.linear``.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight
        require_float32_cpu(weight, "RowLinear", "weights")
        if not available():
            raise RuntimeError(f"the row-streaming kernel is unavailable: {unavailable_reason()}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        if not weight.is_contiguous():
            weight = nn.Parameter(weight.detach().contiguous(), requires_grad=weight.requires_grad)
        self.weight = weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_float32_cpu(x, "RowLinear", "inputs")
        return row_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, rows"
