"""The draft head: one decoder layer that drafts from the target's own hidden states (EAGLE style).

At sequence index ``t`` the head reads the pair ``(f_t, x_{t+1})``: a feature
``f_t`` (the target's last-layer hidden state ``h_t`` when known, else the
head's own prediction of it) and the embedding of the next token. It predicts
``h_{t+1}``, and the target's own LM head rows give the next token's logits::

    x   = fc([norm(f_t); norm(embed(x_{t+1}))])            # [d]
    x   = x + attn(norm(x))          # causal, RoPE, its own KV cache
    x   = x + mlp(norm(x))           # SwiGLU
    h^  = out_norm(x)                # predicted h_{t+1}
    logits = h^ @ W_lm[draft_vocab].T                       # [V']

Autoregression is at the feature level: the next draft step feeds ``h^`` back in
with the drafted token, which keeps semantic information even when a drafted
token is wrong. The LM projection covers a reduced draft vocabulary (the most
frequent target tokens, mapped back to target ids), so it costs ``V'/V`` of the
target's; the embedding and the LM rows are the target's own (frozen, not
stored with the head's weights).

The head keeps a KV cache per sequence (:class:`HeadCache`); ``step`` runs any
number of new indices through it at given positions, which is how the drafter
ingests the verified context and drafts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from hvd_agents.runtime.cpu import native_forward, quant_linear
from hvd_agents.runtime.cpu.quant_linear import QuantLinear, quant_product
from hvd_agents.runtime.cpu.row_linear import RowLinear, row_linear

ATTENTION_WINDOW: int | None = 512
"""The most entries (itself included) a drafted or ingested index attends to while drafting (None: all).
Training attends to the whole sequence, and its sequences are short (prompt and answer: median 200 tokens, 90%
under 444); on an agent's conversation of thousands of tokens the head attending to all of them read a cache
many times longer than any it was trained on, and agreed with the target less. On the examples' agent
conversations (`bench-agents`, docs/benchmarks.md) the window took `model+reuse` from 302 to 334 accepted draft
tokens and its proposing from 3.1 to 2.4-2.5 ms a step."""


@dataclass(frozen=True)
class DraftHeadConfig:
    """Shape of a draft head and the target it was trained for.

    Attributes:
        hidden_size: the target's hidden size ``d``.
        num_heads: attention heads of the head's layer (``d`` divisible by it).
        intermediate_size: the SwiGLU width.
        draft_vocab_size: ``V'``, the size of the reduced draft vocabulary.
        target_vocab_size: the target's vocabulary size ``V``.
        rope_theta: RoPE base.
        rms_norm_eps: RMSNorm epsilon.
        target: a description of the target model the head was trained on
            (its config signature, see :func:`target_signature`).
        taps: target layers whose inputs the head fuses into the target's features (EAGLE-3's fusion of
            several layers): the target's feature rows are then ``(1 + len(taps)) x d`` wide, its normed
            last-layer state and then each tapped layer's input, and the head reads
            ``h_t + fuse([norm(tap_1); ...])`` where it reads ``h_t``; its own predicted features are ``d``
            wide, as before. Empty: the last-layer state alone.
    """

    hidden_size: int
    num_heads: int
    intermediate_size: int
    draft_vocab_size: int
    target_vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    target: str = ""
    taps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", tuple(int(layer) for layer in self.taps))  # a list when read from JSON
        if len(set(self.taps)) != len(self.taps) or any(layer < 0 for layer in self.taps):
            raise ValueError(f"taps must be distinct layer indices, got {self.taps}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in [1, {self.target_vocab_size}], got {self.draft_vocab_size}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def target_signature(model: nn.Module) -> str:
    """A description of a target model's architecture, e.g. ``"llama/d576/l30/v49152"``.

    Heads are matched to targets by it: a head trained for one model of a family
    works (more slowly, never incorrectly) on a fine-tune of the same shape.
    """
    config = model.config
    return (
        f"{getattr(config, 'model_type', '?')}/d{config.hidden_size}/l{config.num_hidden_layers}"
        f"/v{model.get_output_embeddings().weight.shape[0]}"
    )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


class HeadCache:
    """The head's keys and values for one sequence: ``[heads, length, head_dim]``, grown by doubling.

    ``positions[i]`` is the sequence index of entry ``i`` (increasing, possibly
    with gaps where no hidden states were known).
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: list[int] = []

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``[heads, n, head_dim]`` keys/values; returns all keys and values so far."""
        n = keys.shape[1]
        all_keys, all_values, old = self.slots(keys.shape[0], keys.shape[2], positions, keys)
        all_keys[:, old : old + n] = keys
        all_values[:, old : old + n] = values
        return all_keys[:, : old + n], all_values[:, : old + n]

    def slots(self, heads: int, head_dim: int, positions: list[int], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Room for entries at sequence indices ``positions``: the whole key and value buffers and the first new
        entry's slot, for a caller that writes them there itself (the native head step)."""
        old, n = len(self.positions), len(positions)
        if self.keys is None or old + n > self.keys.shape[1]:
            shape = (heads, max(256, 2 * (old + n)), head_dim)
            grown_k, grown_v = like.new_empty(shape), like.new_empty(shape)
            if self.keys is not None:
                grown_k[:, :old] = self.keys[:, :old]
                grown_v[:, :old] = self.values[:, :old]
            self.keys, self.values = grown_k, grown_v
        self.positions.extend(positions)
        return self.keys, self.values, old

    def crop(self, length: int) -> None:
        """Keep the first ``length`` entries."""
        del self.positions[length:]


class DraftHead(nn.Module):
    """The draft head (see the module docstring).

    Call :meth:`attach` with the target before use: it takes the target's token
    embedding and the LM rows of the draft vocabulary (not part of the head's
    state dict). ``draft_vocab`` (a buffer, saved) maps draft index -> target id.
    """

    def __init__(self, config: DraftHeadConfig) -> None:
        super().__init__()
        self.config = config
        d, inter, eps = config.hidden_size, config.intermediate_size, config.rms_norm_eps
        self.num_heads = config.num_heads
        self.head_dim = d // config.num_heads
        self.norm_feature = RMSNorm(d, eps)
        self.norm_embed = RMSNorm(d, eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        if config.taps:
            self.norm_taps = RMSNorm(d, eps)
            self.norm_taps.weight = nn.Parameter(torch.ones(len(config.taps), d))  # one norm per tapped layer
            self.fuse = nn.Linear(len(config.taps) * d, d, bias=False)
        self.attn_norm = RMSNorm(d, eps)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d, eps)
        self.gate_up = nn.Linear(d, 2 * inter, bias=False)
        self.down = nn.Linear(inter, d, bias=False)
        self.out_norm = RMSNorm(d, eps)
        self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size), persistent=True)
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.recipe: dict = {}  # how it was trained (set when loaded from a file)
        self.embed: torch.Tensor | None = None  # [V, d], the target's (frozen)
        self.lm_rows: torch.Tensor | None = None  # [V', d], the target's LM rows of the draft vocabulary (frozen)
        self.lm_matrix = None  # lm_rows as Q8_0 blocks of the native kernel (quantize_for_cpu), else None
        self.lm_threads = quant_linear.DRAFT_THREADS  # the native team threads the projection takes
        self.attention_window: int | None = ATTENTION_WINDOW  # the latest entries an index attends to (None: all)
        self._native: tuple[list, list[torch.Tensor]] | None = None  # the native step's matrices and norms

    def attach(self, target: nn.Module) -> DraftHead:
        """Take the target's embedding and draft-vocabulary LM rows; move to its device and dtype."""
        embedding = target.get_input_embeddings().weight
        lm_weight = target.get_output_embeddings().weight
        if embedding.shape[1] != self.config.hidden_size or lm_weight.shape[0] != self.config.target_vocab_size:
            raise ValueError(
                f"the draft head was built for hidden size {self.config.hidden_size} and vocabulary "
                f"{self.config.target_vocab_size}, the target has {embedding.shape[1]} and {lm_weight.shape[0]}"
            )
        self.to(device=embedding.device, dtype=embedding.dtype)
        self.draft_vocab = self.draft_vocab.to(embedding.device)
        self.embed = embedding.detach()
        self.lm_rows = lm_weight.detach()[self.draft_vocab].clone()
        self.lm_matrix = None
        self._native = None
        return self

    def quantize_for_cpu(self, threads: int = quant_linear.DRAFT_THREADS, fused: bool = True) -> int:
        """Draft on the native int8 kernel: every linear layer becomes a
        :class:`~hvd_agents.runtime.cpu.quant_linear.QuantLinear` and the LM projection reads ``lm_rows`` as Q8_0
        blocks, on ``threads`` of the native forward's thread team (0: the caller's team size,
        :data:`~hvd_agents.runtime.cpu.quant_linear.DRAFT_THREADS` by default). Returns the layers moved (0:
        the kernel is unavailable here, or the head is not float32 on the CPU; nothing changes).

        For an attached head used for drafting only (inference; training keeps the float layers): a quarter
        of the bytes a drafted token reads. Drafts change (by the kernel's quantization error), outputs never
        (the target verifies every drafted token); a draft does not depend on ``threads``. Call it again
        after ``attach``; calling it again otherwise only sets ``threads``.

        ``fused``: every :meth:`step` runs in native calls (``head_step`` of the native module: the new indices'
        keys and values, then the last one's attention, MLP and projection) instead of a PyTorch operation per
        norm, rotation and residual around the products: the same arithmetic to float rounding (about 1e-6), a
        drafted token in 0.46-0.51 ms instead of 0.89-1.05 inside the engine (2-core AMD EPYC). Each index's key
        and value are computed alone, so they are the same bits however the indices were grouped into steps.
        False keeps the layer-by-layer path.
        """
        if self.lm_rows is None:
            raise RuntimeError("attach(target) the draft head before quantizing it")
        layers = [name for name, module in self.named_children()
                  if isinstance(module, nn.Linear) and quant_linear.supported(module)]
        if not layers and not isinstance(self.fc, QuantLinear):
            return 0
        for name in layers:
            setattr(self, name, QuantLinear(getattr(self, name), threads))
        for module in self.children():
            if isinstance(module, QuantLinear):
                module.threads = threads
        if self.lm_matrix is None:
            self.lm_matrix = quant_linear.quantized_matrix(self.lm_rows)
        self.lm_threads = threads
        linears = (self.fc, self.qkv, self.o_proj, self.gate_up, self.down)
        self._native = None
        if fused and all(isinstance(layer, QuantLinear) for layer in linears):
            norms = (self.norm_feature, self.norm_embed, self.attn_norm, self.mlp_norm, self.out_norm)
            self._native = ([layer.matrix for layer in linears] + [self.lm_matrix],
                            [norm.weight.detach() for norm in norms])
        return len(layers)

    # ---- the layer, in pieces (training composes them with its own attention masks) ----

    @property
    def feature_width(self) -> int:
        """The width of the target's feature rows the head reads: ``d`` per fused layer, the last one included."""
        return self.config.hidden_size * (1 + len(self.config.taps))

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """``f_t``: the target's feature rows ``[..., n, feature_width]`` fused to ``[..., n, d]`` (``h_t`` plus
        ``fuse`` of the normed tapped layers' inputs); ``d``-wide features (the head's own) are returned as they are."""
        d = self.config.hidden_size
        if features.shape[-1] == d:
            return features
        if features.shape[-1] != self.feature_width:
            raise ValueError(f"the head reads features {d} or {self.feature_width} wide, not {features.shape[-1]}")
        taps = features[..., d:].unflatten(-1, (len(self.config.taps), d))
        return features[..., :d] + self.fuse(self.norm_taps(taps).flatten(-2))

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``fc([norm(f); norm(embed(x))])``: ``[..., n, d]`` (or the target's ``feature_width``) features and
        ``[..., n]`` next tokens -> ``[..., n, d]``."""
        embedded = F.embedding(tokens, self.embed)
        return self.fc(torch.cat([self.norm_feature(self.fused(features)), self.norm_embed(embedded)], dim=-1))

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values ``[..., heads, n, head_dim]`` of ``x`` ``[..., n, d]``, RoPE applied at ``positions`` ``[n]``."""
        q, k, v = self.qkv(self.attn_norm(x)).split(self.config.hidden_size, dim=-1)
        shape = (*x.shape[:-1], self.num_heads, self.head_dim)
        q, k, v = (t.reshape(shape).transpose(-2, -3) for t in (q, k, v))  # [..., H, n, hd]
        angles = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]  # [n, hd/2]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual attention output ``[..., H, n, hd]``, the MLP and the output norm: predicted features ``[..., n, d]``."""
        merged = attended.transpose(-2, -3).reshape(x.shape)
        x = x + self.o_proj(merged)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return self.out_norm(x)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., V']`` of predicted features ``[..., d]``.

        When the head's layers run on the row kernel (a head loaded for a target on it), so does
        this projection outside training: it reads the ``V' x d`` rows once, faster than PyTorch's
        matrix-vector product (drafting cost per step: ``hvd-agents bench-model``, ``docs/benchmarks.md``).
        """
        if self.lm_matrix is not None:
            return quant_product(predicted, self.lm_matrix, self.lm_rows, threads=self.lm_threads)
        if isinstance(self.fc, RowLinear) and not torch.is_grad_enabled():
            return row_linear(predicted, self.lm_rows)
        return predicted @ self.lm_rows.T

    # ---- inference ----

    @torch.inference_mode()
    def step(
        self, features: torch.Tensor, tokens: torch.Tensor, positions: list[int], cache: HeadCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run new indices ``[n]`` through the head, appending them to ``cache``.

        Every index's key and value enter the cache; only the last index is run through attention, the MLP and
        the LM projection: it is the only one whose output drafting reads (the earlier ones are verified, their
        features the target's own), and an entry's key and value depend on its own inputs alone (one layer), so
        ingesting a long prompt costs its ``fc`` and ``qkv`` rows, not attention over all of it.

        Args:
            features: ``[n, d]`` features ``f_t``.
            tokens: ``[n]`` next tokens ``x_{t+1}`` (target ids).
            positions: the ``n`` sequence indices, increasing, after the cache's.
            cache: the sequence's cache (entries attend to all earlier ones).

        Returns:
            the last index's predicted feature ``[1, d]`` and its draft-vocabulary logits ``[V']``.
        """
        if self.embed is None:
            raise RuntimeError("attach(target) the draft head before using it")
        if self._native is not None:
            return self._native_step(features, tokens, positions, cache)
        x = self.inputs(features, tokens)  # [n, d]
        pos = torch.tensor(positions, device=x.device)
        q, k, v = self.project(x, pos)  # [H, n, hd]
        keys, values = cache.append(k, v, positions)  # [H, old + n, hd]
        if self.attention_window is not None:  # the last index sees the latest entries, itself included
            keys, values = keys[:, -self.attention_window :], values[:, -self.attention_window :]
        # no mask: the last index sees every entry kept. Batched as [1, H, 1, hd]: PyTorch's fused CPU attention
        # takes only 4-D inputs
        attended = F.scaled_dot_product_attention(q[None, :, -1:], keys[None], values[None])[0]  # [H, 1, hd]
        predicted = self.finish(x[-1:], attended)  # [1, d]
        return predicted, self.logits(predicted[-1])

    def _native_step(self, features: torch.Tensor, tokens: torch.Tensor, positions: list[int],
                     cache: HeadCache) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` in native calls (``quantize_for_cpu``): every index's key and value, then the last index's
        attention, MLP and projection, :data:`~hvd_agents.runtime.cpu.quant_linear.MAX_ROWS` indices a call."""
        matrices, norms = self._native
        native = native_forward.module()
        keys, values, index = cache.slots(self.num_heads, self.head_dim, positions, self.inv_freq)
        last = index + len(positions) - 1
        first = 0 if self.attention_window is None else max(0, last + 1 - self.attention_window)
        features = self.fused(features.float())
        out: list[torch.Tensor] = []
        for start in range(0, len(positions), quant_linear.MAX_ROWS):
            stop = min(len(positions), start + quant_linear.MAX_ROWS)
            out = native.head_step(matrices, norms, features[start:stop].contiguous(),
                                   self.embed[tokens[start:stop]].contiguous(), self.inv_freq, positions[start:stop],
                                   keys, values, index + start, first if stop == len(positions) else index + start,
                                   stop == len(positions),
                                   self.config.rms_norm_eps, threads=self.lm_threads)
        return out[0], out[1]

    @property
    def acceptance_prior(self) -> float | None:
        """The held-out agreement with the target's greedy token at the first draft position, from
        the training recipe (None when unknown): a policy's prior for this head's acceptance."""
        accuracy = self.recipe.get("report", {}).get("accuracy") or []
        return float(accuracy[0]) if accuracy else None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (the Llama ``rotate_half`` layout); ``cos``/``sin`` are ``[n, hd/2]``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def with_taps(head: DraftHead, taps: tuple[int, ...]) -> DraftHead:
    """A head that fuses the target layers ``taps`` (see :class:`DraftHeadConfig`) with ``head``'s weights, its
    fusion starting at zero: it drafts exactly as ``head`` until trained. Returns ``head`` when it already fuses them.

    Raises:
        ValueError: ``head`` already fuses other layers.
    """
    taps = tuple(taps)
    if head.config.taps == taps:
        return head
    if head.config.taps:
        raise ValueError(f"the head fuses layers {head.config.taps}, not {taps}")
    fused = DraftHead(replace(head.config, taps=taps))
    missing, unexpected = fused.load_state_dict(head.state_dict(), strict=False)
    if unexpected or set(missing) != {"norm_taps.weight", "fuse.weight"}:
        raise ValueError(f"the head's weights do not fit: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        fused.fuse.weight.zero_()
    fused.recipe = head.recipe
    fused.to(head.fc.weight.device, head.fc.weight.dtype)
    return fused


def init_weights(head: DraftHead, seed: int = 0) -> DraftHead:
    """Small random init (normal, std 0.02 scaled for the residual outputs), reproducible by ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in head.named_parameters():
        if param.ndim == 2 and not name.startswith("norm_taps"):  # the taps' norms start at one
            std = 0.02 / math.sqrt(2.0) if name.startswith(("o_proj", "down")) else 0.02
            with torch.no_grad():
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return head
