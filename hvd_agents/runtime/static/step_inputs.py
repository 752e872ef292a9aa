"""The decode step's inputs from its packed buffer: positions, KV write slots, and what attention reads.

:func:`decode_inputs` builds them with PyTorch operations (the reference, and what runs off
CUDA); :mod:`.input_kernel` builds the same values in one Triton kernel. On CUDA the decoder
takes the kernel (:func:`load_input_kernel`): before its first use at a row count and an
attention kind it is compiled and compared with :func:`decode_inputs` on chains, trees, padding
rows and cached lengths around the tiles' and chunks' boundaries (:func:`self_check`), and
wherever it fails to build or differs in any value, PyTorch's operations run, with a warning.
``HVD_AGENTS_STEP_INPUT_KERNEL=0`` turns the kernel off, and so does ``HVD_AGENTS_FUSED_KERNELS=0``
(which turns off every Triton kernel of the step's small operations).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Iterator
from functools import cache

import torch

from hvd_agents.runtime.static.paths import PathInputs, path_inputs
from hvd_agents.runtime.tree_mask import ancestors, tree_positions, tree_visibility

logger = logging.getLogger(__name__)

ENV_SWITCH = "HVD_AGENTS_STEP_INPUT_KERNEL"
BOUNDARY_PASTS = (0, 1, 63, 64, 65, 511, 512, 513)  # cached lengths at and around the tiles' and chunks' edges

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | PathInputs]
Builder = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor | None], Inputs]


def decode_inputs(parents: torch.Tensor, past: torch.Tensor, length: int, count: torch.Tensor | None = None) -> Inputs:
    """Positions ``[R]``, KV write positions ``[R]`` and what attention reads of a bucketed forward: the
    mask ``[R, L]`` (dense), or with ``count`` the rows' :class:`~.paths.PathInputs` (path attention).

    Args:
        parents: ``[R - 1]`` long: each row after the first, its parent among the draft rows (-1: the root).
        past: ``[1]`` long, positions already cached.
        length: ``L``, the KV positions dense attention reads (path attention: the rows' bound, at least ``past + R``).
        count: ``[1]`` long, the real rows (path attention only).
    """
    rows = parents.shape[0] + 1
    anc = ancestors(parents)  # [R - 1, R - 1]
    positions = tree_positions(past, anc)  # [R]
    visible = tree_visibility(anc)  # [R, R]
    write = past + torch.arange(rows, device=parents.device)  # [R]
    if count is not None:
        return positions, write, path_inputs(visible, past, count, bound=length)
    cols = torch.arange(length, device=parents.device)  # [L]
    rel = cols - past  # [L]: column's offset among this forward's rows
    new = (rel >= 0) & (rel < rows)
    mask = (cols < past)[None, :] | (new[None, :] & visible.index_select(1, rel.clamp(0, rows - 1)))  # [R, L]
    return positions, write, mask


def load_input_kernel(device: torch.device) -> Builder | None:
    """The step-input kernel for ``device``, checked shape by shape (:class:`CheckedKernel`), or None off CUDA,
    when switched off, or when Triton is not importable (then :func:`decode_inputs` runs)."""
    switches = (os.environ.get("HVD_AGENTS_FUSED_KERNELS", "1"), os.environ.get(ENV_SWITCH, "1"))
    if device.type != "cuda" or "0" in switches:
        return None
    return _checked(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))


@cache
def _checked(device: torch.device) -> Builder | None:
    try:
        from hvd_agents.runtime.static import input_kernel
    except Exception as exc:  # noqa: BLE001 - no Triton (or a broken one): PyTorch's operations
        logger.warning("the step-input kernel is unavailable on %s (%s): the step builds its inputs with PyTorch's "
                       "operations", device, exc)
        return None
    return CheckedKernel(input_kernel.decode_inputs, device)


class CheckedKernel:
    """A step-input builder that is :func:`self_check`-ed at each (row count, attention kind) before its first use
    there, and replaced by :func:`decode_inputs` where the check fails (with a warning).

    A shape first met during a graph capture (where a check cannot synchronise; captures run the forward
    eagerly first, so this does not happen in the runner) takes :func:`decode_inputs` unchecked.
    """

    def __init__(self, kernel: Builder, device: torch.device) -> None:
        self.kernel = kernel
        self.device = device
        self.verdicts: dict[tuple[int, bool], bool] = {}  # (rows, paths) -> the kernel passed its check there

    def __call__(self, parents: torch.Tensor, past: torch.Tensor, length: int, count: torch.Tensor | None = None
                 ) -> Inputs:
        key = (parents.shape[0] + 1, count is not None)
        ok = self.verdicts.get(key)
        if ok is None:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return decode_inputs(parents, past, length, count)
            ok = self.verdicts[key] = self._check(*key)
        return (self.kernel if ok else decode_inputs)(parents, past, length, count)

    def _check(self, rows: int, paths: bool) -> bool:
        try:
            self_check(self.kernel, self.device, rows, paths)
        except Exception as exc:  # noqa: BLE001 - a compiler error or a wrong value: PyTorch's operations
            logger.warning("the step-input kernel failed its check on %s at %d rows (%s): those steps build their "
                           "inputs with PyTorch's operations", self.device, rows, exc)
            return False
        return True


def check_cases(rows: int, capacity: int | None = None, *, trees: int = 8, seed: int = 0
                ) -> Iterator[tuple[list[int], int, int, int]]:
    """``(parents, past, length, count)`` cases for an ``R``-row forward, as the runner packs them: chains of 1 to
    ``R`` real rows and random trees, padding rows hanging off the root, at cached lengths from
    :data:`BOUNDARY_PASTS` and near ``capacity``, dense lengths exactly ``past + R`` or rounded up to 64 or 512;
    and two with parents that form no tree (out of range, forward or cyclic), where both builders must still
    agree."""
    rng = random.Random(seed * 1009 + rows)
    pasts = list(BOUNDARY_PASTS) + ([capacity - rows - 1, capacity - rows] if capacity else [])

    def where(i: int) -> tuple[int, int]:
        past = pasts[i % len(pasts)]
        end = past + rows
        return past, (end, -(-end // 64) * 64, -(-end // 512) * 512)[i % 3]

    def padded(draft: list[int], n: int) -> list[int]:
        return draft + [-1] * (rows - n)

    i = 0
    for n in range(1, rows + 1):
        yield (padded(list(range(-1, n - 2)), n), *where(i), n)
        i += 1
    for _ in range(trees):
        n = rng.randint(1, rows)
        yield (padded([rng.randint(-1, j - 1) for j in range(n - 1)], n), *where(i), n)
        i += 1
    for _ in range(2):
        yield [rng.randint(-3, rows + 1) for _ in range(rows - 1)], *where(i), rng.randint(1, rows)
        i += 1


def self_check(build: Builder, device: torch.device, rows: int, paths: bool, capacity: int | None = None, *,
               trees: int = 8, seed: int = 0) -> int:
    """Raise unless ``build`` gives :func:`decode_inputs`' values, dtypes and shapes, exactly, on every case of
    :func:`check_cases` (``paths``: path attention's tables, else the dense mask). Returns the cases checked."""
    checked = 0
    for parents, past, length, count in check_cases(rows, capacity, trees=trees, seed=seed):
        args = (torch.tensor(parents, dtype=torch.long, device=device), torch.tensor([past], device=device), length,
                torch.tensor([count], device=device) if paths else None)
        got, want = _flat(build(*args)), _flat(decode_inputs(*args))
        for name, g, w in zip(("positions", "write", "table/mask", "depth", "bound"), got, want, strict=True):
            if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
                raise AssertionError(f"{name} differs from PyTorch's at parents={parents}, past={past}, "
                                     f"length={length}, count={count}")
        checked += 1
    return checked


def _flat(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    positions, write, attend = inputs
    if isinstance(attend, PathInputs):
        return positions, write, attend.table, attend.depth, torch.tensor(attend.bound or -1)
    return positions, write, attend, positions[:0], torch.tensor(-1)
