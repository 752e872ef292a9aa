"""The static runner: the target on a GPU as fixed-shape, graph-captured steps over a slot KV cache.

:class:`StaticRunner` implements :class:`~hvd_agents.runtime.runner.Runner` with

* :class:`~.slot_kv.SlotPool`: every request's KV in one allocation made at load;
* :class:`~.decoder.StaticDecoder`: the model's forward in fixed shapes, masks built on
  the device from the draft's parents, attention reading each KV head once per group;
* :class:`~.graphs.StepGraphs`: decode forwards (the last token and its draft, chain or
  tree, up to the largest row bucket) padded to a row bucket and a KV-length bucket
  (:class:`~.buckets.Buckets`) and replayed as CUDA graphs; prefills run eagerly, in
  chunks, into the same slot;
* :func:`~.cost.measure_bucket_cost`: the verification cost profile measured through
  these steps (CUDA events on a GPU), a step function of the draft length.

A decode forward costs one host-to-device copy of its packed inputs and one graph
launch; it never waits for the device. With the engine's device-side verification the
only synchronisation of a step is the copy of its small verification result.

By default the runner is *bitwise*: every decode forward, a plain step or a draft's
verification, runs padded to one row count (:data:`BITWISE_ROWS`, so each matrix product
runs one shape whatever the draft) with path attention (:mod:`.paths`, each row along its
own path in fixed tiles), so a position's logits are bit for bit those of the same
position decoded alone, chains and trees alike: speculative output is plain decoding's,
token for token. ``bitwise=False`` runs each forward in the smallest of several row
buckets and KV-length buckets with dense attention: fewer padded rows, but kernels that
change with the shape, so near-ties may break the other way between a step and a
verification.

On the CPU the same forwards run eagerly (no graphs): that is how the tests check it,
and how the single-bucket mode (``buckets=Buckets.single(rows, capacity)``, dense
attention) proves chain speculation equal to plain decoding bit for bit. The engine picks this runner for
supported models on CUDA (:func:`hvd_agents.runtime.runner_choice.runner_for`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.profile import cached_cost_model, machine_key_parts
from hvd_agents.runtime.runner import BatchCall, add_hidden, forward_each
from hvd_agents.runtime.static.buckets import DEFAULT_ROWS, Buckets
from hvd_agents.runtime.static.cost import measure_bucket_cost
from hvd_agents.runtime.static.decoder import StaticDecoder
from hvd_agents.runtime.static.graphs import StepGraphs
from hvd_agents.runtime.static.paths import CHUNK, kernels_available
from hvd_agents.runtime.static.slot_kv import SlotKV, SlotPool
from hvd_agents.runtime.transfer import to_device

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONTEXT = 16384  # positions a slot holds at most unless asked for more (KV is allocated up front)
BITWISE_ROWS = 33  # the bitwise mode's one row count: the last token and up to 32 draft tokens
CAPACITY_ALIGN = 64  # slot capacities are rounded up to this many positions
DEFAULT_SLOTS = 2
PREFILL_CHUNK = 512


def bitwise_mode(bitwise: bool | None, buckets: Buckets | None, device: torch.device) -> bool:
    """Whether a runner asked for ``bitwise`` (None: the default) with ``buckets`` runs in the bitwise mode.

    By default it does unless buckets are given, or on CUDA where path attention's Triton kernels are unavailable
    (no Triton, or kernels that fail to build or disagree with PyTorch's): then the per-bucket mode, with a warning
    that speculative output equals plain decoding only to rounding there.

    Raises:
        ValueError: ``bitwise=True`` with several row buckets, or on CUDA without path attention's kernels.
    """
    if bitwise is None:
        if buckets is not None:
            return False
        if not kernels_available(device):
            logger.warning("path attention's Triton kernels are unavailable (see the warning before): the static "
                           "runner runs in the per-bucket mode, where speculative output equals plain greedy "
                           "decoding only to rounding")
            return False
        return True
    if bitwise and buckets is not None and len(buckets.rows) != 1:
        raise ValueError(f"the bitwise mode runs every decode forward in one row bucket, not {buckets.rows}")
    if bitwise and not kernels_available(device):
        raise ValueError("the bitwise mode needs path attention's Triton kernels on CUDA, which are unavailable "
                         "here (see the warning logged when they were checked; install triton if it is missing)")
    return bitwise


class StaticRunner:
    """A :class:`~hvd_agents.runtime.runner.Runner` over static buffers and captured steps.

    Args:
        model: a supported HF causal LM (:func:`~.decoder.supports`), in eval mode, on its device.
        context_window: most positions a request may hold (default: the model's, at most
            ``max_context``).
        cost_model: the verification cost curve, when known (measured through the runner otherwise).
        slots: request caches that may be alive at once.
        buckets: row and KV-length buckets (default: one row bucket of :data:`BITWISE_ROWS` when bitwise, and
            the capacity, on CUDA also one chunk of path attention; else :data:`~.buckets.DEFAULT_ROWS` and
            powers of two); :meth:`Buckets.single` for the single-bucket test mode.
        bitwise: path attention in one row bucket (see the module docstring); default: when ``buckets`` is
            not given.
        stack_projections: see :class:`~.decoder.StaticDecoder`.
        lm_head_fp32: logits from a float32 copy of the LM head.
        graphs: capture CUDA graphs (default: on CUDA).
        compile: ``torch.compile`` the forward before capture (CUDA).
        max_context: cap on the default context window.
        warm_up: capture the common decode shapes now (CUDA), instead of at first use.
    """

    def __init__(self, model: torch.nn.Module, *, context_window: int | None = None,
                 cost_model: CostModel | None = None, slots: int = DEFAULT_SLOTS, buckets: Buckets | None = None,
                 lm_head_fp32: bool = False, graphs: bool | None = None, compile: bool = False,
                 max_context: int = DEFAULT_MAX_CONTEXT, warm_up: bool = True, bitwise: bool | None = None,
                 stack_projections: bool | None = None) -> None:
        config = model.config
        device = next(model.parameters()).device
        unloaded = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
        if unloaded:
            raise ValueError(f"the static runner needs the model's own tensors, and {len(unloaded)} of them hold no "
                             f"data (first: {unloaded[0]}): a GGUF file loaded for the native CPU forward alone; "
                             "load it with cpu_weights='none' (HVD_AGENTS_CPU_WEIGHTS=none)")
        bitwise = bitwise_mode(bitwise, buckets, device)
        if buckets is None:
            window = int(context_window or min(config.max_position_embeddings, max_context))
            if bitwise:
                capacity = -(-(window + BITWISE_ROWS) // CAPACITY_ALIGN) * CAPACITY_ALIGN
                # on CUDA a second KV length of one path-attention chunk: a step none of whose rows reaches past
                # it runs path attention as one kernel instead of two, with the same values bit for bit
                short = (CHUNK,) if device.type == "cuda" and capacity > CHUNK else ()
                buckets = Buckets((BITWISE_ROWS,), (*short, capacity))
            else:
                buckets = Buckets.for_capacity(window + DEFAULT_ROWS[-1])
        else:
            window = buckets.kv[-1] - buckets.max_rows
            if context_window is not None:
                window = min(window, int(context_window))
        if window < 1:
            raise ValueError(f"the KV capacity {buckets.kv[-1]} leaves no context after {buckets.max_rows} rows")
        self.model = model
        self.bitwise = bitwise
        self.buckets = buckets
        self.max_tree_tokens = buckets.max_rows - 1  # draft tokens of a tree one forward verifies
        self.context_window = window
        self.decoder = StaticDecoder(model, buckets.kv[-1], lm_head_fp32=lm_head_fp32,
                                     stack_projections=stack_projections)
        self.device = self.decoder.device
        self.vocab_size = self.decoder.vocab_size
        layers = len(self.decoder.layers)
        self.pool = SlotPool(slots, layers, self.decoder.kv_heads, self.decoder.head_dim, buckets.kv[-1],
                             self.decoder.dtype, self.device)
        self.graphs = StepGraphs(self.decoder, self.pool.data, enabled=self.device.type == "cuda"
                                 if graphs is None else graphs, compile=compile, paths=bitwise)
        self.lm_head_fp32 = lm_head_fp32
        self._cost_model = cost_model
        if warm_up and self.graphs.enabled:
            self.warm_up()

    def warm_up(self, kv_lengths: Sequence[int] | int = 2, slot: int = 0) -> None:
        """Capture (eager: run) every row bucket at some KV lengths of ``slot``, so steps there capture nothing.

        Args:
            kv_lengths: an int: the first that many KV-length buckets; a sequence: KV positions (or
                buckets), each standing for the bucket :meth:`Buckets.kv_for` maps it to.
            slot: the slot pool's slot.

        The warm-up forwards write at the slot's last positions, which no request's committed cache
        reaches (a request holds at most the context window), so a live request in ``slot`` keeps its KV.
        """
        if isinstance(kv_lengths, int):
            lengths = self.buckets.kv[:kv_lengths]
        else:
            lengths = sorted({self.buckets.kv_for(n) for n in kv_lengths})
        for length in lengths:
            for rows in self.buckets.rows:
                if rows <= length:
                    self.graphs.inputs(rows)[0] = self.pool.capacity - rows
                    self.graphs.run(slot, rows, length)

    def new_kv(self) -> SlotKV:
        return self.pool.acquire()

    def forward_batch(self, calls: Sequence[BatchCall]) -> list[torch.Tensor]:
        return forward_each(self, calls)  # one captured step per request; a batched step is not built yet

    def profile(self) -> CostModel:
        if self._cost_model is None:
            self._cost_model = cached_cost_model(self.model, key=self._profile_key(),
                                                 measure=lambda: measure_bucket_cost(self))
        return self._cost_model

    def _profile_key(self) -> str:
        param = next(self.model.parameters())
        parts = ["static", repr(self.buckets), f"bitwise={self.bitwise}", str(self.lm_head_fp32), str(param.device), str(param.dtype),
                 self.model.config.to_json_string(), *machine_key_parts()]
        if param.device.type == "cuda":
            parts.append(torch.cuda.get_device_name(param.device))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]

    def forward(self, kv: SlotKV, token_ids: Sequence[int], *, logits_to_keep: int = 0,
                hidden: list | None = None, parents: Sequence[int] | None = None) -> torch.Tensor:
        n = len(token_ids)
        if n == 0:
            return torch.empty(0, self.vocab_size, device=self.device)
        past = kv.length
        if past + n > self.context_window:
            raise ValueError(f"{past + n} positions exceed the context window of {self.context_window}")
        if parents is not None and len(parents) != n - 1:
            raise ValueError(f"a tree forward of {n} tokens needs {n - 1} parents, not {len(parents)}")
        keep = n if logits_to_keep <= 0 else min(logits_to_keep, n)
        if n <= self.buckets.max_rows:
            logits, rows = self._bucketed(kv, token_ids, parents, keep)
        elif parents is not None:
            raise ValueError(f"a tree forward takes at most {self.buckets.max_rows} tokens, not {n}")
        elif self.buckets.is_single and not self.bitwise:
            logits, rows = self._chunked_bucketed(kv, token_ids, keep)
        else:
            logits, rows = self._prefill(kv, token_ids, keep)
        add_hidden(hidden, rows)
        return logits

    def _bucketed(self, kv: SlotKV, token_ids: Sequence[int], parents: Sequence[int] | None,
                  keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode forward padded to its buckets: the packed inputs copied in, the step replayed."""
        n, past = len(token_ids), kv.length
        rows = self.buckets.rows_for(n)
        length = self.buckets.kv_for(past + rows)
        chain = range(-1, n - 2) if parents is None else parents
        packed = [past, *token_ids, *([0] * (rows - n)), *chain, *([-1] * (rows - n)), n]
        self.graphs.inputs(rows).copy_(to_device(packed, self.device), non_blocking=True)
        logits, states = self.graphs.run(kv.slot, rows, length)
        kv.advance(n)
        return logits[n - keep : n].clone(), states[:n].clone()

    def _chunked_bucketed(self, kv: SlotKV, token_ids: Sequence[int], keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A long chain through the single bucket, in bucket-sized chunks (the single-bucket mode's prefill)."""
        size, logits, states = self.buckets.max_rows, [], []
        ids = list(token_ids)
        for start in range(0, len(ids), size):
            chunk = ids[start : start + size]
            out, rows = self._bucketed(kv, chunk, None, len(chunk))
            logits.append(out)
            states.append(rows)
        return torch.cat(logits)[-keep:], torch.cat(states)

    def _prefill(self, kv: SlotKV, token_ids: Sequence[int], keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A long chain, eagerly, in chunks of :data:`PREFILL_CHUNK` rows written into the slot."""
        ids = to_device(list(token_ids), self.device)
        states = []
        with torch.inference_mode():
            for start in range(0, len(token_ids), PREFILL_CHUNK):
                chunk = ids[start : start + PREFILL_CHUNK]
                positions, write, mask = StaticDecoder.chain_inputs(kv.length, chunk.shape[0], self.device)
                _, h = self.decoder.forward(kv.data, chunk, positions, write, mask, logits=False)
                kv.advance(chunk.shape[0])
                states.append(h)
            rows = torch.cat(states)
            logits = F.linear(rows[-keep:].to(self.decoder.head.dtype), self.decoder.head)
        return logits, rows
