"""Tree drafts as device tensors: ancestors, depths and the attention mask, without a host sync.

A draft of ``d`` tokens is a tree when it carries ``parents`` (for token ``i``, the index
of its parent among the draft tokens, or -1 for a child of the root, the last emitted
token). A chain is the tree ``(-1, 0, 1, ..., d - 2)``. A forward over such a draft has
``d + 1`` rows: row 0 is the root, row ``i + 1`` draft token ``i``.

Everything here is made of fixed-shape tensor operations on the device the parents live
on (no ``.item()``, no data-dependent shapes), so it can run inside a captured CUDA graph
and costs no synchronisation; the CPU runners use the same functions.

Example: ``parents = (-1, 0, 0)`` (two alternatives after the first token)::

    >>> import torch
    >>> anc = ancestors(torch.tensor([-1, 0, 0]))
    >>> anc.int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    >>> depths(anc).tolist()
    [1, 2, 2]
"""

from __future__ import annotations

import torch


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``[d, d]`` bool: ``anc[i, j]`` when draft token ``j`` is ``i`` or one of its ancestors.

    Args:
        parents: ``[d]`` long, each entry -1 or the index of an earlier token.

    Computed by squaring the parent relation (``ceil(log2 d)`` boolean matrix products),
    a fixed number of device operations for a given ``d``.
    """
    d = parents.shape[0]
    eye = torch.eye(d, dtype=torch.bool, device=parents.device)  # [d, d]
    if d == 0:
        return eye
    cols = torch.arange(d, device=parents.device)
    parent_of = parents[:, None] == cols[None, :]  # [d, d]: j is i's parent (-1 matches nothing)
    reach = (eye | parent_of).to(torch.float32)  # reachable in at most 1 step
    for _ in range(max(1, (d - 1).bit_length())):
        reach = ((reach @ reach) > 0).to(torch.float32)  # reachable in at most 2**k steps
    return reach > 0


def depths(anc: torch.Tensor) -> torch.Tensor:
    """``[d]`` long: each draft token's depth below the root (a child of the root is at depth 1)."""
    return anc.sum(dim=1)


def tree_positions(past: torch.Tensor | int, anc: torch.Tensor) -> torch.Tensor:
    """``[d + 1]`` position ids of a tree forward's rows: the root at ``past``, token ``i`` at ``past + depth``."""
    depth = torch.cat([torch.zeros(1, dtype=torch.long, device=anc.device), depths(anc)])  # [d + 1]
    return depth + past


def tree_visibility(anc: torch.Tensor) -> torch.Tensor:
    """``[d + 1, d + 1]`` bool: which new rows each new row attends to (the root and its own ancestors)."""
    d = anc.shape[0]
    visible = torch.zeros(d + 1, d + 1, dtype=torch.bool, device=anc.device)
    visible[:, 0] = True
    visible[1:, 1:] = anc
    return visible
