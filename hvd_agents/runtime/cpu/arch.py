"""What the native forward computes for each decoder family it runs: one :class:`Architecture` per model.

Every family is a stack of pre-norm layers (RMS norm, attention with rope, RMS norm, gated MLP); each adds
options, read here from the model's transformers config:

* ``llama`` (Llama 2 and 3.x with their rope scaling; Mistral files, whose layers may attend to a sliding
  window of the last ``sliding_window`` positions) and ``mistral``;
* ``qwen2``: biases on the query, key and value projections (sliding-window layers where the config has them);
* ``qwen3``: an RMS norm over each query and key head before rope;
* ``gemma3_text``: sliding-window layers (``layer_types``) with their own rope base, norms that multiply by
  ``1 + w``, norms on the attention's and the MLP's outputs, query/key norms, gelu-tanh, the embedding scaled by
  ``sqrt(hidden)`` and scores by ``query_pre_attn_scalar ** -0.5``;
* ``phi3``: fused query/key/value and gate/up projections (split at load), rope on part of a head when its
  config says so.

:func:`architecture` describes a model or says why the native forward cannot run it
(:class:`UnsupportedArchitecture`). Rope frequencies are computed here in double precision from the config
(plain, linear and Llama 3 scaling), never with a machine-dependent vectorized ``pow``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3")
GGUF_FAMILIES = {"llama": ("llama", "mistral"), "qwen2": ("qwen2",), "qwen3": ("qwen3",),
                 "gemma3": ("gemma3_text",), "phi3": ("phi3",)}  # GGUF architecture -> model types
MAX_HEAD_DIM = 256
SILU, GELU_TANH = 0, 1  # native/row_ops.h
_ACTIVATIONS = {"silu": SILU, "swish": SILU, "gelu_pytorch_tanh": GELU_TANH, "gelu_tanh": GELU_TANH}


class UnsupportedArchitecture(ValueError):
    """The native forward does not compute this model's layers (the message says what it lacks)."""


@dataclass(frozen=True)
class Rope:
    """One rope table: frequencies ``[rotary dims / 2]`` in float64 and the cos/sin scaling."""

    inv_freq: torch.Tensor
    scaling: float = 1.0


@dataclass(frozen=True)
class Architecture:
    """The shape and options of a model's native forward.

    Attributes:
        family: the config's ``model_type``.
        activation: :data:`SILU` or :data:`GELU_TANH` (the MLP's gate).
        embed_scale: the embedding rows' factor (1.0: none).
        attn_scale: the attention scores' factor, float32-exact.
        norm_offset: added to every norm weight of a transformers model (gemma: 1.0; GGUF files hold ``1 + w``).
        qk_norm: whether query and key heads are RMS-normed before rope.
        post_norms: whether the attention's and the MLP's outputs are RMS-normed before their residuals.
        ropes: the rope tables; ``layer_ropes[i]`` and ``windows[i]`` (0: none) are layer i's.
    """

    family: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    activation: int
    embed_scale: float
    attn_scale: float
    norm_offset: float
    qk_norm: bool
    post_norms: bool
    ropes: tuple[Rope, ...]
    layer_ropes: tuple[int, ...]
    windows: tuple[int, ...]

    @property
    def layers(self) -> int:
        return len(self.windows)


def text_config(model: torch.nn.Module):
    """The model's text config (a multimodal config's text part)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _float32_exact(value: float) -> float:
    return float(np.float32(value))


def _rope_params(config, layer_type: str | None) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    return dict(params)


def _rope(config, params: dict, head_dim: int) -> Rope:
    """The rope of ``params`` (a config's rope parameters) for heads of ``head_dim``, computed in float64."""
    kind = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta") or getattr(config, "rope_theta", None)
    if not theta:
        raise UnsupportedArchitecture("no rope_theta in the config")
    partial = float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0)
    dim = int(head_dim * partial)
    if dim % 2 or dim <= 0:
        raise UnsupportedArchitecture(f"{dim} rotary dimensions")
    inv = np.array([1.0 / float(theta) ** (2 * i / dim) for i in range(dim // 2)], dtype=np.float64)
    if kind == "linear":
        inv = inv / float(params["factor"])
    elif kind == "llama3":
        factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    elif kind != "default":
        raise UnsupportedArchitecture(f"rope type {kind!r} (the native forward has plain, linear and llama3)")
    return Rope(torch.from_numpy(inv))


def _layer_types(config, family: str, n: int) -> list[str]:
    types = getattr(config, "layer_types", None)
    if family in ("qwen2", "qwen3", "gemma3_text") and types:
        return list(types)
    sliding = family in ("mistral", "phi3") and getattr(config, "sliding_window", None)
    return ["sliding_attention" if sliding else "full_attention"] * n


def architecture(model: torch.nn.Module) -> Architecture:
    """The native forward's description of ``model``.

    Raises:
        UnsupportedArchitecture: the model has something the native forward does not compute (named).
    """
    config = text_config(model)
    family = getattr(config, "model_type", "")
    if family not in FAMILIES:
        raise UnsupportedArchitecture(f"architecture {family!r} is not one of {', '.join(FAMILIES)}")
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise UnsupportedArchitecture("no decoder layers at model.model.layers")
    act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act_name not in _ACTIVATIONS:
        raise UnsupportedArchitecture(f"activation {act_name!r}")
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    if head_dim % 8 or head_dim > MAX_HEAD_DIM:
        raise UnsupportedArchitecture(f"head_dim {head_dim}")
    if getattr(config, "mlp_bias", False) or (family in ("llama", "mistral", "qwen3", "gemma3_text")
                                              and getattr(config, "attention_bias", False)):
        raise UnsupportedArchitecture("biases the native forward does not apply")
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, cap, None):
            raise UnsupportedArchitecture(f"{cap}")
    gemma = family == "gemma3_text"
    n = int(config.num_hidden_layers)
    types = _layer_types(config, family, n)
    window = int(getattr(config, "sliding_window", None) or 0)
    names = sorted(set(types))
    nested = isinstance(getattr(config, "rope_parameters", None), dict) and all(
        isinstance(config.rope_parameters.get(t), dict) for t in names)
    ropes = tuple(_rope(config, _rope_params(config, t if nested else None), head_dim) for t in names)
    attn_base = float(config.query_pre_attn_scalar) if gemma else float(head_dim)
    return Architecture(
        family=family, hidden=int(config.hidden_size), heads=int(config.num_attention_heads),
        kv_heads=int(config.num_key_value_heads), head_dim=head_dim, intermediate=int(config.intermediate_size),
        eps=float(config.rms_norm_eps), activation=_ACTIVATIONS[act_name],
        embed_scale=_float32_exact(math.sqrt(config.hidden_size)) if gemma else 1.0,
        attn_scale=float(np.float32(1.0) / np.sqrt(np.float32(attn_base))),
        norm_offset=1.0 if gemma else 0.0, qk_norm=family in ("qwen3", "gemma3_text"), post_norms=gemma,
        ropes=ropes, layer_ropes=tuple(names.index(t) for t in types),
        windows=tuple(window if t == "sliding_attention" else 0 for t in types))


def unsupported_reason(model: torch.nn.Module) -> str:
    """Why ``model`` cannot run on the native forward ("" when it can)."""
    try:
        architecture(model)
    except UnsupportedArchitecture as exc:
        return str(exc)
    return ""
