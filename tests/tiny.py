"""Tiny random target models built in-process (no download) for fast tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make_tiny_llama(vocab_size: int = 64, seed: int = 0, dtype: torch.dtype = torch.float64,
                    max_positions: int = 512) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights.

    float64 by default: greedy-equality tests compare a one-token-per-step run
    with multi-token verification passes, whose float32 reductions differ in the
    last bits and could flip an argmax on a near tie; float64 makes that impossible
    in practice, so a failure means a real bug.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():  # seed the init without touching the global RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():  # sharpen the logits so greedy paths are varied, not uniform noise
        model.lm_head.weight.mul_(8.0)
    return model.eval()
