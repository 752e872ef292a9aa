"""The fixed shapes a static runner's forwards run in: row buckets and KV-length buckets.

A captured CUDA graph replays one shape. A decode step over ``n`` rows (the last
token and its draft) runs in the smallest row bucket holding ``n``, padded; its
attention reads the smallest KV-length bucket holding every position it may see.
Padding inside a bucket costs nothing extra, which is why the cost profile of a
static runner is a step function of the draft length (:mod:`.cost`), and why the
policy may fill a bucket with tree alternatives for free.

The single-bucket test mode (:meth:`Buckets.single`) runs every forward, plain
steps and verification alike, in one row bucket and one KV length: the same kernels
on the same shapes, so a position's logits cannot depend on how many tokens shared
its forward, and speculative output from chain drafts must equal the engine's own
plain decoding bit for bit. (A tree branch's rows read their ancestors' keys at
slots that are not adjacent, so the attention sums group their terms differently:
trees are equal to rounding there, and bitwise again once the path is compacted.)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

DEFAULT_ROWS: tuple[int, ...] = (1, 2, 3, 5, 9, 17, 33, 65)
MIN_KV_BUCKET = 256
KV_ALIGN = 64  # the last KV bucket is a multiple of this, so attention's matrix products keep aligned shapes


@dataclass(frozen=True)
class Buckets:
    """Row buckets and KV-length buckets (both increasing).

    Example:
        >>> b = Buckets.for_capacity(2048)
        >>> b.kv
        (256, 512, 1024, 2048)
        >>> b.rows_for(4), b.kv_for(300)
        (5, 512)
    """

    rows: tuple[int, ...]
    kv: tuple[int, ...]

    def __post_init__(self) -> None:
        for name, values in (("rows", self.rows), ("kv", self.kv)):
            if not values or list(values) != sorted(set(values)) or values[0] < 1:
                raise ValueError(f"{name} buckets must be increasing positive sizes, got {values}")

    @classmethod
    def for_capacity(cls, capacity: int, rows: tuple[int, ...] = DEFAULT_ROWS) -> Buckets:
        """Powers of two from :data:`MIN_KV_BUCKET` up to ``capacity`` rounded up to :data:`KV_ALIGN`
        (always the last).

        >>> Buckets.for_capacity(8192 + 65).kv[-2:]
        (8192, 8320)
        """
        capacity = -(-capacity // KV_ALIGN) * KV_ALIGN
        kv, size = [], MIN_KV_BUCKET
        while size < capacity:
            kv.append(size)
            size *= 2
        kv.append(capacity)
        return cls(tuple(rows), tuple(kv))

    @classmethod
    def single(cls, rows: int, capacity: int) -> Buckets:
        """One row bucket and one KV length: the single-bucket test mode (see the module docstring)."""
        return cls((rows,), (capacity,))

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    @property
    def is_single(self) -> bool:
        return len(self.rows) == 1 and len(self.kv) == 1

    def rows_for(self, n: int) -> int:
        """The smallest row bucket holding ``n`` rows.

        Raises:
            ValueError: ``n`` exceeds the largest bucket.
        """
        i = bisect.bisect_left(self.rows, n)
        if i == len(self.rows):
            raise ValueError(f"a forward of {n} rows exceeds the largest row bucket ({self.max_rows})")
        return self.rows[i]

    def kv_for(self, length: int) -> int:
        """The smallest KV-length bucket holding ``length`` positions.

        Raises:
            ValueError: ``length`` exceeds the capacity.
        """
        i = bisect.bisect_left(self.kv, length)
        if i == len(self.kv):
            raise ValueError(f"{length} positions exceed the KV capacity ({self.kv[-1]})")
        return self.kv[i]
