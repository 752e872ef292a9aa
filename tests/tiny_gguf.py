"""A tiny random Llama written as a GGUF file by the test itself (the ``gguf`` writer), with or
without ``tokenizer.chat_template`` metadata.

Its tokenizer is the byte-level BPE of :mod:`tests.helpers` written as a GPT-2 style GGUF
vocabulary (256 byte tokens, ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, a few
merges), so transformers reads it back as a fast tokenizer; the weights are float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

from tests.helpers import MERGES, SPECIAL_TOKENS, bytes_to_unicode

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 32, 2, 4, 2, 64, 256


def _vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, their GGUF types and the merges of the byte-level tokenizer."""
    byte_map = bytes_to_unicode()

    def sym(data: bytes) -> str:
        return "".join(byte_map[b] for b in data)

    tokens = [byte_map[b] for b in range(256)] + list(SPECIAL_TOKENS)
    types = [TokenType.NORMAL] * 256 + [TokenType.CONTROL] * len(SPECIAL_TOKENS)
    merges = []
    for left, right in MERGES:
        tokens.append(sym(left + right))
        types.append(TokenType.NORMAL)
        merges.append(f"{sym(left)} {sym(right)}")
    return tokens, types, merges


def write_tiny_gguf(path: Path, chat_template: str | None = None, seed: int = 0) -> Path:
    """Write the tiny Llama to ``path`` (with ``chat_template`` as its ``tokenizer.chat_template`` when given)."""
    tokens, types, merges = _vocabulary()
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int, scale: float = 0.2) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    tensor("token_embd.weight", len(tokens), HIDDEN, scale=1.0)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        tensor(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", KV_HEADS * HIDDEN // HEADS, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", KV_HEADS * HIDDEN // HEADS, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    tensor("output.weight", len(tokens), HIDDEN, scale=2.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
