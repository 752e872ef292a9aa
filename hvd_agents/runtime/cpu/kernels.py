"""CPU kernels for verification forwards: what makes checking a draft nearly free on a CPU.

Speculative decoding runs the target on the last token plus a few draft tokens.
On a CPU, PyTorch's defaults make those few-token forwards far dearer than a
one-token step, for two reasons, each fixed here at load time:

* **Linear layers.** One row runs a matrix-vector kernel; several rows run a
  matrix-matrix kernel that costs far more (measured by ``hvd-agents bench-kernels``,
  see ``docs/benchmarks.md``). Three kernels can hold the
  linear layers (:data:`LINEAR_KERNELS`):

  - ``row``: :class:`hvd_agents.runtime.cpu.row_linear.RowLinear`, a small native kernel
    that streams each weight row once for all input rows (x86-64 with AVX2; built
    at first use). Verifying a short draft costs little more than one token, and
    a row's result is bitwise independent of how many rows share the call.
  - ``packed``: :class:`PackedLinear`, each weight held in oneDNN's blocked
    layout, packed once (any CPU with oneDNN).
  - ``dense``: PyTorch's ``nn.Linear`` as loaded.

  ``auto`` takes ``row`` when it is available, else ``packed``, else ``dense``;
  the environment variable ``HVD_AGENTS_CPU_LINEAR`` overrides it.
* **Grouped-query attention.** For more than one query token with a mask,
  transformers' ``sdpa`` copies the whole KV cache to repeat its heads
  (``repeat_kv``) in every layer. :func:`gqa_sdpa_attention` asks PyTorch's SDPA
  for grouped-query attention instead (``enable_gqa``), which reads the cache as is.

``hvd-agents bench-kernels`` measures the three side by side. The same products
are computed by other kernels: logits agree with the dense layers to about 1e-4;
the attention change is exact. As with any change of kernel, the engine's greedy
output is the target's greedy output under these kernels, for every method alike.

:func:`prepare_for_cpu` applies both to a float32 CPU model (the loader does this
unless ``cpu_linear="dense"``). The output embedding keeps its dense ``weight``
(draft heads and the engine read its rows).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from hvd_agents.runtime.cpu import row_linear as native_linear
from hvd_agents.runtime.cpu.packed_linear import PackedLinear
from hvd_agents.runtime.cpu.row_linear import RowLinear

logger = logging.getLogger(__name__)
ATTENTION_NAME = "hvd_cpu_sdpa"
LINEAR_KERNELS = ("auto", "row", "packed", "dense")
LINEAR_ENV = "HVD_AGENTS_CPU_LINEAR"


def gqa_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, with multi-token grouped-query attention run without copying the KV.

    Takes and returns what transformers' attention functions do (output
    ``[batch, queries, heads, head_dim]``); anything but a plain multi-query GQA
    call on the CPU goes to the stock ``sdpa`` function unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    queries, keys = query.shape[2], key.shape[2]
    plain = not any(kwargs.get(name) is not None for name in ("position_bias", "cache", "softcap"))
    if (getattr(module, "num_key_value_groups", 1) > 1 and queries > 1 and query.device.type == "cpu" and plain
            and not kwargs.get("output_attentions", False) and (attention_mask is not None or keys == queries)):
        causal = attention_mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _use_gqa_attention(model: nn.Module) -> bool:
    """Switch a GQA model on ``sdpa`` to :func:`gqa_sdpa_attention`; False when it does not apply."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or not heads or not kv_heads:
        return False
    if kv_heads >= heads:
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        AttentionInterface.register(ATTENTION_NAME, gqa_sdpa_attention)
        AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        model.set_attn_implementation(ATTENTION_NAME)
    except Exception as exc:  # noqa: BLE001 (an older or newer transformers without these hooks: keep stock sdpa)
        logger.debug("grouped-query attention kernel not installed: %s", exc)
        return False
    return True


def can_pack(model: nn.Module) -> bool:
    """Whether :func:`prepare_for_cpu` applies: every weight is float32 on the CPU."""
    params = list(model.parameters())
    return bool(params) and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params)


def check_linear_kernel_name(name: str, source: str = "cpu_linear") -> None:
    """Raise ValueError naming ``source`` unless ``name`` is one of :data:`LINEAR_KERNELS`."""
    if name not in LINEAR_KERNELS:
        raise ValueError(f"{source}={name!r} is not one of {', '.join(LINEAR_KERNELS)}")


def _replace_linears(module: nn.Module, make) -> int:
    """Replace every plain ``nn.Linear`` of ``module`` by ``make(layer)``, in place; returns how many."""
    replaced = 0
    with torch.no_grad():
        for parent in list(module.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, make(child))
                    replaced += 1
    return replaced


def resolve_linear_kernel(linear: str = "auto") -> str:
    """The kernel ``linear`` names, with ``auto`` (and the environment override) resolved.

    Raises:
        ValueError: ``linear`` (or ``HVD_AGENTS_CPU_LINEAR``) is not one of :data:`LINEAR_KERNELS`,
            or ``row`` was asked for where the native kernel is unavailable.
    """
    check_linear_kernel_name(linear)
    chosen = linear
    if linear == "auto":
        chosen = os.environ.get(LINEAR_ENV, "").strip().lower() or "auto"
        check_linear_kernel_name(chosen, source=LINEAR_ENV)
    if chosen == "auto":
        if native_linear.available():
            return "row"
        return "packed" if torch.backends.mkldnn.is_available() else "dense"
    if chosen == "row" and not native_linear.available():
        raise ValueError(f"the row kernel is unavailable here: {native_linear.unavailable_reason()}")
    if chosen == "packed" and not torch.backends.mkldnn.is_available():
        raise ValueError("the packed kernel needs oneDNN, which this torch build lacks")
    return chosen


def prepare_for_cpu(model: nn.Module, linear: str = "auto") -> int:
    """Put ``model``'s ``nn.Linear`` layers on the ``linear`` kernel and switch GQA attention, in place.

    Returns the number of layers replaced (0 when :func:`can_pack` is false or
    the kernel is ``dense``; then the linear layers stay as they are). The
    model must be in its final place (CPU, float32) and used for inference only:
    the replaced layers take no gradient.

    Raises:
        ValueError: see :func:`resolve_linear_kernel`.
    """
    check_linear_kernel_name(linear)
    if not can_pack(model):
        return 0
    kernel = resolve_linear_kernel(linear)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    replaced = 0
    if kernel == "row":
        replaced = _replace_linears(model, RowLinear)
    elif kernel == "packed":
        replaced = _replace_linears(model, lambda layer: PackedLinear(layer, keep_dense=layer is output))
    gqa = _use_gqa_attention(model)
    logger.debug("%d linear layers on the %s kernel; grouped-query attention kernel: %s", replaced, kernel, gqa)
    return replaced


def match_linear_kernel(module: nn.Module, target: nn.Module) -> int:
    """Give a drafter ``module`` (e.g. a draft head) the row kernel when ``target`` runs on it; returns layers replaced.

    Drafters run one token at a time, where the row kernel matches or beats
    PyTorch's and oneDNN's packed layers were measured slower, so only ``row`` is
    carried over. Float32 CPU modules only; anything else is left as it is.
    """
    if linear_kernel(target) != "row" or not can_pack(module):
        return 0
    return _replace_linears(module, RowLinear)


def linear_kernel(model: nn.Module) -> str:
    """Which kernel holds ``model``'s linear layers: ``row``, ``packed`` or ``dense``."""
    for module in model.modules():
        if isinstance(module, RowLinear):
            return "row"
        if isinstance(module, PackedLinear):
            return "packed"
    return "dense"


def is_packed(model: nn.Module) -> bool:
    """Whether ``model``'s linear layers are on a CPU kernel of this module (``row`` or ``packed``)."""
    return linear_kernel(model) != "dense"
