"""The device a model is loaded on, its default dtype, and the CPU threads torch uses there.

:func:`resolve_device` turns a user's device (a name, a ``torch.device`` or None) into a device and its dtype, and
on the CPU gives torch every core this process may run on (once per process); :func:`resolve_dtype` reads a
user's dtype. Bad input raises :class:`~hvd_agents.errors.InvalidRequestError` naming it.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from hvd_agents.errors import InvalidRequestError

logger = logging.getLogger(__name__)

_threads_lock = threading.Lock()
_threads_configured = False


def _configure_cpu_threads() -> None:
    """Use every core this process may run on (once per process)."""
    global _threads_configured
    with _threads_lock:
        if _threads_configured:
            return
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        torch.set_num_threads(max(1, cores))
        _threads_configured = True
        logger.debug("torch uses %d CPU threads", cores)


def resolve_device(device: str | torch.device | None = None) -> tuple[torch.device, torch.dtype]:
    """The device to load on and its default dtype.

    Args:
        device: "cpu", "cuda", "cuda:N", a ``torch.device``, or None for CUDA when
            available, else CPU.

    Returns:
        ``(device, dtype)``: bfloat16 on CUDA (float16 if bf16 is unsupported), float32 on CPU.

    Raises:
        InvalidRequestError: the device is malformed, not CPU/CUDA, or CUDA is unavailable.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"invalid device {device!r}: {exc}") from exc
    if dev.type == "cpu":
        _configure_cpu_threads()
        return dev, torch.float32
    if dev.type != "cuda":
        raise InvalidRequestError(f"unsupported device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise InvalidRequestError(f"device {device!r} requested but CUDA is not available")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InvalidRequestError(f"device {device!r} requested but only {torch.cuda.device_count()} GPU(s) exist")
    return dev, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def resolve_dtype(dtype: torch.dtype | str | None, default: torch.dtype) -> torch.dtype:
    """``dtype`` as a torch dtype (accepts names like "float32"), or ``default`` when None."""
    if dtype is None:
        return default
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidRequestError(f"invalid dtype {dtype!r}: use a floating-point torch dtype")
    return dtype
