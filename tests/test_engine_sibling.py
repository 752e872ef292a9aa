"""Engines made from a loaded target or from another engine: the same target, their own state."""

from __future__ import annotations

import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.loading import LoadedModel
from tests.helpers import make_byte_tokenizer
from tests.tiny import make_tiny_llama

VOCAB = 64
PROMPT = [3, 17, 12, 5, 9, 3, 17, 12]


def test_a_sibling_shares_the_target_and_keeps_its_own_state() -> None:
    base = Engine(make_tiny_llama(VOCAB), eos_token_ids=(7,), cost_model=CostModel.linear(0.1), draft_head=None)
    sibling = base.sibling(prefix_cache_bytes=0, draft_head=None)
    assert sibling.model is base.model and sibling.eos_token_ids == base.eos_token_ids
    assert sibling.context_window == base.context_window and sibling.cost_model() == base.cost_model()
    assert sibling.cache_store is not base.cache_store and sibling.prefix_cache is not base.prefix_cache
    assert sibling.runner is not base.runner and sibling.batcher is None
    params = GenerationParams(max_new_tokens=12, method="ar")
    assert sibling.generate(PROMPT, params).token_ids == base.generate(PROMPT, params).token_ids
    assert base.sibling(max_batch=2).batcher is not None  # the constructor's options pass through


def test_an_engine_from_a_loaded_target_takes_its_tokenizer_eos_and_window() -> None:
    tokenizer = make_byte_tokenizer()
    model = make_tiny_llama(len(tokenizer))
    loaded = LoadedModel(model=model, tokenizer=tokenizer, name="tiny", device=torch.device("cpu"), dtype=torch.float64)
    engine = Engine.from_loaded(loaded, prefix_cache_bytes=0, draft_head=None)
    assert engine.model is model and engine.tokenizer is tokenizer
    assert engine.eos_token_ids == loaded.eos_token_ids and engine.context_window == loaded.context_window
