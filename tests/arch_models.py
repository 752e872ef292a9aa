"""Tiny random models of every family the native forward runs, built in-process for its tests.

Each is a 2-layer decoder of the family's transformers class with the options that make it that family
(llama: Llama 3 rope scaling; mistral and gemma3: a sliding window shorter than the tests' prompts; qwen2:
biases; qwen3 and gemma3: query/key norms; gemma3: one sliding and one full layer with their own rope bases,
head_dim 256; phi3: fused projections, rope on half of each head). Weights are drawn at a scale that gives
varied logits (not the near-uniform ones of transformers' initialisation).
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 320  # room for the GGUF writer's byte tokens
WINDOW = 16
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3")
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
           "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _config(family: str):
    if family == "llama":
        return LlamaConfig(**_COMMON, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "mistral":
        return MistralConfig(**_COMMON, sliding_window=WINDOW, head_dim=16)
    if family == "qwen2":
        return Qwen2Config(**_COMMON)
    if family == "qwen3":
        return Qwen3Config(**{**_COMMON, "num_attention_heads": 2, "num_key_value_heads": 1}, head_dim=128)
    if family == "gemma3":
        return Gemma3TextConfig(
            **{**_COMMON, "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True},
            head_dim=256, query_pre_attn_scalar=64, sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
    if family == "phi3":
        return Phi3Config(**_COMMON, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5})
    raise ValueError(family)


_CLASSES = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM,
            "qwen3": Qwen3ForCausalLM, "gemma3": Gemma3ForCausalLM, "phi3": Phi3ForCausalLM}


def make_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random float32 model of ``family`` (one of :data:`FAMILIES`)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = _CLASSES[family](_config(family)).to(torch.float32).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(torch.randn_like(param) * 0.1 + (0.0 if family == "gemma3" else 1.0))
                elif name.endswith("bias"):
                    param.copy_(torch.randn_like(param) * 0.3)
                else:
                    param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
            model.get_output_embeddings().weight.mul_(4.0)
    return model
