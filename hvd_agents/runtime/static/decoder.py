"""A Llama-family decoder forward over a :class:`~.slot_kv.SlotPool`, in fixed shapes.

:class:`StaticDecoder` holds references to an HF model's weights (no copies, except
the optional float32 LM head) and runs one forward of ``R`` rows against ``L``
positions of a KV slot. Every shape depends only on ``(R, L)`` and every input is a
tensor, so the same call can be captured once per shape as a CUDA graph
(:mod:`.graphs`) and replayed with new inputs:

* the rows' positions, their KV write positions and the attention mask are built on
  the device from the draft's ``parents`` and the cached length ``past`` (a one-element
  tensor) with :mod:`hvd_agents.runtime.tree_mask` (:mod:`.step_inputs`; on CUDA one Triton
  kernel, :mod:`.input_kernel`); padding rows hang off the root, write after the real rows
  and are never visible to them;
* attention is either *dense* (a mask ``[R, L]`` over the first ``L`` slots; each KV head
  is read once for its whole group of query heads, whose queries are stacked as rows of
  one matrix product) or *path* attention (:mod:`.paths`: each row along its own path, in
  fixed tiles, so a row's result does not depend on the forward it shares; the bitwise
  mode);
* softmax runs in float32, as HF's eager attention does; with ``lm_head_fp32`` the
  logits come from a float32 copy of the LM head, so greedy decisions of a bfloat16
  model are not taken on bfloat16 logits.

Supported: models whose layers are the Llama block (RMSNorm, rotary attention with
optional q/k/v biases, SwiGLU MLP), without sliding windows: Llama, Mistral and Qwen2
families, SmolLM2. :func:`supports` says whether a model qualifies; others keep the HF
runner.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hvd_agents.runtime.static import step_inputs, step_ops
from hvd_agents.runtime.static.fused import load_fused_kernels
from hvd_agents.runtime.static.paths import PathInputs, arrivals, path_attention
from hvd_agents.runtime.static.step_inputs import load_input_kernel

SUPPORTED_TYPES = frozenset({"llama", "mistral", "qwen2"})
# RoPE variants whose frequencies HF recomputes from the sequence length on every call: the decoder's
# tables are built once, from the model's inv_freq at load
PER_CALL_ROPE = frozenset({"dynamic", "longrope"})


def supports(model: torch.nn.Module) -> str | None:
    """None when :class:`StaticDecoder` can run ``model``, else the reason it cannot."""
    config = model.config
    kind = getattr(config, "model_type", "")
    if kind not in SUPPORTED_TYPES:
        return f"model type {kind!r} is not one of {sorted(SUPPORTED_TYPES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", kind == "mistral"):
        return "sliding-window attention is not supported"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not supported"
    if getattr(config, "mlp_bias", False):
        return "MLP biases are not supported"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if rope_type in PER_CALL_ROPE:
        return f"RoPE type {rope_type!r} (frequencies recomputed per call) is not supported"
    return None


class _Layer:
    """One block's weights; with ``fuse``, q/k/v and gate/up stacked into one matrix each (one matrix product
    instead of three and two: fewer kernels, and larger products that read the weights at a higher bandwidth).
    Stacked in place: the model's own q/k/v and gate/up weights become views of the stacked matrices, so the
    weights are held once."""

    def __init__(self, layer: torch.nn.Module, fuse: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = self.qkvb = self.gate_up = None
        if fuse:
            with torch.no_grad():
                self.qkv = _stack_in_place(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
                self.gate_up = _stack_in_place(mlp.gate_proj.weight, mlp.up_proj.weight)
                pairs = ((attn.q_proj.bias, attn.q_proj.weight), (attn.k_proj.bias, attn.k_proj.weight),
                         (attn.v_proj.bias, attn.v_proj.weight))
                if any(b is not None for b, _ in pairs):
                    self.qkvb = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for b, w in pairs])
        # the tensors themselves, not the parameters: a later decoder that stacks the model's weights in place
        # re-points the parameters, never what this decoder reads (nor what its captured graphs read)
        self.ln1, self.ln2 = _tensor(layer.input_layernorm.weight), _tensor(layer.post_attention_layernorm.weight)
        self.q, self.qb = _tensor(attn.q_proj.weight), _tensor(attn.q_proj.bias)
        self.k, self.kb = _tensor(attn.k_proj.weight), _tensor(attn.k_proj.bias)
        self.v, self.vb = _tensor(attn.v_proj.weight), _tensor(attn.v_proj.bias)
        self.o, self.ob = _tensor(attn.o_proj.weight), _tensor(attn.o_proj.bias)
        self.gate, self.up, self.down = (_tensor(mlp.gate_proj.weight), _tensor(mlp.up_proj.weight),
                                         _tensor(mlp.down_proj.weight))


def _tensor(parameter: torch.nn.Parameter | None) -> torch.Tensor | None:
    """The parameter's tensor as it is now (None for None): what a decoder reads, whatever the parameter is
    re-pointed to later."""
    return None if parameter is None else parameter.detach()


def _stack_in_place(*weights: torch.nn.Parameter) -> torch.Tensor:
    """``weights`` (a module's parameters, same columns) stacked by rows into one tensor, each parameter's data
    replaced by its view of it: the same values, held once. Weights that already lie one after another in one
    storage (stacked by an earlier decoder over the same model) are viewed as the stack, not copied again."""
    first = weights[0].data
    rows = sum(w.shape[0] for w in weights)
    storage, offset = first.untyped_storage(), first.storage_offset()
    consecutive = all(w.data.is_contiguous() for w in weights)
    for w in weights:
        consecutive = consecutive and w.data.untyped_storage().data_ptr() == storage.data_ptr()
        consecutive = consecutive and w.data.storage_offset() == offset
        offset += w.numel()
    if consecutive:
        return first.new_empty(0).set_(storage, first.storage_offset(), (rows, first.shape[1]), first.stride())
    stacked = torch.cat([w.data for w in weights])
    start = 0
    for w in weights:
        w.data = stacked[start : start + w.shape[0]]
        start += w.shape[0]
    return stacked


class StaticDecoder:
    """The forward of a supported HF causal LM over slot-addressed KV (see the module docstring).

    Args:
        model: the HF model (its weights are used in place).
        capacity: positions per KV slot (rotary tables are built for these).
        lm_head_fp32: compute logits with a float32 copy of the LM head.
        stack_projections: q/k/v and gate/up as one matrix product each, the model's weights stacked in place
            (default: on CUDA, where fewer and larger products are faster; off on the CPU, whose native runner
            keeps its own layout).
    """

    def __init__(self, model: torch.nn.Module, capacity: int, *, lm_head_fp32: bool = False,
                 stack_projections: bool | None = None) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"the static decoder cannot run this model: {reason}")
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.group = self.heads // self.kv_heads
        self.eps = float(config.rms_norm_eps)
        if stack_projections is None:
            stack_projections = model.get_output_embeddings().weight.is_cuda
        self.layers = [_Layer(layer, fuse=stack_projections) for layer in model.model.layers]
        self.embed = model.get_input_embeddings().weight
        self.norm = model.model.norm.weight
        head = model.get_output_embeddings().weight
        self.dtype, self.device = head.dtype, head.device
        self.softmax_dtype = torch.promote_types(self.dtype, torch.float32)  # at least float32
        self.head = head.detach().float() if lm_head_fp32 and head.dtype != torch.float32 else head
        self.vocab_size = int(head.shape[0])
        self.hidden_size = int(config.hidden_size)
        self.scaling = float(getattr(model.model.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        rotary = model.model.rotary_emb
        positions = torch.arange(capacity, dtype=torch.float32, device=self.device)
        freqs = positions[:, None] * rotary.inv_freq.detach().float().to(self.device)[None, :]  # [C, hd / 2]
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (freqs.cos() * scale).to(self.dtype)  # HF casts its tables to the activations' dtype
        self.sin = (freqs.sin() * scale).to(self.dtype)
        fused = load_fused_kernels(self.device)  # Triton kernels for the small operations (CUDA), else None
        self.ops = fused if fused is not None else step_ops  # add_rms, rope_store, silu_mul
        # the step's positions, write slots and attention inputs: one Triton kernel (CUDA), else PyTorch's operations
        self.build_inputs = load_input_kernel(self.device) or step_inputs.decode_inputs
        # path attention's arrival counts (CUDA): its forwards run one after another, so the layers share them
        self.arrivals = arrivals(self.kv_heads, capacity, self.device)

    def _dense(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked attention of ``q`` ``[heads, R, hd]`` over the first ``L`` slots; ``[R, heads * hd]``."""
        (nh, rows, hd), (nkv, g) = q.shape, (self.kv_heads, self.group)
        length = mask.shape[1]
        keys, values = keys[:, :length], values[:, :length]  # [nkv, L, hd]: read once per group
        scores = torch.matmul(q.reshape(nkv, g * rows, hd), keys.transpose(1, 2)) * self.scaling
        scores = scores.view(nkv, g, rows, length).to(self.softmax_dtype).masked_fill(~mask, float("-inf"))
        probs = scores.softmax(dim=-1).to(q.dtype).view(nkv, g * rows, length)
        return torch.matmul(probs, values).view(nh, rows, hd).transpose(0, 1).reshape(rows, nh * hd)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attend: torch.Tensor | PathInputs
                ) -> torch.Tensor:
        if isinstance(attend, PathInputs):
            return path_attention(q, keys, values, attend, self.scaling, self.arrivals)
        return self._dense(q, keys, values, attend)

    def decode_inputs(self, parents: torch.Tensor, past: torch.Tensor, length: int, count: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | PathInputs]:
        """Positions ``[R]``, KV write positions ``[R]`` and what attention reads of a bucketed forward: the
        mask ``[R, L]`` (dense), or with ``count`` the rows' :class:`~.paths.PathInputs` (path attention).
        See :func:`~.step_inputs.decode_inputs` (PyTorch's operations), or one Triton kernel on CUDA.
        """
        return self.build_inputs(parents, past, length, count)

    @staticmethod
    def chain_inputs(past: int, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`decode_inputs` for a causal chain with a host ``past`` (prefill), over exactly ``past + rows``."""
        positions = torch.arange(past, past + rows, device=device)  # [R]
        cols = torch.arange(past + rows, device=device)
        mask = cols[None, :] <= positions[:, None]  # [R, past + R]
        return positions, positions, mask

    def forward(self, kv: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, write: torch.Tensor,
                attend: torch.Tensor | PathInputs, *, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of ``R`` rows; returns logits ``[R, vocab]`` (empty when ``logits`` is False) and the
        final-norm hidden states ``[R, hidden]``.

        Args:
            kv: a slot, ``[layers, 2, kv_heads, capacity, head_dim]``; rows' keys and values are written at ``write``.
            tokens, positions, write: ``[R]`` long.
            attend: a mask ``[R, L]`` (bool, which of the first ``L`` positions each row attends to) for dense
                attention, or :class:`~.paths.PathInputs` for path attention.
        """
        ops, eps, nh, nkv = self.ops, self.eps, self.heads, self.kv_heads
        x, h = ops.add_rms(F.embedding(tokens, self.embed), None, self.layers[0].ln1, eps)  # [R, hidden] each
        norms = [w.ln1 for w in self.layers[1:]] + [self.norm]  # what follows each layer's MLP
        for i, w in enumerate(self.layers):
            keys, values = kv[i, 0], kv[i, 1]  # [nkv, capacity, hd]
            if w.qkv is not None:
                q, k, v = F.linear(h, w.qkv, w.qkvb).split([w.q.shape[0], w.k.shape[0], w.v.shape[0]], dim=1)
            else:
                q, k, v = F.linear(h, w.q, w.qb), F.linear(h, w.k, w.kb), F.linear(h, w.v, w.vb)
            q = ops.rope_store(q, k, v, self.cos, self.sin, positions, write, keys, values, nh, nkv)  # [nh, R, hd]
            x, h = ops.add_rms(x, F.linear(self._attend(q, keys, values, attend), w.o, w.ob), w.ln2, eps)
            if w.gate_up is not None:
                gate, up = F.linear(h, w.gate_up).split(w.gate.shape[0], dim=1)
            else:
                gate, up = F.linear(h, w.gate), F.linear(h, w.up)
            x, h = ops.add_rms(x, F.linear(ops.silu_mul(gate, up), w.down), norms[i], eps)
        if not logits:
            return h.new_empty(0, self.vocab_size), h
        return F.linear(h.to(self.head.dtype), self.head), h
