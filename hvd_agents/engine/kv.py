"""The target's KV cache: creation and rollback.

Rollback after verification is one call, :func:`truncate`, which drops the
rejected draft positions (``DynamicCache.crop`` with a negative count). After a
tree draft, :func:`keep` keeps the accepted path's positions, which need not be
contiguous; only caches whose every layer is a plain ``DynamicLayer`` (no
sliding window) can do that (:func:`supports_trees`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer


def new_cache(config: PretrainedConfig) -> DynamicCache:
    """An empty dynamic KV cache for a model with ``config``."""
    return DynamicCache(config=config)


def truncate(cache: DynamicCache, length: int) -> None:
    """Keep only the first ``length`` positions of ``cache``.

    Raises:
        ValueError: ``length`` is negative or longer than the cache.
    """
    current = cache.get_seq_length()
    if length < 0 or length > current:
        raise ValueError(f"cannot truncate a KV cache of {current} positions to {length}")
    if length < current:
        cache.crop(length - current)


def supports_trees(cache: DynamicCache) -> bool:
    """Whether :func:`keep` can select positions of ``cache`` (plain dynamic layers only)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def keep(cache: DynamicCache, start: int, offsets: Sequence[int]) -> None:
    """Keep positions ``[0, start)`` and ``start + offsets`` (increasing), dropping the rest.

    Raises:
        ValueError: an offset is out of range or the offsets do not increase.
    """
    current = cache.get_seq_length()
    increasing = all(a < b for a, b in zip(offsets, offsets[1:]))
    if not increasing or (offsets and (offsets[0] < 0 or start + offsets[-1] >= current)):
        raise ValueError(f"cannot keep offsets {list(offsets)[:8]} after {start} of a cache of {current} positions")
    if list(offsets) == list(range(len(offsets))):
        truncate(cache, start + len(offsets))
        return
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        index = torch.tensor([start + o for o in offsets], dtype=torch.long, device=layer.keys.device)
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, index)], dim=-2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, index)], dim=-2)
