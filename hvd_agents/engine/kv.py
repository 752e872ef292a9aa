"""The target's KV cache: creation and rollback.

Rollback after verification is one call, :func:`truncate`, which drops the
rejected draft positions (``DynamicCache.crop`` with a negative count).
"""

from __future__ import annotations

from transformers import DynamicCache, PretrainedConfig


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
