"""The engine's KV cache: growing layers append in place and behave as transformers' ``DynamicLayer`` does.

Random sequences of appends, rollbacks, tree selections and assignments run on a
growing cache and on a plain ``DynamicCache`` side by side, and must leave the
same keys and values; appends inside the room a buffer has must not move it; and
a model decoding on either cache gives the same logits.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from hvd_agents.engine.prefix_cache import PrefixCache
from hvd_agents.runtime.kv import MIN_ROOM, GrowingLayer, cache_argument, keep, new_cache, supports_trees, truncate
from tests.tiny import make_tiny_llama

HEADS, DIM = 2, 3
TINY = make_tiny_llama(64, seed=5)


def positions(start: int, n: int) -> torch.Tensor:
    """Keys for positions ``start .. start + n - 1``, each filled with a distinct value."""
    values = torch.arange(start, start + n, dtype=torch.float64) + 0.5
    return values.view(1, 1, n, 1).expand(1, HEADS, n, DIM).contiguous()


operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 150)),
    st.tuples(st.just("truncate"), st.integers(0, 40)),
    st.tuples(st.just("keep"), st.lists(st.integers(0, 12), min_size=1, max_size=6, unique=True)),
    st.tuples(st.just("assign"), st.integers(0, 30)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, min_size=1, max_size=25))
def test_growing_layers_match_dynamic_layers_over_random_operations(ops) -> None:
    growing, plain = new_cache(TINY.config), DynamicCache(config=TINY.config)
    assert all(isinstance(layer, GrowingLayer) for layer in growing.layers)
    assert supports_trees(growing)
    written = 0
    for kind, arg in ops:
        length = plain.get_seq_length()
        if kind == "append":
            for cache in (growing, plain):
                for i, layer in enumerate(cache.layers):
                    layer.update(positions(written, arg) + i, -positions(written, arg) - i)
            written += arg
        elif kind == "truncate":
            for cache in (growing, plain):
                truncate(cache, max(length - arg, 0))
        elif kind == "keep" and length > 0:
            start = max(length - 13, 0)
            offsets = sorted(o for o in arg if start + o < length)
            for cache in (growing, plain):
                keep(cache, start, offsets)
        elif kind == "assign" and length > 0:  # what reusing or reordering code may do to a layer
            cut = max(length - arg, 1)
            for cache in (growing, plain):
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[..., :cut, :].clone(), layer.values[..., :cut, :].clone()
        assert growing.get_seq_length() == plain.get_seq_length()
        for mine, theirs in zip(growing.layers, plain.layers):
            if theirs.is_initialized and theirs.get_seq_length():
                assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_appends_inside_the_room_write_in_place() -> None:
    layer = GrowingLayer()
    layer.update(positions(0, 100), positions(0, 100))
    base = layer.keys.data_ptr()
    for step in range(MIN_ROOM // 2):
        keys, _ = layer.update(positions(100 + 2 * step, 2), positions(100 + 2 * step, 2))
        assert keys.data_ptr() == base  # the filled part was not copied
    layer.crop(-5)
    keys, _ = layer.update(positions(0, 1), positions(0, 1))
    assert keys.data_ptr() == base and keys.shape[-2] == 100 + MIN_ROOM - 4
    layer.update(positions(0, 200), positions(0, 200))  # past the room: grows, keeps what was there
    assert layer.keys.shape[-2] == 100 + MIN_ROOM - 4 + 200
    assert torch.equal(layer.keys[..., :100, :], positions(0, 100))


def test_decoding_on_a_growing_cache_gives_the_same_logits() -> None:
    ids = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(0))
    arg = cache_argument(TINY)
    outs = []
    for cache in (new_cache(TINY.config), DynamicCache(config=TINY.config)):
        logits = []
        with torch.inference_mode():
            logits.append(TINY(input_ids=ids[:, :30], **{arg: cache}, use_cache=True).logits)
            for start in range(30, 58, 4):  # verify 4 tokens, keep 3 of them
                logits.append(TINY(input_ids=ids[:, start : start + 4], **{arg: cache}, use_cache=True).logits)
                truncate(cache, start + 3)
        outs.append(torch.cat(logits, dim=1))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)


def test_prefix_cache_entries_keep_no_room() -> None:
    cache = new_cache(TINY.config)
    for layer in cache.layers:
        layer.update(positions(0, 40), positions(0, 40))
    pc = PrefixCache(1 << 24)
    assert pc.insert(list(range(40)), cache, prompt_len=40)
    per_position = 2 * HEADS * DIM * 8 * len(cache.layers)
    assert pc.stats().bytes == 40 * per_position  # the buffers' room was not kept
