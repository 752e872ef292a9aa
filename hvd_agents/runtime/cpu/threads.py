"""Threads on the CPU hot path: the native forward's team, and torch's own small ops beside it.

A step of the CPU engine is one native forward on its own thread team (``native/team.h``)
followed by a few small torch ops on the logits (the verification's argmax, log-softmax,
entropy: a vocabulary's worth of floats). Left alone, torch runs each of those ops as an
OpenMP parallel region, and libgomp's workers then spin for up to milliseconds waiting for
the next region, on the same cores the native team needs for the next step's forward: both
pools slow each other down. On 2 cores this took the embedded model's ``ar`` decode from
about 200 to about 75 tokens/s.

:func:`native_steps` removes the overlap: inside it, the calling thread's torch ops run on
that thread alone (its OpenMP thread count is 1; ops of a vocabulary's size take as long on
one thread as on two), and :func:`team_threads` tells the native forward how many threads
the caller had, so the forward keeps its full team. Only the calling thread is affected:
other threads, and the thread after the block, keep their torch thread counts. Results do
not depend on any of this: the native forward computes every element in one order whatever
its team's size.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache

import torch

log = logging.getLogger(__name__)

_local = threading.local()


def _torch_library(pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", pattern)))


def _function(names: list[str | None], symbol: str, argtypes: list, restype) -> Callable | None:
    """``symbol`` from the first of ``names`` (library paths; None: the process's global symbols) that has it."""
    for name in names:
        try:
            function = getattr(ctypes.CDLL(name), symbol)
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = argtypes, restype
        return function
    return None


@cache
def _knobs() -> tuple[Callable[[int], None], Callable[[int], int] | None] | None:
    """``omp_set_num_threads`` of torch's OpenMP runtime, and MKL's ``MKL_Set_Num_Threads_Local`` (its vector
    math, e.g. ``exp``, runs its own OpenMP regions) when torch has MKL; None without OpenMP or when not found."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    omp = _function([*_torch_library("libgomp*.so*"), None], "omp_set_num_threads", [ctypes.c_int], None)
    if omp is None or not _works(omp):
        log.info("torch's OpenMP runtime was not found: its small ops keep their threads during CPU steps")
        return None
    mkl = None
    if torch.backends.mkl.is_available():
        mkl = _function([*_torch_library("libtorch_cpu.so*"), None], "MKL_Set_Num_Threads_Local", [ctypes.c_int],
                        ctypes.c_int)
    return omp, mkl


def _works(setter: Callable[[int], None]) -> bool:
    """Whether ``setter`` changes what torch reads on this thread (it is torch's OpenMP runtime)."""
    before = torch.get_num_threads()
    try:
        setter(1 if before != 1 else 2)
        return torch.get_num_threads() == (1 if before != 1 else 2)
    finally:
        setter(before)


@contextmanager
def native_steps() -> Iterator[None]:
    """Run the block's torch ops on the calling thread alone; the native forward keeps the caller's team.

    Re-entrant; a no-op where torch has one thread or no OpenMP runtime to set.
    """
    if getattr(_local, "team", 0):
        yield
        return
    team = torch.get_num_threads()  # also ATen's per-thread initialisation, before the count is set below
    knobs = _knobs() if team > 1 else None
    if knobs is None:
        yield
        return
    omp, mkl = knobs
    _local.team = team
    omp(1)
    mkl_before = mkl(1) if mkl is not None else None
    try:
        yield
    finally:
        if mkl is not None:
            mkl(mkl_before)  # 0: MKL's global setting again
        omp(team)
        _local.team = 0


def team_threads() -> int:
    """The native forward's team size for a call from this thread: the caller's torch thread count."""
    return getattr(_local, "team", 0) or torch.get_num_threads()


def step_threads(runner: object) -> AbstractContextManager[None]:
    """:func:`native_steps` for a runner whose forward runs on its own threads (``runs_own_threads``), else nothing.

    A runner whose forward is torch's own (the HF runner) needs torch's threads for it.
    """
    return native_steps() if getattr(runner, "runs_own_threads", False) else nullcontext()
