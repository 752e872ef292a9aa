"""The target's KV cache: creation, growth in place, and rollback.

A transformers ``DynamicLayer`` appends by concatenation: every forward copies the
layer's whole cache into a new tensor, so each decode step pays a pass over the KV
of the entire context (at 4,000 tokens of SmolLM2-135M context that is 180 MB
read and written per step, a third of the weights' own traffic). The caches made
here (:func:`new_cache`) hold their full-attention layers in :class:`GrowingLayer`
instead: keys and values live in buffers with room to grow, a forward writes only
its new positions, and the model reads a view of the filled part. Room is added
geometrically (an eighth of the length, at least :data:`MIN_ROOM` positions), so
growing costs a fraction of a copy per new token.

Sliding-window layers are held the same way, at full length (:class:`WindowLayer`):
the window is applied by the attention mask, which transformers builds over absolute
positions (a row at position ``p`` sees ``p - window < j <= p``), not by dropping
old positions. transformers' own sliding-window layer keeps only the last
``window - 1`` positions and so cannot roll back a rejected draft once the window
is full; held at full length, a window layer rolls back, keeps a tree's accepted
path and exports a prefix exactly as a full-attention layer does, at the memory of
a full-attention layer. Chunked and other layer kinds are kept as transformers
makes them.

Rollback after verification is one call, :func:`truncate`, which drops the
rejected draft positions (``DynamicCache.crop`` with a negative count; in a
growing layer only the length changes). After a tree draft, :func:`keep` keeps the
accepted path's positions, which need not be contiguous; only caches whose every
layer holds full-length keys and values (:func:`full_length`) can do that
(:func:`supports_trees`).

:class:`EngineCache` is the cache :func:`new_cache` makes: a ``DynamicCache`` that
also implements :class:`~hvd_agents.runtime.runner.RunnerKV`, the small protocol the
engine and the prefix cache use (rollback, tree compaction, prefix export/import),
so neither reaches into transformers' layers.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, get_layer_types_and_kwargs

MIN_ROOM = 64  # positions of room a growing buffer gets at least


def _room(length: int) -> int:
    """The capacity a buffer holding ``length`` positions is given."""
    return length + max(MIN_ROOM, length // 8)


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer that appends in place (see the module docstring).

    ``keys`` and ``values`` read as ``DynamicLayer``'s do, ``[batch, kv_heads, seq, head_dim]``
    (views of the filled part of their buffers). Assigning them works as for ``DynamicLayer``:
    a prefix view of the buffer (a crop) only shortens it; any other tensor is copied into a
    new buffer with room. The buffers are written in inference mode (they are inference
    tensors, as the engine's forwards make): the cache serves inference, not training.
    """

    def __init__(self, **kwargs) -> None:
        self._buffers: dict[str, torch.Tensor | None] = {"keys": None, "values": None}
        self._lengths = {"keys": 0, "values": 0}
        super().__init__(**kwargs)

    def _get(self, name: str) -> torch.Tensor | None:
        buffer = self._buffers[name]
        return None if buffer is None else buffer[..., : self._lengths[name], :]

    def _set(self, name: str, tensor: torch.Tensor | None) -> None:
        buffer = self._buffers[name]
        if tensor is None or tensor.dim() < 2:  # cleared, or transformers' empty placeholder
            self._buffers[name], self._lengths[name] = None, 0
        elif (buffer is not None and tensor.data_ptr() == buffer.data_ptr() and tensor.stride() == buffer.stride()
              and tensor.shape[:-2] == buffer.shape[:-2] and tensor.shape[-1] == buffer.shape[-1]):
            self._lengths[name] = tensor.shape[-2]  # a prefix of the buffer itself
        else:
            n = tensor.shape[-2]
            with torch.inference_mode():
                grown = tensor.new_empty((*tensor.shape[:-2], _room(n), tensor.shape[-1]))
                grown[..., :n, :] = tensor
            self._buffers[name], self._lengths[name] = grown, n

    keys = property(lambda self: self._get("keys"), lambda self, t: self._set("keys", t))
    values = property(lambda self: self._get("values"), lambda self, t: self._set("values", t))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions after the filled ones (growing the buffers when full); returns all of them."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        with torch.inference_mode():
            self._append(key_states, value_states)
        return self.keys, self.values

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for name, new in (("keys", key_states), ("values", value_states)):
            buffer, n = self._buffers[name], self._lengths[name]
            if buffer is None:
                self._set(name, new)
                continue
            end = n + new.shape[-2]
            if end > buffer.shape[-2]:
                grown = buffer.new_empty((*buffer.shape[:-2], _room(end), buffer.shape[-1]))
                grown[..., :n, :] = buffer[..., :n, :]
                self._buffers[name] = buffer = grown
            buffer[..., n:end, :] = new
            self._lengths[name] = end

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (a negative count, as ``DynamicLayer.crop`` takes)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to drop, not {tokens_to_remove}")
        for name in self._lengths:
            self._lengths[name] = max(self._lengths[name] + tokens_to_remove, 0)

    def select(self, start: int, index: torch.Tensor) -> None:
        """Keep positions ``[0, start)`` followed by those at ``index`` (increasing, all ``>= start``), in place."""
        for name in self._lengths:
            buffer = self._buffers[name]
            if buffer is None:
                continue
            with torch.inference_mode():
                buffer[..., start : start + len(index), :] = buffer.index_select(-2, index)
            self._lengths[name] = start + len(index)


class WindowLayer(GrowingLayer):
    """A sliding-window attention layer held at full length (see the module docstring).

    ``is_sliding`` makes transformers size its sliding-window mask on this layer; the mask it
    builds over all held positions, with offset 0, applies the window.

    Args:
        sliding_window: the layer's window: a row attends to itself and the ``sliding_window - 1``
            positions before it.
    """

    is_sliding = True

    def __init__(self, sliding_window: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sliding_window = int(sliding_window)


LayerKV = tuple[torch.Tensor, torch.Tensor]  # one layer's (keys, values), [batch, kv_heads, seq, head_dim] each


class EngineCache(DynamicCache):
    """A ``DynamicCache`` whose full-attention layers grow in place, with the
    :class:`~hvd_agents.runtime.runner.RunnerKV` calls (see the module docstring)."""

    @property
    def length(self) -> int:
        """Positions held."""
        return self.get_seq_length()

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` positions (:func:`truncate`)."""
        truncate(self, length)

    def compact(self, start: int, offsets: Sequence[int]) -> None:
        """Keep ``[0, start)`` and ``start + offsets`` (:func:`keep`): a tree draft's accepted path."""
        keep(self, start, offsets)

    @property
    def supports_trees(self) -> bool:
        """Whether :meth:`compact` can select positions (full-length layers only)."""
        return supports_trees(self)

    @property
    def supports_reuse(self) -> bool:
        """Whether a prefix of positions can be exported and imported (full-length layers only)."""
        return supports_trees(self)

    def export_prefix(self, n: int) -> tuple[LayerKV, ...]:
        """Views of every layer's keys and values at positions ``[0, n)`` (the caller copies what it keeps).

        Raises:
            ValueError: the cache holds fewer than ``n`` positions.
        """
        if self.length < n:
            raise ValueError(f"the cache holds {self.length} positions, fewer than {n} token ids")
        return tuple((layer.keys[..., :n, :], layer.values[..., :n, :]) for layer in self.layers)

    def import_prefix(self, layers: Sequence[LayerKV], n: int) -> None:
        """Copy positions ``[0, n)`` of ``layers`` (from :meth:`export_prefix`) into this EMPTY cache.

        Raises:
            ValueError: the cache is not empty.
        """
        if self.length != 0:
            raise ValueError("importing a prefix needs an empty cache")
        for layer, (keys, values) in zip(self.layers, layers):
            layer.update(keys[..., :n, :], values[..., :n, :])  # copies into this cache's buffers

    def release(self) -> None:
        """Nothing to give back: the layers are freed with the cache's last reference."""


def new_cache(config: PretrainedConfig) -> EngineCache:
    """An empty KV cache for a model with ``config``: its full-attention and sliding-window layers grow in place."""
    cache = EngineCache(config=config)
    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    cache.layers = [_in_place(layer, kind) for layer, kind in zip(cache.layers, layer_types, strict=True)]
    return cache


def _in_place(layer: object, kind: str) -> object:
    """The layer the engine's cache holds instead of transformers' ``layer`` (of type ``kind``)."""
    if type(layer) is DynamicLayer:
        return GrowingLayer()
    if type(layer) is DynamicSlidingWindowLayer and kind == "sliding_attention":
        return WindowLayer(layer.sliding_window)
    return layer


def window_of(cache: object) -> tuple[int | None, ...]:
    """Per layer of ``cache``, its attention window (None: full attention or another kind)."""
    return tuple(layer.sliding_window if isinstance(layer, WindowLayer) else None
                 for layer in getattr(cache, "layers", ()))


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` in current transformers, where
    ``past_key_values`` is deprecated (a FutureWarning on every call), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def full_length(layer: object) -> bool:
    """Whether ``layer`` holds every position's keys and values (full attention, or a window held at full length)."""
    return type(layer) in (DynamicLayer, GrowingLayer, WindowLayer)


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
    """Whether :func:`keep` can select positions of ``cache`` (full-length layers only)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(full_length(layer) for layer in layers)


def keep(cache: DynamicCache, start: int, offsets: Sequence[int]) -> None:
    """Keep positions ``[0, start)`` and ``start + offsets`` (increasing), dropping the rest.

    Raises:
        ValueError: an offset is out of range or the offsets do not increase.
    """
    current = cache.get_seq_length()
    increasing = all(a < b for a, b in itertools.pairwise(offsets))
    if not increasing or (offsets and (offsets[0] < 0 or start + offsets[-1] >= current)):
        raise ValueError(f"cannot keep offsets {list(offsets)[:8]} after {start} of a cache of {current} positions")
    if list(offsets) == list(range(len(offsets))):
        truncate(cache, start + len(offsets))
        return
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        index = torch.tensor([start + o for o in offsets], dtype=torch.long, device=layer.keys.device)
        if isinstance(layer, GrowingLayer):
            layer.select(start, index)
            continue
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, index)], dim=-2)
        layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, index)], dim=-2)
