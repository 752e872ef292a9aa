"""Path attention on CUDA: two Triton kernels (imported only where Triton is).

:func:`path_attention` computes what :func:`~.paths.tiled_attention` computes (see
:mod:`.paths` for why), for captured graphs: no host reads, fixed grids.

* ``_partial``: one program per (KV head, row, chunk of :data:`~.paths.CHUNK` virtual
  positions); it loops over the chunk's tiles with an online softmax and writes the chunk's
  running maximum, sum and weighted values for the KV head's query heads (stacked as the
  rows of one tensor-core product, padded to 16). Tiles wholly below the cache's length read
  slot = virtual position, with no path-table load before their keys and values (so the
  compiler prefetches them); the tiles above read through the row's path. Programs of
  padding rows and of chunks past a row's length return at once.
* ``_combine``: one program per (KV head, row); it merges the row's chunks in chunk order
  (a padding row's output is zeros).

Given arrival counts (int32 zeros, one per KV head and row, that every launch leaves zero),
``_partial`` does ``_combine``'s work itself: each program of a row stores its chunk, waits
for its own threads, and counts itself in (an atomic add, acquire-release at device scope);
the program that arrives last, whichever chunk it holds, merges the row's chunks in chunk
order with ``_combine``'s arithmetic (reading them from the device-wide cache) and sets the
count back to zero. The same bits as two kernels, in one launch.

When no row of the forward can reach past the first chunk (a ``length`` of at most
:data:`~.paths.CHUNK` virtual positions, which the runner knows on the host), ``_partial``
alone runs, one chunk per row, and finishes each row itself with ``_combine``'s arithmetic over
one chunk, operation for operation (the same maximum, weight, sums and division), so the
output is the two kernels' bit for bit, in one launch instead of two.

Every reduction runs over a fixed tile or chunk of virtual positions, so a row's result
depends only on its own query and its path's keys and values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP_ROWS = 16  # query heads of one KV head, padded to the tensor cores' smallest M
WARPS = 4  # warps per program of _partial
STAGES = 3  # software-pipelining depth of _partial's tile loop (its K, V and path-table loads)


@triton.jit
def _tile(q, k, v, valid, m, s_sum, acc, scaling, IEEE: tl.constexpr):
    """One tile of the online softmax: the running maximum, sum and weighted values after it."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(valid[None, :], s * scaling, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    s_sum = s_sum * alpha + tl.sum(p, axis=1)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, s_sum, acc * alpha[:, None] + pv


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, past_ptr, count_ptr, table_ptr, depth_ptr, m_ptr, l_ptr, acc_ptr, out_ptr,
             arrivals_ptr, stride_kh, stride_kc, rows, chunks, scaling,
             G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr, TILE: tl.constexpr,
             CHUNK: tl.constexpr, IEEE: tl.constexpr, SINGLE: tl.constexpr, FOLD: tl.constexpr):
    h = tl.program_id(0)
    r = tl.program_id(1)
    c = tl.program_id(2)
    g = tl.arange(0, GP)
    d = tl.arange(0, HDP)  # head_dim padded to a power of two; lanes at or past HD read zeros
    dim = d < HD
    heads = h * G + g
    # every load that does not depend on another is issued here, before the first wait: the row count, the
    # cache's length, the row's depth and its query (which a padding row never uses)
    count = tl.load(count_ptr)
    past = tl.load(past_ptr)
    depth = tl.load(depth_ptr + r)
    q = tl.load(q_ptr + (heads[:, None] * rows + r) * HD + d[None, :], mask=(g[:, None] < G) & dim[None, :],
                other=0.0)
    length = past + depth + 1  # the row's virtual positions
    start = c * CHUNK
    if (r < count) & (start < length):
        end = tl.minimum(start + CHUNK, length)
        m = tl.full([GP], float("-inf"), tl.float32)
        s_sum = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, HDP], tl.float32)
        # the row's tiles in this chunk, trip counts known at run time (tiles at or past the row's end never
        # run). First the tiles wholly below ``past``: virtual position = slot, so their loads need no path
        # table and the compiler prefetches them; then the rest through the row's path. The same tiles in the
        # same order, each by the same arithmetic (_tile), wherever the split falls.
        tiles = ((end - start + TILE - 1) // TILE).to(tl.int32)
        cached = tl.minimum(tl.maximum(past - start, 0) // TILE, tiles).to(tl.int32)
        for i in range(cached):
            cols = start + i * TILE + tl.arange(0, TILE)
            offsets = h * stride_kh + cols[:, None] * stride_kc + d[None, :]
            k = tl.load(k_ptr + offsets, mask=dim[None, :], other=0.0)
            v = tl.load(v_ptr + offsets, mask=dim[None, :], other=0.0)
            m, s_sum, acc = _tile(q, k, v, cols < end, m, s_sum, acc, scaling, IEEE)
        for i in range(cached, tiles):
            cols = start + i * TILE + tl.arange(0, TILE)
            valid = cols < end
            above = cols >= past
            path = tl.load(table_ptr + r * rows + (cols - past), mask=valid & above, other=0)
            slot = tl.where(above, past + path, cols)
            offsets = h * stride_kh + slot[:, None] * stride_kc + d[None, :]
            k = tl.load(k_ptr + offsets, mask=valid[:, None] & dim[None, :], other=0.0)
            v = tl.load(v_ptr + offsets, mask=valid[:, None] & dim[None, :], other=0.0)
            m, s_sum, acc = _tile(q, k, v, valid, m, s_sum, acc, scaling, IEEE)
        keep = g < G
        if SINGLE:  # the row's one chunk, finished as _combine finishes it, each operation the same
            top = tl.maximum(tl.full([GP], float("-inf"), tl.float32), m)
            w = tl.exp(m - top)
            total = tl.zeros([GP], tl.float32) + s_sum * w
            acc = tl.zeros([GP, HDP], tl.float32) + acc * w[:, None]
            out = acc / tl.where(keep, total, 1.0)[:, None]
            at = (r * (tl.num_programs(0) * G) + heads)[:, None] * HD + d[None, :]  # out is [R, heads * HD]
            tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=keep[:, None] & dim[None, :])
        else:
            at = (heads * rows + r) * chunks + c  # [GP]: (head, row, chunk)
            tl.store(m_ptr + at, m, mask=keep)
            tl.store(l_ptr + at, s_sum, mask=keep)
            tl.store(acc_ptr + at[:, None] * HD + d[None, :], acc, mask=keep[:, None] & dim[None, :])
            if FOLD:  # the row's last chunk to finish combines them all, as _combine does
                tl.debug_barrier()  # every thread's stores are issued before the program counts itself in
                used = ((length + CHUNK - 1) // CHUNK).to(tl.int32)  # the row's chunks: its programs that count
                seen = tl.atomic_add(arrivals_ptr + h * rows + r, 1, sem="acq_rel", scope="gpu")
                if seen == used - 1:
                    merged = _finish(m_ptr, l_ptr, acc_ptr, (heads * rows + r) * chunks, used, keep, d, dim, HD, GP,
                                     HDP, ".cg")
                    where = (r * (tl.num_programs(0) * G) + heads)[:, None] * HD + d[None, :]
                    tl.store(out_ptr + where, merged.to(out_ptr.dtype.element_ty), mask=keep[:, None] & dim[None, :])
                    tl.store(arrivals_ptr + h * rows + r, 0)  # counted from zero again by the next forward
    if SINGLE or FOLD:  # noqa: SIM102 - a compile-time branch around a run-time one
        if (r >= count) & (c == 0):  # a padding row: zeros, as _combine writes them
            at = (r * (tl.num_programs(0) * G) + heads)[:, None] * HD + d[None, :]
            zeros = tl.zeros([GP, HDP], tl.float32).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + at, zeros, mask=(g < G)[:, None] & dim[None, :])


@triton.jit
def _finish(m_ptr, l_ptr, acc_ptr, base, used, keep, d, dim, HD: tl.constexpr, GP: tl.constexpr,
            HDP: tl.constexpr, CACHE: tl.constexpr):
    """A row's output from its ``used`` chunks' maxima, sums and weighted values, merged in chunk order.
    ``CACHE``: the loads' cache modifier: ``".cg"`` where other programs of the same launch wrote the chunks
    (read from the device-wide cache, L2, never from this processor's own), else ``""``."""
    top = tl.full([GP], float("-inf"), tl.float32)
    for c in range(used):  # bounded at run time, pipelined: the chunks the row reaches
        top = tl.maximum(top, tl.load(m_ptr + base + c, mask=keep, other=0.0, cache_modifier=CACHE))
    s_sum = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, HDP], tl.float32)
    for c in range(used):  # in chunk order: the sums' grouping never changes
        w = tl.exp(tl.load(m_ptr + base + c, mask=keep, other=0.0, cache_modifier=CACHE) - top)
        s_sum += tl.load(l_ptr + base + c, mask=keep, other=0.0, cache_modifier=CACHE) * w
        part = tl.load(acc_ptr + (base + c)[:, None] * HD + d[None, :], mask=keep[:, None] & dim[None, :], other=0.0,
                       cache_modifier=CACHE)
        acc += part * w[:, None]
    return acc / tl.where(keep, s_sum, 1.0)[:, None]


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, out_ptr, past_ptr, count_ptr, depth_ptr, rows,
             CHUNKS: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr,
             CHUNK: tl.constexpr):
    h = tl.program_id(0)
    r = tl.program_id(1)
    count = tl.load(count_ptr)  # the three loads at once, before the first wait
    past = tl.load(past_ptr)
    depth = tl.load(depth_ptr + r)
    g = tl.arange(0, GP)
    d = tl.arange(0, HDP)
    dim = d < HD
    keep = g < G
    heads = h * G + g
    at = (r * (tl.num_programs(0) * G) + heads)[:, None] * HD + d[None, :]  # out is [R, heads * HD]
    if r >= count:  # a padding row: zeros
        zeros = tl.zeros([GP, HDP], tl.float32).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + at, zeros, mask=keep[:, None] & dim[None, :])
    else:
        length = past + depth + 1
        used = ((length + CHUNK - 1) // CHUNK).to(tl.int32)
        out = _finish(m_ptr, l_ptr, acc_ptr, (heads * rows + r) * CHUNKS, used, keep, d, dim, HD, GP, HDP, "")
        tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=keep[:, None] & dim[None, :])


def path_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: torch.Tensor,
                   count: torch.Tensor, table: torch.Tensor, depth: torch.Tensor, scaling: float, tile: int,
                   chunk: int, length: int | None = None, arrivals: torch.Tensor | None = None) -> torch.Tensor:
    """``[R, heads * hd]``: see :func:`~.paths.path_attention` (``q`` ``[heads, R, hd]``, ``keys``/``values``
    ``[kv_heads, capacity, hd]`` with unit stride in ``hd``; ``past``, ``count``, ``table``, ``depth``: the
    fields of :class:`~.paths.PathInputs`; ``length``: at least every real row's virtual positions, ``past +
    depth + 1``, known on the host (default: the capacity). At most ``chunk``: one kernel, else two, or one
    with ``arrivals``: int32 zeros, at least ``kv_heads * R``, that every launch leaves zero again (the
    row's last chunk to finish combines the row's chunks in place of the second kernel, bit for bit))."""
    heads, rows, hd = q.shape
    kv_heads, capacity = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    if group > GROUP_ROWS or keys.stride() != values.stride() or keys.stride(2) != 1:
        raise ValueError(f"path attention's kernel takes at most {GROUP_ROWS} query heads per KV head (not {group}) "
                         "and keys and values laid out alike, unit stride in head_dim")
    padded = max(16, triton.next_power_of_2(hd))
    chunks = -(-min(capacity, length or capacity) // chunk)
    q = q.contiguous()
    out = torch.empty(rows, heads * hd, dtype=q.dtype, device=q.device)
    ieee = q.dtype == torch.float32
    if chunks == 1:  # _partial finishes each row: one launch
        _partial[(kv_heads, rows, 1)](
            q, keys, values, past, count, table, depth, out, out, out, out, count,
            keys.stride(0), keys.stride(1), rows, 1, scaling,
            G=group, GP=GROUP_ROWS, HD=hd, HDP=padded, TILE=tile, CHUNK=chunk, IEEE=ieee, SINGLE=True, FOLD=False,
            num_warps=WARPS, num_stages=STAGES)
        return out
    fold = arrivals is not None
    if fold and (arrivals.dtype != torch.int32 or arrivals.numel() < kv_heads * rows):
        raise ValueError(f"path attention's arrival counts must be int32, one per KV head and row ({kv_heads} x {rows}), "
                         f"not {arrivals.numel()} of {arrivals.dtype}")
    m = torch.empty(heads, rows, chunks, dtype=torch.float32, device=q.device)
    s_sum = torch.empty_like(m)
    acc = torch.empty(heads, rows, chunks, hd, dtype=torch.float32, device=q.device)
    _partial[(kv_heads, rows, chunks)](
        q, keys, values, past, count, table, depth, m, s_sum, acc, out, arrivals if fold else count,
        keys.stride(0), keys.stride(1), rows, chunks, scaling,
        G=group, GP=GROUP_ROWS, HD=hd, HDP=padded, TILE=tile, CHUNK=chunk, IEEE=ieee, SINGLE=False, FOLD=fold,
        num_warps=WARPS, num_stages=STAGES)
    if fold:
        return out
    _combine[(kv_heads, rows)](m, s_sum, acc, out, past, count, depth, rows,
                               CHUNKS=chunks, G=group, GP=GROUP_ROWS, HD=hd, HDP=padded, CHUNK=chunk)
    return out
