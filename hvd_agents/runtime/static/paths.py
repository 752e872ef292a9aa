"""Path attention: each row attends along its own path, in fixed tiles of its own positions.

Why. Speculative output equals plain decoding bit for bit only if a position's logits do
not depend on how many rows shared its forward, or where in a tree its row sat. Dense
masked attention fails both: its reductions run over the whole KV length the forward
reads (a plain step and a 17-row verification read different lengths), and a tree
branch's ancestors sit at slots that are not adjacent, so its sums meet the same terms in
another grouping. On a GPU the kernels themselves change with those shapes.

How. A row at depth ``δ`` below the root of a forward whose cache holds ``past``
positions sees, in order, the cached positions ``[0, past)``, then the root, then its
ancestors, then itself: ``past + δ + 1`` *virtual* positions, exactly the positions plain
decoding would have cached for it. Path attention reads the keys and values of virtual
position ``c`` from slot ``c`` below ``past`` and from its path's slot above (the
:func:`path_inputs` table), and reduces over virtual positions in tiles of
:data:`TILE` that start at multiples of the tile, never across them: the same
numbers in the same tile places, whatever the draft, the tree or the other rows. Past a
row's own length a tile is masked to exact zeros, so tiles beyond it change nothing.

On CUDA the tiles run in a Triton kernel (:mod:`.path_kernels`) split over fixed chunks of
:data:`CHUNK` virtual positions, combined in chunk order (by each row's last chunk to finish, by a
second kernel where the caller has no arrival counts, or not at all where the forward's KV length
says no row reaches past the first chunk). Elsewhere (and as the reference)
:func:`tiled_attention` runs the same tiling with PyTorch operations. Together with a
forward padded to one row count (so every matrix product runs one shape), a row's logits
are bitwise those of the same position decoded alone.

Rows at and after ``count`` are padding: no attention is computed for them and their
output is zero.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache

import torch

from hvd_agents.runtime.tree_mask import ancestors, tree_visibility

logger = logging.getLogger(__name__)

TILE = 64  # virtual positions per reduction tile (a multiple of 16, for the tensor cores)
CHUNK = 512  # virtual positions per parallel chunk on CUDA (a multiple of TILE)
FOLD = True  # on CUDA, a row's last chunk combines its chunks (one kernel) where the caller gives arrival counts


@dataclass(frozen=True)
class PathInputs:
    """Where each row of a forward reads its keys and values (device tensors, fixed shapes).

    Attributes:
        past: ``[1]`` long, positions cached before this forward.
        count: ``[1]`` long, real rows (the rest are padding).
        table: ``[R, R]`` long: for row ``r``, the forward rows on its path (root first, itself last),
            then unused entries.
        depth: ``[R]`` long: each row's depth below the root (its path holds ``depth + 1`` rows).
        bound: known on the host, at least every real row's virtual positions (``past + depth + 1``): the
            forward's KV length; None: the slot's capacity. Where it is at most :data:`CHUNK`, CUDA runs path
            attention as one kernel instead of two (the same values).
    """

    past: torch.Tensor
    count: torch.Tensor
    table: torch.Tensor
    depth: torch.Tensor
    bound: int | None = None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(past, count, table, depth)``, what the CUDA kernel takes."""
        return self.past, self.count, self.table, self.depth


def path_inputs(visible: torch.Tensor, past: torch.Tensor, count: torch.Tensor, bound: int | None = None
                ) -> PathInputs:
    """:class:`PathInputs` from the forward's visibility ``[R, R]`` (row ``r`` sees row ``j``: the root, an
    ancestor, or itself; :func:`~hvd_agents.runtime.tree_mask.tree_visibility`); ``bound``: see :class:`PathInputs`.

    A row's ancestors have smaller indices than it, so its path in depth order is its visible rows in
    increasing order: entry ``v`` of the table is the index of the row's ``(v + 1)``-th visible row.

    >>> vis = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    >>> p = path_inputs(vis, torch.tensor([5]), torch.tensor([4]))
    >>> p.table.tolist(), p.depth.tolist()
    ([[0, 3, 3, 3], [0, 1, 3, 3], [0, 2, 3, 3], [0, 2, 3, 3]], [0, 1, 1, 2])
    """
    rows = visible.shape[0]
    seen = visible.long().cumsum(dim=1)  # [R, R]: visible rows up to and including each column
    v = torch.arange(rows, device=visible.device)
    table = (seen[:, None, :] <= v[None, :, None]).sum(dim=-1).clamp(max=rows - 1)  # [R, R]
    return PathInputs(past=past, count=count, table=table, depth=seen[:, -1] - 1, bound=bound)


def path_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, paths: PathInputs,
                   scaling: float, arrivals: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` ``[heads, R, hd]`` over a slot's ``keys``/``values`` ``[kv_heads, capacity, hd]``,
    each row along its path (see the module docstring); returns ``[R, heads * hd]`` in ``q``'s dtype.
    ``arrivals``: on CUDA, int32 zeros of at least ``kv_heads * R`` that each call leaves zero (:func:`arrivals`),
    so that a forward past one chunk runs one kernel instead of two (the same values; see :data:`FOLD`)."""
    if q.device.type == "cuda":
        device = _device(q.device)
        kernels = _checked(device)
        if kernels is not None:
            fold = arrivals is not None and FOLD and _fold_checked(device)
            return kernels.path_attention(q, keys, values, *paths.tensors(), scaling, TILE, CHUNK, paths.bound,
                                          arrivals if fold else None)
        raise RuntimeError("path attention on CUDA needs its Triton kernels, which are unavailable here "
                           "(see the warning logged when they were checked)")
    return tiled_attention(q, keys, values, paths, scaling)


def arrivals(kv_heads: int, rows: int, device: torch.device) -> torch.Tensor | None:
    """The arrival counts :func:`path_attention` takes for forwards of up to ``rows`` rows on ``device`` (CUDA;
    None elsewhere): one int32 zero per (KV head, row), counted up and reset by every call, never shared by two
    forwards that may run at once."""
    return torch.zeros(kv_heads * rows, dtype=torch.int32, device=device) if device.type == "cuda" else None


def kernels_available(device: torch.device) -> bool:
    """Whether path attention can run on ``device``: anywhere but CUDA in PyTorch; on CUDA where its Triton
    kernels import, compile and agree with :func:`tiled_attention` (checked once per device)."""
    return device.type != "cuda" or _kernels(device) is not None


def _device(device: torch.device) -> torch.device:
    if device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _kernels(device: torch.device):
    return _checked(_device(device))


@cache
def _checked(device: torch.device):
    try:
        from hvd_agents.runtime.static import path_kernels

        with torch.cuda.device(device):  # Triton launches on the current device
            self_check(path_kernels, device)
    except Exception as exc:  # noqa: BLE001 - no Triton, a compiler error or a wrong result: the caller decides
        logger.warning("path attention's kernels are unavailable on %s (%s)", device, exc)
        return None
    return path_kernels


@cache
def _fold_checked(device: torch.device) -> bool:
    """Whether the chunks may be merged by each row's last chunk on ``device`` (checked once, after the rest):
    where that fails, path attention keeps its second kernel, with a warning."""
    try:
        with torch.cuda.device(device):
            self_check(_checked(device), device, folded=True)
    except Exception as exc:  # noqa: BLE001 - a compiler error or a wrong result: two kernels, as before
        logger.warning("path attention merges its chunks with a second kernel on %s (%s)", device, exc)
        return False
    return True


def self_check(kernels, device: torch.device, folded: bool = False) -> None:
    """Raise unless ``kernels.path_attention`` gives :func:`tiled_attention`'s values to rounding, in float32
    on random inputs: a tree of 5 rows (one of them padding) after 3 cached positions, as one kernel (a KV
    length of one chunk) and as two, and after :data:`CHUNK` + 40, where its rows reach into a second chunk.
    ``folded``: the same with arrival counts instead (the chunks merged by each row's last chunk; twice past
    the first chunk, so the counts must have returned to zero in between), which must be left at zero."""
    gen = torch.Generator(device=device).manual_seed(0)
    heads, kv_heads, hd, capacity = 4, 2, 24, CHUNK + 64
    parents = torch.tensor([-1, 0, 0, 2], dtype=torch.long, device=device)
    visible = tree_visibility(ancestors(parents))
    rows = visible.shape[0]
    q = torch.randn(heads, rows, hd, generator=gen, device=device)
    keys = torch.randn(kv_heads, capacity, hd, generator=gen, device=device)
    values = torch.randn(kv_heads, capacity, hd, generator=gen, device=device)
    counts = torch.zeros(kv_heads * rows, dtype=torch.int32, device=device) if folded else None
    cases = ((3, None), (CHUNK + 40, None), (CHUNK + 40, None)) if folded else ((3, CHUNK), (3, None), (CHUNK + 40, None))
    for past, bound in cases:
        paths = path_inputs(visible, torch.tensor([past], device=device), torch.tensor([rows - 1], device=device),
                            bound=bound)
        got = kernels.path_attention(q, keys, values, *paths.tensors(), 0.2, TILE, CHUNK, paths.bound, counts)
        want = tiled_attention(q, keys, values, paths, 0.2)
        how = ", chunks merged by the last" if folded else ""
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"path attention's kernels differ from PyTorch's by {(got - want).abs().max():.3g} "
                                 f"after {past} cached positions (KV length {bound or capacity}{how})")
        if counts is not None and counts.any():
            raise AssertionError("path attention's kernel left its arrival counts non-zero")


def virtual_slots(paths: PathInputs, length: int) -> torch.Tensor:
    """``[R, length]`` long: the slot holding each row's virtual position (clamped where the row has none)."""
    past = paths.past
    cols = torch.arange(length, device=paths.table.device)  # [L]
    rel = (cols - past).clamp(0, paths.table.shape[1] - 1)  # [L]
    above = past + paths.table.index_select(1, rel)  # [R, L]
    return torch.where(cols[None, :] < past, cols[None, :], above)


def tiled_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, paths: PathInputs,
                    scaling: float, tile: int | None = None) -> torch.Tensor:
    """Path attention with PyTorch operations, tile by tile (online softmax), every tile one fixed shape.

    Reads ``past`` on the host, so it is for eager forwards (the CPU), not captured graphs.
    """
    tile = TILE if tile is None else tile
    heads, rows, hd = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    past = int(paths.past.item())
    count = int(paths.count.item())
    tiles = -(-(past + rows) // tile)
    slots = virtual_slots(paths, tiles * tile)  # [R, T * tile]
    own = past + paths.depth  # [R]: each row's own virtual position
    qg = q.view(kv_heads, group, rows, hd).transpose(1, 2).float()  # [kvh, R, g, hd]
    m = torch.full((kv_heads, rows, group), float("-inf"), device=q.device)
    s_sum = torch.zeros(kv_heads, rows, group, device=q.device)
    acc = torch.zeros(kv_heads, rows, group, hd, device=q.device)
    for t in range(tiles):
        cols = torch.arange(t * tile, (t + 1) * tile, device=q.device)  # [tile]
        index = slots[:, t * tile : (t + 1) * tile]  # [R, tile]
        k = keys[:, index].float()  # [kvh, R, tile, hd]
        v = values[:, index]
        s = torch.matmul(qg, k.transpose(-1, -2)) * scaling  # [kvh, R, g, tile]
        seen = cols[None, :] <= own[:, None]  # [R, tile]
        s = s.masked_fill(~seen[None, :, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])  # exact zeros where masked
        s_sum = s_sum * alpha + p.sum(dim=-1)
        acc = acc * alpha[..., None] + torch.matmul(p.to(v.dtype), v).float()
        m = m_new
    out = (acc / s_sum[..., None]).to(q.dtype)  # [kvh, R, g, hd]
    out[:, count:] = 0
    return out.permute(1, 0, 2, 3).reshape(rows, heads * hd)
