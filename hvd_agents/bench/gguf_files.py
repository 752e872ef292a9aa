"""A transformers decoder written as a GGUF file the way llama.cpp's converter writes it, and quantized by llama.cpp.

:func:`write_gguf` writes a ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma3_text`` or ``phi3`` model
(random weights are enough: the benchmarks and the tests make their own) with llama.cpp's tensor names and
metadata: a llama file's query and key rows permuted for llama.cpp's rope, a gemma file's norms holding
``1 + w``, phi3's fused projections as they are. Matrices are stored in ``qtype`` (F32, F16, or a block
type the ``gguf`` package quantizes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); norms and biases in F32. A small
SentencePiece-style vocabulary (control tokens, byte tokens, then placeholders; a phi3 file's has phi3's
``<|endoftext|>``, which llama.cpp requires of a model named phi3) makes the file loadable by llama.cpp.
:func:`quantize_gguf` turns such a file into a K-quant mix (Q4_K_M by default) with llama.cpp's own
quantizer through llama-cpp-python (the ``peers`` extra).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
             "phi3": "phi3"}
_LAYER = {  # module path in a decoder layer -> GGUF tensor
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_GEMMA_LAYER = {"post_attention_layernorm": "post_attention_norm"}
_QUANTIZERS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# control tokens of a phi3 vocabulary: llama.cpp sets their attributes by name for a model named phi3 and
# refuses a vocabulary without them ("error loading model vocabulary: unordered_map::at")
PHI3_TOKENS = ("<|endoftext|>",)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for a llama query or key matrix (what its converter writes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_values(name: str, param: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """Values for a random model: norms near 1, biases small, matrices with unit-variance outputs."""
    shape = tuple(param.shape)
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(np.float32(shape[-1]))).astype(np.float32)


def _entries(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters by GGUF name, in the file's order."""
    config = model.config
    gemma = config.model_type == "gemma3_text"
    out = {"token_embd.weight": model.model.embed_tokens.weight, "output_norm.weight": model.model.norm.weight}
    if not config.tie_word_embeddings:
        out["output.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.model.layers):
        for name, param in layer.named_parameters():
            module, kind = name.rsplit(".", 1)
            gguf = (_GEMMA_LAYER.get(module) if gemma else None) or _LAYER[module]
            out[f"blk.{i}.{gguf}.{kind}"] = param
    return out


def _arrays(model: torch.nn.Module, rng: np.random.Generator | None):
    """``(name, float32 array)`` for each tensor in the file's order, made one at a time (see :func:`gguf_tensors`)."""
    config = model.config
    family = config.model_type
    gemma = family == "gemma3_text"
    for name, value in _entries(model).items():
        if rng is not None:
            array = _random_values(name, value, rng)
            if gemma and name.endswith("norm.weight"):
                array = array - np.float32(1.0)  # around 1 once the file's offset is added
        else:
            array = value.detach().to(torch.float32).numpy().copy()
        if gemma and name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        if GGUF_ARCH[family] == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            array = _permute(array, heads)
        yield name, array


def gguf_tensors(model: torch.nn.Module, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """The model's tensors by GGUF name, float32, in the file's conventions (module docstring).

    With ``rng``, random values of the model's shapes instead of its own (the model may then be a skeleton on
    the ``meta`` device: no memory for its weights).
    """
    return dict(_arrays(model, rng))


def _metadata(writer, config, vocab: int) -> None:
    family = config.model_type
    arch = GGUF_ARCH[family]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_name(f"random {family}")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    rope = getattr(config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope) if isinstance(rope.get("full_attention"), dict) else rope
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    partial = float(rope.get("partial_rotary_factor", 1.0) or 1.0)
    writer.add_rope_dimension_count(int(head_dim * partial))
    writer.add_key_length(int(head_dim))
    writer.add_value_length(int(head_dim))
    if getattr(config, "sliding_window", None) and arch in ("gemma3", "phi3", "qwen2", "qwen3"):
        writer.add_sliding_window(int(config.sliding_window))
    writer.add_tokenizer_model("llama")
    special = ["<unk>", "<s>", "</s>", *PHI3_TOKENS] if arch == "phi3" else ["<unk>", "<s>", "</s>"]
    tokens = [*special, *(f"<0x{b:02X}>" for b in range(256))]
    tokens += [f"t{i}" for i in range(vocab - len(tokens))]
    writer.add_token_list(tokens[:vocab])
    writer.add_token_scores([0.0] * vocab)
    types = [2, *([3] * (len(special) - 1)), *([6] * 256)]
    writer.add_token_types([*types, *([1] * (vocab - len(types)))][:vocab])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)


def write_gguf(model: torch.nn.Module, path: str | Path, qtype: str = "F32",
               rng: np.random.Generator | None = None) -> Path:
    """Write ``model`` as a GGUF file at ``path`` with its matrices in ``qtype`` (module docstring); with
    ``rng``, random weights of its shapes (see :func:`gguf_tensors`).

    Raises:
        ValueError: an unknown family or ``qtype``.
    """
    import gguf

    family = model.config.model_type
    if family not in GGUF_ARCH:
        raise ValueError(f"no GGUF writer for {family!r}: one of {', '.join(GGUF_ARCH)}")
    if qtype not in ("F32", "F16", *_QUANTIZERS):
        raise ValueError(f"qtype {qtype!r} is not F32, F16 or one of {', '.join(_QUANTIZERS)}")
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), GGUF_ARCH[family])
    vocab = int(model.config.vocab_size)
    _metadata(writer, model.config, vocab)
    kind = gguf.GGMLQuantizationType[qtype]
    block, block_bytes = gguf.GGML_QUANT_SIZES[kind]

    def stored(name: str, shape: tuple[int, ...]) -> str:
        """How a tensor is stored: F32, F16 or the block type."""
        if len(shape) != 2 or name.endswith("norm.weight") or qtype == "F32":
            return "F32"
        return "F16" if qtype == "F16" else (qtype if shape[1] % block == 0 else "F32")

    # tensor infos first, then each tensor's data as it is made: one tensor in memory at a time
    layouts = {}
    for name, param in _entries(model).items():
        shape = tuple(int(d) for d in param.shape)
        layouts[name] = stored(name, shape)
        if layouts[name] == "F32":
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        elif layouts[name] == "F16":
            writer.add_tensor_info(name, shape, np.dtype(np.float16), 2 * int(np.prod(shape)))
        else:
            byte_shape = (shape[0], shape[1] // block * block_bytes)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, array in _arrays(model, rng):
        if layouts[name] == "F32":
            writer.write_tensor_data(np.ascontiguousarray(array, dtype=np.float32))
        elif layouts[name] == "F16":
            writer.write_tensor_data(array.astype(np.float16))
        else:
            writer.write_tensor_data(gguf.quants.quantize(array, kind))
    writer.close()
    return path


def quantize_gguf(source: str | Path, target: str | Path, ftype: str = "Q4_K_M", threads: int = 2) -> Path:
    """``source`` (an F32 or F16 GGUF file) quantized by llama.cpp to ``ftype`` (``LLAMA_FTYPE_MOSTLY_<ftype>``).

    Raises:
        ImportError: llama-cpp-python is not installed (``pip install 'hvd-agents[peers]'``).
        RuntimeError: llama.cpp's quantizer failed.
    """
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    if code != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {ftype} (code {code})")
    return Path(target)
