"""The decode step's inputs in one Triton kernel (imported only where Triton is).

:func:`decode_inputs` computes what :func:`~.step_inputs.decode_inputs` computes with about
forty PyTorch operations (the draft's ancestors by repeated squaring, the rows' depths and
positions, the KV write slots, then path attention's tables or the dense mask), in one launch:

* one program builds the rows' visibility ``[R, R]`` in registers: the parent relation,
  squared as often as the PyTorch version squares it (each product a tensor-core product of
  zeros and ones, exact), the root column added; then the depths (row sums), the positions
  and write slots, and for path attention the table, each visible column stored at its rank
  among the row's visible columns (a cumulative sum) and the row's last row index after it;
* for dense attention the grid spans the mask's columns, one block each; a block that holds
  some of this forward's own columns builds the visibility too and gathers its columns with
  a product against their one-hot selection (exact again), the others are ``cols < past``.

The outputs are integers, and they are the PyTorch version's for every input, including
parents that do not form a tree (out of range, or cycles): both compute the same closure.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hvd_agents.runtime.static.paths import PathInputs

MASK_BLOCK = 64  # mask columns per program (dense attention)
MIN_ROWS = 16  # rows are padded to a power of two, at least the tensor cores' smallest M


@triton.jit
def _visibility(parents_ptr, rows, RP: tl.constexpr, SQUARINGS: tl.constexpr):
    """``[RP, RP]`` bool: row ``r`` sees row ``c`` (the root, an ancestor, itself); false outside ``[R, R]``."""
    r = tl.arange(0, RP)
    draft = (r >= 1) & (r < rows)  # the draft's rows: row i + 1 is draft token i
    par = tl.load(parents_ptr + (r - 1), mask=draft, other=-1)
    linked = draft & (par >= 0) & (par < rows - 1)  # -1 and out-of-range parents match no token
    prow = tl.where(linked, par + 1, -1).to(tl.int32)  # the parent's row
    step = (r[:, None] == r[None, :]) | (prow[:, None] == r[None, :])
    reach = (step & draft[:, None] & draft[None, :]).to(tl.float32)
    for _ in tl.static_range(SQUARINGS):  # reachable in at most 2**k steps: exact sums of zeros and ones
        reach = (tl.dot(reach, reach) > 0).to(tl.float32)
    return (reach > 0) | ((r[None, :] == 0) & (r[:, None] < rows))


@triton.jit
def _step_inputs(parents_ptr, past_ptr, positions_ptr, write_ptr, table_ptr, depth_ptr, mask_ptr, rows, length,
                 RP: tl.constexpr, SQUARINGS: tl.constexpr, PATHS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    past = tl.load(past_ptr)
    r = tl.arange(0, RP)
    inside = r < rows
    if PATHS:  # one program
        vis = _visibility(parents_ptr, rows, RP, SQUARINGS)
        seen = tl.cumsum(vis.to(tl.int32), axis=1)  # [RP, RP]: visible columns up to each
        depth = tl.sum(vis.to(tl.int32), axis=1) - 1
        tl.store(positions_ptr + r, past + depth, mask=inside)
        tl.store(write_ptr + r, past + r, mask=inside)
        tl.store(depth_ptr + r, depth.to(tl.int64), mask=inside)
        both = inside[:, None] & inside[None, :]
        # entry v of a row: its (v + 1)-th visible column; past the row's depth, the last row (clamped)
        cols = tl.broadcast_to(r[None, :], (RP, RP))
        tl.store(table_ptr + r[:, None] * rows + (seen - 1), cols.to(tl.int64), mask=vis & both)
        last = tl.full((RP, RP), 0, tl.int64) + (rows - 1)
        tl.store(table_ptr + r[:, None] * rows + r[None, :], last, mask=(r[None, :] > depth[:, None]) & both)
    else:  # one program per block of mask columns
        cols = b * BLOCK + tl.arange(0, BLOCK)
        rel = cols - past  # [BLOCK]: the column's offset among this forward's rows
        new = (rel >= 0) & (rel < rows)
        old = cols < past
        start = b * BLOCK
        if (b == 0) | ((start < past + rows) & (start + BLOCK > past)):
            vis = _visibility(parents_ptr, rows, RP, SQUARINGS)
            if b == 0:
                depth = tl.sum(vis.to(tl.int32), axis=1) - 1
                tl.store(positions_ptr + r, past + depth, mask=inside)
                tl.store(write_ptr + r, past + r, mask=inside)
            pick = ((r[:, None] == rel[None, :]) & new[None, :]).to(tl.float32)  # [RP, BLOCK]: one-hot columns
            mask = old[None, :] | (tl.dot(vis.to(tl.float32), pick) > 0)
        else:
            mask = tl.broadcast_to(old[None, :], (RP, BLOCK))
        tl.store(mask_ptr + r[:, None] * length + cols[None, :], mask.to(tl.uint8),
                 mask=inside[:, None] & (cols < length)[None, :])


def decode_inputs(parents: torch.Tensor, past: torch.Tensor, length: int, count: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | PathInputs]:
    """:func:`~.step_inputs.decode_inputs` in one launch (same arguments, same values)."""
    rows = parents.shape[0] + 1
    device = parents.device
    if parents.dtype != torch.long or past.dtype != torch.long:
        raise ValueError("the step's inputs are long tensors")
    padded = max(MIN_ROWS, triton.next_power_of_2(rows))
    squarings = max(1, (rows - 2).bit_length())  # as many as tree_mask.ancestors: the whole closure
    parents = parents.contiguous() if parents.numel() else past  # never read when there is no draft
    positions = torch.empty(rows, dtype=torch.long, device=device)
    write = torch.empty(rows, dtype=torch.long, device=device)
    if count is not None:
        table = torch.empty(rows, rows, dtype=torch.long, device=device)
        depth = torch.empty(rows, dtype=torch.long, device=device)
        _step_inputs[(1,)](parents, past, positions, write, table, depth, positions, rows, 0,
                           RP=padded, SQUARINGS=squarings, PATHS=True, BLOCK=MASK_BLOCK)
        return positions, write, PathInputs(past=past, count=count, table=table, depth=depth, bound=length)
    mask = torch.empty(rows, length, dtype=torch.uint8, device=device)
    grid = (max(1, triton.cdiv(length, MASK_BLOCK)),)
    _step_inputs[grid](parents, past, positions, write, positions, positions, mask, rows, length,
                       RP=padded, SQUARINGS=squarings, PATHS=False, BLOCK=MASK_BLOCK)
    return positions, write, mask.view(torch.bool)
