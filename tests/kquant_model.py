"""Random GGUF K-quant and 5-bit blocks, and a tiny Llama whose matrices are such blocks, for the native formats'
tests: the same blocks converted to the compact records the loader uses and to the wide float32-field formats
must give the same bits everywhere.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hvd_agents.runtime.cpu import gguf_blocks
from hvd_agents.runtime.cpu import weights as quant_weights

BLOCKS = {"Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q3_K": (256, 110), "Q5_0": (32, 22),
          "Q5_1": (32, 24)}  # weights and bytes a block
SIZES = {**BLOCKS, "Q2_K": (256, 84)}  # and Q2_K (one native format, no wide one to compare with)
# a layer's matrices: every type of a Q4_K_M, Q5_K_M or Q3_K_M file's layers
LAYER_KINDS = {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q3_K", "ffn_gate": "Q4_K",
               "ffn_up": "Q5_0", "ffn_down": "Q6_K"}


def kind(name: str):
    """The ``gguf.GGMLQuantizationType`` named ``name``."""
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


def random_blocks(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random GGUF blocks of type ``name`` (:data:`SIZES`) ``[rows, bytes]``: random bits, small finite float16
    fields."""
    weights, size = SIZES[name]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // weights, size), dtype=np.uint8)
    n = blocks.shape[0]

    def half(lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, size=(n, 1)).astype(np.float16).view(np.uint8)

    if name in ("Q4_K", "Q5_K"):
        blocks[:, 0:2], blocks[:, 2:4] = half(0.002, 0.02), half(0.0, 0.006)  # d, dmin
    elif name == "Q2_K":
        blocks[:, 80:82], blocks[:, 82:84] = half(0.002, 0.02), half(0.0, 0.006)  # d, dmin
    elif name == "Q6_K":
        blocks[:, 208:210] = half(0.001, 0.004)
    elif name == "Q3_K":
        blocks[:, 108:110] = half(-0.01, 0.01)
    else:
        blocks[:, 0:2] = half(0.005, 0.03)
        if name == "Q5_1":
            blocks[:, 2:4] = half(-0.2, 0.0)
    return blocks.reshape(rows, -1)


def gguf_weight(name: str, rows: int, cols: int, seed: int, wide: bool = False) -> quant_weights.Weight:
    """Random blocks of type ``name`` converted as the loader does (``wide``: to the float32-field formats)."""
    converted = gguf_blocks.native_blocks(kind(name), random_blocks(name, rows, cols, seed), wide=wide)
    assert converted is not None
    return quant_weights.Weight(converted[0], rows, cols, converted[1])


def make_kquant_llama(vocab_size: int = 96, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer float32 Llama whose rows are whole super-blocks (hidden 256, intermediate 512)."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).to(torch.float32).eval()


def kquant_weights(model: LlamaForCausalLM, wide: bool, seed: int = 0) -> quant_weights.WeightSet:
    """``model``'s weight set with random blocks for every matrix (:data:`LAYER_KINDS`; the output head Q6_K, the
    embedding Q5_1), converted to the compact records or (``wide``) the float32-field formats."""
    ws = quant_weights.from_model(model, "int8")
    vocab, hidden = ws.embed.rows, ws.embed.cols
    ws.embed = gguf_weight("Q5_1", vocab, hidden, seed, wide)
    ws.output = gguf_weight("Q6_K", vocab, hidden, seed + 1, wide)
    for i, layer in enumerate(ws.layers):
        for j, (name, w) in enumerate(layer.items()):
            layer[name] = gguf_weight(LAYER_KINDS[name], w.rows, w.cols, seed + 10 * i + j + 2, wide)
    return ws
