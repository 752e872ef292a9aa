"""The target's weights as the native forward reads them: GGUF blocks as the file holds them, or int8/int4.

A :class:`WeightSet` lists a llama-family model's matrices in the native formats
of :mod:`hvd_agents.runtime.cpu.native_forward` (each a :class:`Weight`: format, shape,
bytes):

* **From a GGUF file** (:func:`from_gguf`): each matrix keeps the file's own blocks, as records of about the
  file's bytes (:mod:`hvd_agents.runtime.cpu.gguf_blocks`): Q4_1 and Q8_0 as they are; Q4_0 as Q4_1 (its offset
  ``-8 d`` as the block's minimum); Q4_K, Q5_K and Q6_K as ``q4k``, ``q5k`` and ``q6k`` (the super-block's
  ``d``, ``dmin``, integer scales and packed weights), Q3_K as ``q6k``, Q2_K as ``q2k`` (``d``, ``dmin``, the
  file's 4-bit scale and minimum per 16 weights, 2-bit weights: the file's 10.5 bytes per 32); Q5_0 and Q5_1
  as ``q5_0`` and ``q5_1``:
  IQ4_NL as Q8_0 and IQ4_XS as ``q6s`` (the non-linear table's int8 values with the block's scale); the grid types
  IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M as ``q6s`` (the block's float32 scale per 16 or 32
  weights, the int8 ``grid * sign``, IQ1's ``8 (grid + delta)`` with the scale over 8): all exactly the file's
  values (:data:`NATIVE_GGUF_TYPES`). F16 and BF16 matrices keep their 16-bit values (the kernel reads them as
  float32, exactly). F32 tensors and the other block types (TQ1_0, TQ2_0, MXFP4, ...) are float32
  (dequantized exactly).
  llama.cpp stores a llama file's query and key rows permuted for its rope; they are put back in the model's
  order. Fused projections (phi3's ``attn_qkv`` and ``ffn_up``) are split by rows, block for block. Norms and
  biases are read from the file too (a gemma file's norms hold ``1 + w``, the multiplier itself).
* **From a loaded model** (:func:`from_model`): ``int8`` quantizes each weight to
  Q8_0 (one float16 scale per 32 weights, symmetric), ``int4`` to Q4_1 (float16 scale
  and minimum per 32 weights), ``float32`` keeps the weights as they are.

Architectures: those of :mod:`hvd_agents.runtime.cpu.arch` (llama, mistral, qwen2, qwen3, gemma3,
phi3); :func:`unsupported_reason` says why a model cannot run on the native forward.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.arch import GGUF_FAMILIES, Architecture, UnsupportedArchitecture, architecture
from hvd_agents.runtime.cpu.arch import unsupported_reason as _unsupported_reason
from hvd_agents.runtime.cpu.gguf_blocks import native_blocks
from hvd_agents.runtime.cpu.native_forward import BF16, F16, F32, Q4_1, Q8_0
from hvd_agents.runtime.gguf_file import GGUFFile

QK = 32
WEIGHT_SCHEMES = ("gguf", "int8", "int4", "float32")
_LAYER_NAMES = {  # GGUF tensor -> the model's module path in a decoder layer
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
MATRICES = tuple(_LAYER_NAMES)  # a layer's matrices, in the order the native model takes them
_NORM_NAMES = {  # LayerNorms field -> (GGUF tensor, module path; gemma's where it differs)
    "attn": ("attn_norm", "input_layernorm", None),
    "ffn": ("ffn_norm", "post_attention_layernorm", "pre_feedforward_layernorm"),
    "q": ("attn_q_norm", "self_attn.q_norm", None),
    "k": ("attn_k_norm", "self_attn.k_norm", None),
    "post_attn": ("post_attention_norm", None, "post_attention_layernorm"),
    "post_ffn": ("post_ffw_norm", None, "post_feedforward_layernorm"),
}


@dataclass
class Weight:
    """One matrix ``[rows, cols]`` in a native format: ``data`` is uint8 blocks (or 16-bit floats' bytes for
    ``F16`` and ``BF16``), or float32 for ``F32``."""

    fmt: int
    rows: int
    cols: int
    data: np.ndarray
    bias: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class LayerNorms:
    """A layer's RMS norm multipliers (float32; None: the layer has no such norm)."""

    attn: np.ndarray
    ffn: np.ndarray
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    post_attn: np.ndarray | None = None
    post_ffn: np.ndarray | None = None


@dataclass
class WeightSet:
    """A model's weights for the native forward, and where they came from."""

    scheme: str  # gguf, int8, int4 or float32
    embed: Weight
    output: Weight
    final_norm: np.ndarray
    layers: Sequence[dict[str, Weight]] = field(default_factory=list)  # a list, or LazyLayers
    norms: list[LayerNorms] = field(default_factory=list)
    formats: dict[str, int] = field(default_factory=dict)  # how many matrices per GGUF/native type

    @property
    def nbytes(self) -> int:
        mats = [self.embed, self.output, *(w for layer in self.layers for w in layer.values())]
        unique = {id(m.data): m.nbytes for m in mats}
        return sum(unique.values())

    def described(self) -> WeightInfo:
        """What these weights are, without their data."""
        return WeightInfo(self.scheme, dict(self.formats), self.nbytes)


@dataclass(frozen=True)
class WeightInfo:
    """A :class:`WeightSet`'s scheme, matrices per format and bytes, kept once its arrays are gone."""

    scheme: str
    formats: dict[str, int]
    nbytes: int


def unsupported_reason(model: torch.nn.Module) -> str:
    """Why ``model`` cannot run on the native forward ("" when it can)."""
    return _unsupported_reason(model)


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


def _model_norms(layer: torch.nn.Module, arch: Architecture) -> LayerNorms:
    gemma = arch.family == "gemma3_text"
    found = {}
    for name, (_, path, gemma_path) in _NORM_NAMES.items():
        path = gemma_path if gemma and gemma_path else path
        wanted = {"q": arch.qk_norm, "k": arch.qk_norm, "post_attn": arch.post_norms, "post_ffn": arch.post_norms}
        if path is None or not wanted.get(name, True):
            continue
        found[name] = (_f32(_module(layer, path).weight) + np.float32(arch.norm_offset)).astype(np.float32)
    return LayerNorms(**found)


def _model_matrices(layer: torch.nn.Module, arch: Architecture) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """A layer's matrices (and biases) in float32 by GGUF name, fused projections split."""
    def get(path: str) -> tuple[np.ndarray, np.ndarray | None]:
        linear = _module(layer, path)
        bias = _f32(linear.bias) if getattr(linear, "bias", None) is not None else None
        return _f32(linear.weight), bias

    if arch.family != "phi3":
        return {name: get(path) for name, path in _LAYER_NAMES.items()}
    qkv, _ = get("self_attn.qkv_proj")
    gate_up, _ = get("mlp.gate_up_proj")
    q, k, v = np.split(qkv, _qkv_splits(arch))
    gate, up = np.split(gate_up, 2)
    return {"attn_q": (q, None), "attn_k": (k, None), "attn_v": (v, None),
            "attn_output": get("self_attn.o_proj"), "ffn_gate": (gate, None), "ffn_up": (up, None),
            "ffn_down": get("mlp.down_proj")}


def _qkv_splits(arch: Architecture) -> list[int]:
    q = arch.heads * arch.head_dim
    return [q, q + arch.kv_heads * arch.head_dim]


def from_model(model: torch.nn.Module, scheme: str) -> WeightSet:
    """The weights of a loaded ``model`` under ``scheme`` (``int8``, ``int4`` or ``float32``).

    The embedding stays float32 (it is read one row per token); a separate output
    head is quantized like the layers.

    Raises:
        ValueError: an unknown scheme, or an architecture the native forward does not run.
    """
    if scheme not in ("int8", "int4", "float32"):
        raise ValueError(f"scheme {scheme!r} is not int8, int4 or float32")
    arch = architecture(model)
    embed_w = _f32(model.get_input_embeddings().weight)
    out_w = _f32(model.get_output_embeddings().weight)
    embed = Weight(F32, *embed_w.shape, embed_w)
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    output = _quantized(out_w, scheme) if not (tied and scheme == "float32") else embed
    final_norm = (_f32(model.model.norm.weight) + np.float32(arch.norm_offset)).astype(np.float32)
    ws = WeightSet(scheme=scheme, embed=embed, output=output, final_norm=final_norm)
    for layer in model.model.layers:
        mats = {name: _quantized(w, scheme, bias) for name, (w, bias) in _model_matrices(layer, arch).items()}
        ws.layers.append(mats)
        ws.norms.append(_model_norms(layer, arch))
    ws.formats = {scheme: 7 * len(ws.layers) + (0 if output is embed else 1)}
    return ws


# ---------------------------------------------------------------- reading GGUF blocks


def _unpermute_rows(n_rows: int, heads: int) -> np.ndarray:
    """Row order undoing llama.cpp's query/key permutation (as transformers' GGUF loader does)."""
    dim = n_rows // heads // 2
    return np.arange(n_rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(n_rows)


# GGUF block types read natively, and what they become
NATIVE_GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                     "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


CONVERT_BYTES = 1 << 25  # file bytes converted at a time: a large matrix's temporaries stay this size


def _gguf_weight(tensor, rows: int, cols: int, counts: dict[str, int]) -> Weight:
    """One GGUF tensor as a native :class:`Weight` (see the module docstring), converted a chunk of rows at a
    time into one array (rows convert independently; the converters' temporaries are several times a chunk)."""
    counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    raw = np.asarray(tensor.data).reshape(rows, -1)
    step = max(1, CONVERT_BYTES // max(1, raw.shape[1] * raw.itemsize))
    if rows <= step:
        return _converted(tensor.tensor_type, raw, rows, cols)
    first = _converted(tensor.tensor_type, raw[:step], step, cols)
    data = np.empty((rows, first.data.shape[1]), dtype=first.data.dtype)
    data[:step] = first.data
    for start in range(step, rows, step):
        stop = min(rows, start + step)
        data[start:stop] = _converted(tensor.tensor_type, raw[start:stop], stop - start, cols).data
    return Weight(first.fmt, rows, cols, data)


def _converted(kind, raw: np.ndarray, rows: int, cols: int) -> Weight:
    """``rows`` rows of GGUF data of type ``kind`` as a native :class:`Weight` (rows convert independently)."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    native = native_blocks(kind, raw.reshape(rows, -1))
    if native is not None:
        return Weight(native[0], rows, cols, native[1])
    if kind in (T.F16, T.BF16):  # the values' 2 bytes each, read as float32 by the kernel (exact)
        return Weight(F16 if kind == T.F16 else BF16, rows, cols, np.ascontiguousarray(raw).reshape(rows, -1).view(np.uint8).copy())
    values = raw.copy() if kind == T.F32 else dequantize(raw, kind)
    return Weight(F32, rows, cols, np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(rows, cols)))


def dense(w: Weight) -> np.ndarray:
    """A native weight's values as float32 ``[rows, cols]``: exactly what the native forward reads."""
    if w.fmt == F32:
        return np.ascontiguousarray(w.data, dtype=np.float32).reshape(w.rows, w.cols)
    native = native_forward.module()
    return native.dequantize(native.Matrix(w.fmt, w.rows, w.cols, torch.from_numpy(w.data.reshape(-1)))).numpy()


def dense_rows(tensor, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a GGUF matrix (rows of ``tensor.shape[0]`` values) as float32, exactly the values
    the native forward reads for them (:func:`dense` of the converted rows)."""
    cols = int(tensor.shape[0])
    rows = int(tensor.n_elements) // cols
    raw = np.asarray(tensor.data).reshape(rows, -1)[start:stop]
    return dense(_converted(tensor.tensor_type, raw, stop - start, cols))


def _permuted(w: Weight, heads: int) -> Weight:
    order = _unpermute_rows(w.rows, heads)
    return Weight(w.fmt, w.rows, w.cols, np.ascontiguousarray(w.data.reshape(w.rows, -1)[order]), w.bias)


def _split(w: Weight, sizes: list[int]) -> list[Weight]:
    """Row ranges of a fused matrix (whole rows of blocks: exact), its bias split alike."""
    rows = w.data.reshape(w.rows, -1)
    cuts = np.cumsum([0, *sizes])
    return [Weight(w.fmt, int(b - a), w.cols, np.ascontiguousarray(rows[a:b]),
                   None if w.bias is None else np.ascontiguousarray(w.bias[a:b])) for a, b in itertools.pairwise(cuts)]


def from_gguf(path: str | Path | GGUFFile, model: torch.nn.Module, lazy: bool = False) -> WeightSet:
    """The matrices, norms and biases of a GGUF file in its own blocks (see the module docstring).

    ``path`` is the file, or the file already read (its data stays memory-mapped; the blocks are copied out).
    ``model`` is the file's model as transformers reads it: its config says which family and shapes to expect.
    With ``lazy``, the layers' matrices are converted when a layer is read (:class:`LazyLayers`; a mismatch of
    their shapes is raised then): packing them one layer at a time keeps one layer's arrays in memory, not all.

    Raises:
        ValueError: the file's architecture is not one the native forward runs or is not ``model``'s, or its
            tensors do not match ``model``'s shapes.
    """
    arch = architecture(model)
    gguf = path if isinstance(path, GGUFFile) else GGUFFile(path)
    file_arch = gguf.architecture
    if arch.family not in GGUF_FAMILIES.get(file_arch, ()):
        raise UnsupportedArchitecture(f"GGUF architecture {file_arch!r}: its blocks are read for "
                                      f"{', '.join(GGUF_FAMILIES)} files whose model is that family, "
                                      f"not {arch.family!r}")
    tensors = gguf.tensors
    counts: dict[str, int] = {}

    def weight(name: str, rows: int, cols: int) -> Weight:
        if name + ".weight" not in tensors:
            raise ValueError(f"the GGUF file has no tensor {name}.weight")
        t = tensors[name + ".weight"]
        if tuple(int(x) for x in t.shape) != (cols, rows):
            raise ValueError(f"GGUF tensor {name}.weight has shape {tuple(t.shape)}, the model's weight {(rows, cols)}")
        w = _gguf_weight(t, rows, cols, counts)
        w.bias = vector(name + ".bias", rows) if name + ".bias" in tensors else None
        return w

    def vector(name: str, size: int) -> np.ndarray:
        t = tensors[name]
        values = np.array(t.data, dtype=np.float32).reshape(-1)  # a copy: the file is mapped read-only
        if values.size != size:
            raise ValueError(f"GGUF tensor {name} has {values.size} values, the model's {size}")
        return np.ascontiguousarray(values)

    embed = model.get_input_embeddings().weight
    vocab, hidden = embed.shape
    ws = WeightSet(scheme="gguf", embed=weight("token_embd", vocab, hidden), output=None,  # type: ignore[arg-type]
                   final_norm=vector("output_norm.weight", hidden))
    ws.output = weight("output", vocab, hidden) if "output.weight" in tensors else ws.embed
    permuted = file_arch == "llama"
    if lazy:
        ws.layers = LazyLayers(arch.layers, lambda i: _gguf_layer(arch, i, weight, permuted, tensors))
    for i in range(arch.layers):
        if not lazy:
            ws.layers.append(_gguf_layer(arch, i, weight, permuted, tensors))
        norms = {name: vector(f"blk.{i}.{gguf}.weight", arch.head_dim if name in ("q", "k") else hidden)
                 for name, (gguf, _, _) in _NORM_NAMES.items() if f"blk.{i}.{gguf}.weight" in tensors}
        ws.norms.append(LayerNorms(**norms))
        if (ws.norms[-1].q is not None) != arch.qk_norm or (ws.norms[-1].post_ffn is not None) != arch.post_norms:
            raise ValueError(f"layer {i}'s norms in the GGUF file are not a {arch.family} layer's")
    ws.formats = counts
    return ws


class LazyLayers(Sequence):
    """Layers' matrices made when read (``make(i)``; nothing is kept, so each read converts again)."""

    def __init__(self, n: int, make: Callable[[int], dict[str, Weight]]) -> None:
        self._n, self._make = n, make

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # an index (slices are not read)
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._make(i % self._n)


def _gguf_layer(arch: Architecture, i: int, weight, permuted: bool, tensors) -> dict[str, Weight]:
    """Layer ``i``'s matrices from the file (fused ones split, a llama file's query/key rows unpermuted)."""
    H, q, kv, inter = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.intermediate
    blk = f"blk.{i}."
    mats = {}
    if blk + "attn_qkv.weight" in tensors:
        mats["attn_q"], mats["attn_k"], mats["attn_v"] = _split(weight(blk + "attn_qkv", q + 2 * kv, H), [q, kv, kv])
    else:
        mats.update(attn_q=weight(blk + "attn_q", q, H), attn_k=weight(blk + "attn_k", kv, H),
                    attn_v=weight(blk + "attn_v", kv, H))
    mats["attn_output"] = weight(blk + "attn_output", H, q)
    if blk + "ffn_gate.weight" in tensors:
        mats.update(ffn_gate=weight(blk + "ffn_gate", inter, H), ffn_up=weight(blk + "ffn_up", inter, H))
    else:  # gate and up in one matrix, gate first
        mats["ffn_gate"], mats["ffn_up"] = _split(weight(blk + "ffn_up", 2 * inter, H), [inter, inter])
    mats["ffn_down"] = weight(blk + "ffn_down", H, inter)
    if permuted:
        mats["attn_q"] = _permuted(mats["attn_q"], arch.heads)
        mats["attn_k"] = _permuted(mats["attn_k"], arch.kv_heads)
    return {name: mats[name] for name in MATRICES}
