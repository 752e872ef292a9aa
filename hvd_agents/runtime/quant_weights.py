"""The target's weights as the native forward reads them: GGUF blocks as the file holds them, or int8/int4.

A :class:`WeightSet` lists a llama-family model's matrices in the native formats
of :mod:`hvd_agents.runtime.quant_native` (each a :class:`Weight`: format, shape,
bytes):

* **From a GGUF file** (:func:`from_gguf`): each matrix keeps the file's own blocks.
  Q4_1 and Q8_0 are read as they are; Q4_0 becomes Q4_1 (its offset ``-8 d`` as
  the block's minimum); Q4_K becomes ``q4f`` (Q4_1's layout with float32 scale and
  minimum per 32 weights: ``d * sc`` and ``dmin * m`` are exact in float32); Q5_0,
  Q5_1 and Q5_K become ``q5f`` (the same with 5-bit weights a byte each); Q6_K becomes
  ``q6s`` (int8 weights ``q - 32`` with a float32 scale ``d * sc`` per 16): all exactly
  the file's values (:data:`NATIVE_GGUF_TYPES`). Float tensors and the other block
  types (Q2_K, Q3_K, IQ*) are dequantized to float32, which is exact too. llama.cpp stores the query and key
  rows permuted for its rope; they are put back in the model's order.
* **From a loaded model** (:func:`from_model`): ``int8`` quantizes each weight to
  Q8_0 (one float16 scale per 32 weights, symmetric), ``int4`` to Q4_1 (float16 scale
  and minimum per 32 weights), ``float32`` keeps the weights as they are.

Architectures: llama-family decoders (``llama``, ``mistral`` without a sliding
window, ``qwen2`` with its query/key/value biases). :func:`unsupported_reason` says
why a model cannot run on the native forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hvd_agents.runtime.quant_native import F32, Q4_1, Q4F, Q5F, Q6S, Q8_0

QK = 32
WEIGHT_SCHEMES = ("gguf", "int8", "int4", "float32")
_ARCHITECTURES = ("llama", "mistral", "qwen2")
_LAYER_NAMES = {  # GGUF tensor -> the model's module path in a decoder layer
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
MATRICES = tuple(_LAYER_NAMES)  # a layer's matrices, in the order the native model takes them


@dataclass
class Weight:
    """One matrix ``[rows, cols]`` in a native format: ``data`` is uint8 blocks, or float32 for ``F32``."""

    fmt: int
    rows: int
    cols: int
    data: np.ndarray
    bias: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class WeightSet:
    """A llama-family model's weights for the native forward, and where they came from."""

    scheme: str  # gguf, int8, int4 or float32
    embed: Weight
    output: Weight
    final_norm: np.ndarray
    layers: list[dict[str, Weight]] = field(default_factory=list)
    norms: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (attention, MLP) per layer
    formats: dict[str, int] = field(default_factory=dict)  # how many matrices per GGUF/native type

    @property
    def nbytes(self) -> int:
        mats = [self.embed, self.output, *(w for layer in self.layers for w in layer.values())]
        unique = {id(m.data): m.nbytes for m in mats}
        return sum(unique.values())


def _text_config(model: torch.nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def unsupported_reason(model: torch.nn.Module) -> str:
    """Why ``model`` cannot run on the native forward ("" when it can)."""
    config = _text_config(model)
    kind = getattr(config, "model_type", "")
    if kind not in _ARCHITECTURES:
        return f"architecture {kind!r} is not one of {', '.join(_ARCHITECTURES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", kind == "mistral"):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim % 8 or head_dim > 128:
        return f"head_dim {head_dim}"
    if getattr(config, "mlp_bias", False) or (kind == "llama" and getattr(config, "attention_bias", False)):
        return "biases the native forward does not apply"
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        return "no decoder layers at model.model.layers"
    return ""


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module:
    for part in path.split("."):
        model = getattr(model, part)
    return model


def _f32(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).contiguous().numpy()


# ---------------------------------------------------------------- quantizing float weights


def quantize_q8_0(w: np.ndarray) -> np.ndarray:
    """Q8_0 blocks (float16 scale, 32 int8) of a float matrix ``[rows, cols]`` (cols a multiple of 32)."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // QK, QK).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = (amax / 127.0).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros_like(amax), where=d != 0)
    q = np.clip(np.rint(blocks * inv), -127, 127).astype(np.int8)
    out = np.empty((rows, cols // QK, 34), dtype=np.uint8)
    out[..., :2] = d.view(np.uint8)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


def quantize_q4_1(w: np.ndarray) -> np.ndarray:
    """Q4_1 blocks (float16 scale and minimum, 32 nibbles) of a float matrix ``[rows, cols]``."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // QK, QK).astype(np.float32)
    lo = blocks.min(axis=-1, keepdims=True).astype(np.float16)
    hi = blocks.max(axis=-1, keepdims=True)
    d = ((hi - lo.astype(np.float32)) / 15.0).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros_like(hi), where=d != 0)
    q = np.clip(np.rint((blocks - lo.astype(np.float32)) * inv), 0, 15).astype(np.uint8)
    out = np.empty((rows, cols // QK, 20), dtype=np.uint8)
    out[..., 0:2] = d.view(np.uint8)
    out[..., 2:4] = lo.view(np.uint8)
    out[..., 4:] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(rows, -1)


def _quantized(w: np.ndarray, scheme: str, bias: np.ndarray | None = None) -> Weight:
    rows, cols = w.shape
    if scheme == "float32" or cols % QK:
        return Weight(F32, rows, cols, np.ascontiguousarray(w, dtype=np.float32), bias)
    if scheme == "int8":
        return Weight(Q8_0, rows, cols, quantize_q8_0(w), bias)
    return Weight(Q4_1, rows, cols, quantize_q4_1(w), bias)


def from_model(model: torch.nn.Module, scheme: str) -> WeightSet:
    """The weights of a loaded llama-family ``model`` under ``scheme`` (``int8``, ``int4`` or ``float32``).

    The embedding stays float32 (it is read one row per token); a separate output
    head is quantized like the layers.
    """
    if scheme not in ("int8", "int4", "float32"):
        raise ValueError(f"scheme {scheme!r} is not int8, int4 or float32")
    embed_w = _f32(model.get_input_embeddings().weight)
    out_w = _f32(model.get_output_embeddings().weight)
    embed = Weight(F32, *embed_w.shape, embed_w)
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    output = _quantized(out_w, scheme) if not (tied and scheme == "float32") else embed
    ws = WeightSet(scheme=scheme, embed=embed, output=output, final_norm=_f32(model.model.norm.weight))
    for layer in model.model.layers:
        mats = {}
        for gguf_name, path in _LAYER_NAMES.items():
            linear = _module(layer, path)
            bias = _f32(linear.bias) if getattr(linear, "bias", None) is not None else None
            mats[gguf_name] = _quantized(_f32(linear.weight), scheme, bias)
        ws.layers.append(mats)
        ws.norms.append((_f32(layer.input_layernorm.weight), _f32(layer.post_attention_layernorm.weight)))
    ws.formats = {scheme: 7 * len(ws.layers) + (0 if output is embed else 1)}
    return ws


# ---------------------------------------------------------------- reading GGUF blocks


def _unpermute_rows(n_rows: int, heads: int) -> np.ndarray:
    """Row order undoing llama.cpp's query/key permutation (as transformers' GGUF loader does)."""
    dim = n_rows // heads // 2
    return np.arange(n_rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(n_rows)


def _q4_0_as_q4_1(raw: np.ndarray) -> np.ndarray:
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 18)
    d = blocks[..., :2].copy().view(np.float16)
    out = np.empty((rows, blocks.shape[1], 20), dtype=np.uint8)
    out[..., 0:2] = d.view(np.uint8)
    out[..., 2:4] = (d * np.float16(-8)).astype(np.float16).view(np.uint8)  # exact: a power of two
    out[..., 4:] = blocks[..., 2:]
    return out.reshape(rows, -1)


def _q4_k_as_q4f(raw: np.ndarray) -> np.ndarray:
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, 144)  # 256 weights a block
    n = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    scale = (d * sc.astype(np.float32)).astype(np.float32)  # [n, 8], exact (11 x 6 bits)
    minimum = -(dmin * mn.astype(np.float32)).astype(np.float32)
    qs = blocks[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, 8, 32)  # eight sub-blocks of 32 weights, in order
    out = np.empty((n, 8, 24), dtype=np.uint8)
    out[..., 0:4] = scale[..., None].view(np.uint8)
    out[..., 4:8] = minimum[..., None].view(np.uint8)
    out[..., 8:] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(rows, -1)


def _q5f_blocks(scale: np.ndarray, minimum: np.ndarray, q: np.ndarray, rows: int) -> np.ndarray:
    """q5f blocks (float32 scale and minimum, 32 weights a byte each) from ``[n, 32]`` weights and their fields."""
    out = np.empty((q.shape[0], 40), dtype=np.uint8)
    out[:, 0:4] = scale.astype(np.float32).reshape(-1, 1).view(np.uint8)
    out[:, 4:8] = minimum.astype(np.float32).reshape(-1, 1).view(np.uint8)
    out[:, 8:] = q
    return out.reshape(rows, -1)


def _q5_legacy_as_q5f(raw: np.ndarray, with_min: bool) -> np.ndarray:
    """Q5_0 (``d * (q - 16)``) and Q5_1 (``d * q + m``) blocks as q5f, exactly."""
    rows = raw.shape[0]
    size = 24 if with_min else 22
    blocks = raw.reshape(-1, size)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    head = 4 if with_min else 2
    minimum = blocks[:, 2:4].copy().view(np.float16).astype(np.float32) if with_min else d * np.float32(-16)
    qh = blocks[:, head : head + 4].copy().view(np.uint32)  # [n, 1]
    qs = blocks[:, head + 4 :]
    low = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)  # [n, 32]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
    return _q5f_blocks(d, minimum, low | (high << np.uint8(4)), rows)


def _q5_k_as_q5f(raw: np.ndarray) -> np.ndarray:
    """Q5_K blocks (256 weights: ``d * sc * q - dmin * m`` per 32) as q5f, exactly."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, 176)
    n = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    scale = d * sc.astype(np.float32)  # [n, 8], exact
    minimum = -(dmin * mn.astype(np.float32))
    qh, qs = blocks[:, 16:48], blocks[:, 48:]
    low = qs.reshape(n, -1, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & np.uint8(0x0F)).reshape(n, -1, 32)
    high = qh.reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    high = (high & np.uint8(0x01)).reshape(n, -1, 32)
    q = (low | (high << np.uint8(4))).reshape(n * 8, 32)
    return _q5f_blocks(scale.reshape(-1), minimum.reshape(-1), q, rows)


def _q6_k_as_q6s(raw: np.ndarray) -> np.ndarray:
    """Q6_K blocks (256 weights: ``d * sc * (q - 32)`` per 16) as q6s (float32 scale per 16, int8), exactly."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 210)
    n = blocks.shape[0]
    ql, qh, sc = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208].copy().view(np.int8)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    scale = (d * sc.astype(np.float32)).reshape(n * 8, 2)  # [n * 8, 2]: each half of a block of 32, exact
    low = ql.reshape(n, -1, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & np.uint8(0x0F)).reshape(n, -1, 32)
    high = qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (high & np.uint8(0x03)).reshape(n, -1, 32)
    q = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n * 8, 32)
    out = np.empty((n * 8, 40), dtype=np.uint8)
    out[:, 0:8] = scale.astype(np.float32).view(np.uint8)
    out[:, 8:] = q.view(np.uint8)
    return out.reshape(rows, -1)


# GGUF block types read natively, and what they become
NATIVE_GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def _gguf_weight(tensor, rows: int, cols: int, counts: dict[str, int]) -> Weight:
    """One GGUF tensor as a native :class:`Weight` (see the module docstring)."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    kind = tensor.tensor_type
    counts[kind.name] = counts.get(kind.name, 0) + 1
    raw = np.asarray(tensor.data)
    if kind == T.Q4_1:
        return Weight(Q4_1, rows, cols, raw.reshape(rows, -1).copy())
    if kind == T.Q8_0:
        return Weight(Q8_0, rows, cols, raw.reshape(rows, -1).copy())
    if kind == T.Q4_0:
        return Weight(Q4_1, rows, cols, _q4_0_as_q4_1(raw.reshape(rows, -1)))
    if kind == T.Q4_K:
        return Weight(Q4F, rows, cols, _q4_k_as_q4f(raw.reshape(rows, -1)))
    if kind in (T.Q5_0, T.Q5_1):
        return Weight(Q5F, rows, cols, _q5_legacy_as_q5f(raw.reshape(rows, -1), with_min=kind == T.Q5_1))
    if kind == T.Q5_K:
        return Weight(Q5F, rows, cols, _q5_k_as_q5f(raw.reshape(rows, -1)))
    if kind == T.Q6_K:
        return Weight(Q6S, rows, cols, _q6_k_as_q6s(raw.reshape(rows, -1)))
    values = raw.copy() if kind == T.F32 else dequantize(raw, kind)
    return Weight(F32, rows, cols, np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(rows, cols)))


def _permuted(w: Weight, heads: int) -> Weight:
    order = _unpermute_rows(w.rows, heads)
    return Weight(w.fmt, w.rows, w.cols, np.ascontiguousarray(w.data.reshape(w.rows, -1)[order]), w.bias)


def from_gguf(path: str | Path, model: torch.nn.Module) -> WeightSet:
    """The matrices of a llama GGUF file in its own blocks (see the module docstring); norms from ``model``.

    Raises:
        ValueError: the file is not a llama GGUF, or its tensors do not match ``model``'s shapes.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[-1]).decode() if arch_field is not None else ""
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r}: its blocks are read for llama files only")
    tensors = {t.name: t for t in reader.tensors}
    config = _text_config(model)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    counts: dict[str, int] = {}

    def weight(name: str, like: torch.Tensor) -> Weight:
        if name not in tensors:
            raise ValueError(f"the GGUF file has no tensor {name}")
        rows, cols = like.shape
        t = tensors[name]
        if tuple(int(x) for x in t.shape) != (cols, rows):
            raise ValueError(f"GGUF tensor {name} has shape {tuple(t.shape)}, the model's weight {(rows, cols)}")
        return _gguf_weight(t, rows, cols, counts)

    embed = weight("token_embd.weight", model.get_input_embeddings().weight)
    output = weight("output.weight", model.get_output_embeddings().weight) if "output.weight" in tensors else embed
    ws = WeightSet(scheme="gguf", embed=embed, output=output, final_norm=_f32(model.model.norm.weight))
    for i, layer in enumerate(model.model.layers):
        mats = {}
        for gguf_name, module_path in _LAYER_NAMES.items():
            w = weight(f"blk.{i}.{gguf_name}.weight", _module(layer, module_path).weight)
            if gguf_name == "attn_q":
                w = _permuted(w, heads)
            elif gguf_name == "attn_k":
                w = _permuted(w, kv_heads)
            mats[gguf_name] = w
        ws.layers.append(mats)
        ws.norms.append((_f32(layer.input_layernorm.weight), _f32(layer.post_attention_layernorm.weight)))
    ws.formats = counts
    return ws
