"""The native quantized forward (``native/quant_forward.cpp``): built at first use, loaded once per process.

:func:`module` is the compiled module (``Matrix``, ``QuantModel``, ``linear``,
``dequantize``); :func:`available` says whether it builds and runs here, and
:func:`unavailable_reason` why not. See :mod:`hvd_agents.runtime.quant_runner`.
"""

from __future__ import annotations

import logging
import platform
import threading
from types import ModuleType

import torch

from hvd_agents.runtime.native_build import NATIVE_DIR, build_key, build_python_module, cpu_supports_avx2

logger = logging.getLogger(__name__)

SOURCE = NATIVE_DIR / "quant_forward.cpp"
# OpenMP only for at::parallel_for at load (the forward has its own threads, team.h); no floating-point
# contraction, so every sum is the one written in the source
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off")

# weight formats of native Matrix objects
F32, Q4_1, Q8_0, Q4F = 0, 1, 2, 3
FORMAT_NAMES = {F32: "f32", Q4_1: "q4_1", Q8_0: "q8_0", Q4F: "q4f"}

_lock = threading.Lock()
_state: dict[str, object] = {}


def key() -> str:
    """The build key of the kernel (its cache directory; part of cost-profile keys)."""
    return build_key(SOURCE, FLAGS)


def available() -> bool:
    """Whether the kernel is loaded, building it on first call (cached on disk)."""
    with _lock:
        if "ok" not in _state:
            module, why = None, ""
            if not cpu_supports_avx2():
                why = f"this CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}) has no AVX2"
            else:
                try:
                    module = build_python_module(SOURCE, FLAGS, "hvd_quant")
                except Exception as exc:  # noqa: BLE001 (no compiler, no ninja, no headers: say why, fall back)
                    text = str(exc).strip()
                    why = f"{type(exc).__name__}: {text.splitlines()[-1] if text else exc!r}"
            if module is None:
                logger.warning("quantized CPU forward unavailable (%s); using the float32 model", why)
            _state.update(ok=module is not None, why=why, module=module)
        return bool(_state["ok"])


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True or has not been asked)."""
    return str(_state.get("why", ""))


def module() -> ModuleType:
    """The compiled module.

    Raises:
        RuntimeError: it is unavailable here (the reason is in the message).
    """
    if not available():
        raise RuntimeError(f"the quantized CPU forward is unavailable: {unavailable_reason()}")
    return _state["module"]  # type: ignore[return-value]
