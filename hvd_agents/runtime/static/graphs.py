"""Decode steps as captured CUDA graphs: one per (slot, row bucket, KV-length bucket), replayed.

A decode step of a small model is launch-bound: each of SmolLM2-135M's 30 layers
issues a dozen kernels, each a few microseconds of GPU work, and eager PyTorch spends
longer than that launching them. :class:`StepGraphs` captures the whole bucketed
forward of :class:`~.decoder.StaticDecoder` once per shape, reading its inputs from
static buffers (one packed ``[2R + 1]`` long tensor: the cached length, ``R`` tokens,
``R - 1`` parents, the number of real rows) and writing logits and hidden states to static outputs. A step is
then one host-to-device copy of the packed inputs and one graph launch.

Graphs are captured when a shape is first used (after two eager warm-up runs on a
side stream, as PyTorch requires) and kept; :meth:`StepGraphs.warm_up` captures the
common shapes when the runner is made. All graphs share one memory pool. On a device
other than CUDA, or with ``enabled=False``, the same forward runs eagerly on the same
buffers, so every shape and mask path is exercised by the CPU tests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from hvd_agents.runtime.paths import cache_root
from hvd_agents.runtime.static.decoder import StaticDecoder

logger = logging.getLogger(__name__)


class StepGraphs:
    """Bucketed decode forwards over a slot pool, captured as CUDA graphs where possible.

    Args:
        decoder: the forward.
        pool_data: the slot pool's tensor, ``[slots, layers, 2, kv_heads, capacity, head_dim]``.
        enabled: capture graphs (only meaningful on CUDA).
        compile: wrap the forward in ``torch.compile`` before capture (kernel fusion; CUDA only).
        paths: path attention (:mod:`.paths`) instead of dense masked attention.
    """

    def __init__(self, decoder: StaticDecoder, pool_data: torch.Tensor, *, enabled: bool,
                 compile: bool = False, paths: bool = False) -> None:
        self.decoder = decoder
        self.paths = paths
        self.pool_data = pool_data
        self.device = pool_data.device
        self.enabled = enabled and self.device.type == "cuda"
        self._inputs: dict[int, torch.Tensor] = {}  # rows -> [2 * rows + 1] long: past, tokens, parents, count
        self._graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.enabled else None
        self._side: torch.cuda.Stream | None = None  # warm-up stream of every capture (made at the first)
        self._forward: Callable = decoder.forward
        if compile and self.enabled:
            # compiled kernels persist under the cache directory, so a restart does not compile again
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
            try:
                self._forward = torch.compile(decoder.forward, mode="max-autotune-no-cudagraphs", dynamic=False)
            except Exception as exc:  # noqa: BLE001 - any compiler failure leaves the eager kernels
                logger.warning("torch.compile is unavailable (%s); the decode step runs eager kernels", exc)

    @property
    def captured(self) -> int:
        """Graphs captured so far."""
        return len(self._graphs)

    def inputs(self, rows: int) -> torch.Tensor:
        """The static packed input buffer of the ``rows`` bucket.

        Made outside inference mode even when first asked for inside it (warm-up, a capture): the runner
        copies each step's inputs into it outside inference mode, which an inference tensor refuses.
        """
        buffer = self._inputs.get(rows)
        if buffer is None:
            with torch.inference_mode(False):
                buffer = torch.zeros(2 * rows + 1, dtype=torch.long, device=self.device)
                buffer[rows + 1 : 2 * rows] = -1
                buffer[-1] = 1
            self._inputs[rows] = buffer
        return buffer

    def _eager(self, slot: int, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        packed = self.inputs(rows)
        past, tokens, parents, count = packed[:1], packed[1 : rows + 1], packed[rows + 1 : 2 * rows], packed[2 * rows :]
        positions, write, attend = self.decoder.decode_inputs(parents, past, length, count if self.paths else None)
        return self._forward(self.pool_data[slot], tokens, positions, write, attend)

    def run(self, slot: int, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[rows, vocab]`` and hidden states ``[rows, hidden]`` of the forward whose packed inputs are
        in :meth:`inputs` ``(rows)``; graph outputs are overwritten by the next replay: copy what you keep."""
        with torch.inference_mode():
            if not self.enabled:
                return self._eager(slot, rows, length)
            key = (slot, rows, length)
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._capture(key)
            graph, logits, hidden = entry
            graph.replay()
            return logits, hidden

    def _capture(self, key: tuple[int, int, int]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        slot, rows, length = key
        if self._side is None:  # one stream: cuBLAS keeps a workspace per (handle, stream)
            self._side = torch.cuda.Stream(self.device)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy initialisation, autotuning, allocator state
                self._eager(slot, rows, length)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, hidden = self._eager(slot, rows, length)
        self._graphs[key] = (graph, logits, hidden)
        logger.debug("captured the decode step for slot %d, %d rows, %d KV positions", slot, rows, length)
        return self._graphs[key]
