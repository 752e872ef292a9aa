"""A static, slot-addressed KV cache: allocated once, addressed by position, never grown.

:class:`SlotPool` allocates every layer's keys and values for ``slots`` requests in one
tensor, ``[slots, layers, 2, kv_heads, capacity, head_dim]``, when the runner is made.
Tensors never move afterwards, which is what lets a captured CUDA graph read and write
them. A request's cache, :class:`SlotKV`, is one slot plus a length kept on the host:

* a forward writes its rows at positions ``length .. length + rows - 1`` (padding rows
  included) and attends under a mask that hides every position at or past the request's
  own, so stale positions left by a rollback or by padding are never read;
* rollback is setting the length (no copy, no device work);
* a tree's accepted path is kept by one gather over all layers at once (:meth:`SlotKV.compact`);
* a prefix is exported as per-layer views and imported by one copy per tensor.

A slot returns to the pool when its :class:`SlotKV` is released or garbage-collected.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence

import torch

from hvd_agents.errors import HVDError
from hvd_agents.runtime.kv import LayerKV
from hvd_agents.runtime.transfer import to_device


class SlotsExhaustedError(HVDError):
    """Every KV slot of a static runner is held by a live request cache."""


class SlotPool:
    """The one KV allocation of a static runner (see the module docstring).

    Args:
        slots: requests whose caches can be alive at once.
        layers, kv_heads, head_dim: the model's attention shape.
        capacity: positions per slot (the context window plus the largest row bucket).
        dtype, device: of the cache.
    """

    def __init__(self, slots: int, layers: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        if slots < 1:
            raise ValueError(f"a slot pool needs at least one slot, got {slots}")
        self.capacity = capacity
        self.data = torch.zeros(slots, layers, 2, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self._free = list(range(slots - 1, -1, -1))

    @property
    def slots(self) -> int:
        return self.data.shape[0]

    @property
    def free(self) -> int:
        """Slots not held by a live cache."""
        return len(self._free)

    def acquire(self) -> SlotKV:
        """An empty cache over a free slot.

        Raises:
            SlotsExhaustedError: every slot is held.
        """
        if not self._free:
            raise SlotsExhaustedError(
                f"all {self.slots} KV slots are held by live request caches; release one "
                "(finish or close its request) or make the runner with more slots"
            )
        slot = self._free.pop()
        return SlotKV(self, slot)

    def _release(self, slot: int) -> None:
        if slot not in self._free:
            self._free.append(slot)


class SlotKV:
    """One request's cache: a slot of a :class:`SlotPool` and the number of positions held.

    Implements :class:`~hvd_agents.runtime.runner.RunnerKV`.
    """

    supports_trees = True
    supports_reuse = True
    _ids = itertools.count()

    def __init__(self, pool: SlotPool, slot: int) -> None:
        self.pool = pool
        self.slot = slot
        self.data = pool.data[slot]  # [layers, 2, kv_heads, capacity, head_dim], a view
        self._length = 0
        self._finalizer = weakref.finalize(self, pool._release, slot)

    @property
    def length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    def advance(self, n: int) -> None:
        """Count ``n`` positions just written by a forward."""
        if self._length + n > self.capacity:
            raise ValueError(f"{self._length + n} positions exceed the slot's capacity of {self.capacity}")
        self._length += n

    def release(self) -> None:
        """Give the slot back now (the cache must not be used afterwards)."""
        self._finalizer()

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll a KV cache of {self._length} positions back to {length}")
        self._length = length

    def compact(self, start: int, offsets: Sequence[int]) -> None:
        """Keep ``[0, start)`` and ``start + offsets`` (increasing): one gather over every layer."""
        offsets = list(offsets)
        if any(b <= a for a, b in itertools.pairwise(offsets)) or (
                offsets and (offsets[0] < 0 or start + offsets[-1] >= self._length)):
            raise ValueError(f"cannot keep offsets {offsets[:8]} after {start} of a cache of {self._length} positions")
        if offsets != list(range(len(offsets))):
            index = to_device([start + o for o in offsets], self.data.device)  # [m]
            with torch.inference_mode():
                self.data[:, :, :, start : start + len(offsets)] = self.data.index_select(3, index)
        self._length = start + len(offsets)

    def export_prefix(self, n: int) -> tuple[LayerKV, ...]:
        """Per-layer ``([1, kv_heads, n, head_dim], ...)`` views of positions ``[0, n)`` (copy what you keep)."""
        if n > self._length:
            raise ValueError(f"the cache holds {self._length} positions, fewer than {n} token ids")
        return tuple((layer[0, None, :, :n], layer[1, None, :, :n]) for layer in self.data)

    def import_prefix(self, layers: Sequence[LayerKV], n: int) -> None:
        """Copy positions ``[0, n)`` of exported ``layers`` into this empty cache."""
        if self._length != 0:
            raise ValueError("importing a prefix needs an empty cache")
        if n > self.capacity:
            raise ValueError(f"{n} positions exceed the slot's capacity of {self.capacity}")
        with torch.inference_mode():
            for layer, (keys, values) in zip(self.data, layers):
                layer[0, :, :n].copy_(keys[0, :, :n], non_blocking=True)
                layer[1, :, :n].copy_(values[0, :, :n], non_blocking=True)
        self._length = n
