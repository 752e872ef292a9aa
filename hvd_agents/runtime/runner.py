"""The Runner: the one place the target model's forward runs, behind a small protocol.

The engine owns the decode loop; a :class:`Runner` owns the target as a device:
its forward, the per-request KV cache it writes, and what a step costs on this
machine. The engine never calls the model or touches KV layers itself, so a
runner with other kernels (quantized CPU weights, a captured GPU step over a
static cache) slots in without changing the loop.

Contract, per request::

    kv = runner.new_kv()                                    # empty
    logits = runner.forward(kv, prompt[:-1], logits_to_keep=1)  # prefill
    logits = runner.forward(kv, [last, *draft])             # [1 + d, vocab]: verify
    kv.rollback(kv.length - rejected)                       # drop rejected positions
    logits = runner.forward(kv, [last, *tree], parents=...) # a tree under its mask
    kv.compact(start, accepted_rows)                        # keep the accepted path
    kv.release()                                            # the request is over

* ``forward`` appends one KV position per token after the ``kv.length`` cached
  ones and returns the logits of the new positions, ``[n, vocab]`` (the last
  ``logits_to_keep`` only, when given). With ``parents`` (a tree draft: for each
  token after the first, the index of its parent among the draft tokens, or -1
  for the first token), each token attends to the cached positions, the first
  token and its own ancestors, at the position of its depth; the rows are in
  the order given. With ``hidden`` (a list, or anything with ``extend``), the
  new positions' last-layer hidden states ``[n, hidden]`` are appended to it.
* The KV object (:class:`RunnerKV`) rolls back, compacts a tree's accepted path,
  and exports/imports a prefix of positions for the prefix cache; stored prefixes
  are read-only and imports copy them.
* ``profile()`` is the verification cost curve measured on this machine
  (:mod:`hvd_agents.runtime.profile`), which the ``hvd`` policy prices steps with.
* ``forward_batch(calls)`` runs several requests' decode steps (:class:`BatchCall`: a
  cache, its tokens, its tree parents) and returns each one's logits, as if each had been
  a ``forward`` of its own; a runner that can share one forward among them (the
  quantized CPU runner: the weights are read once for all rows) does, the others run
  them one after another (:func:`forward_each`).
* ``max_tree_tokens`` (optional, default none): the most draft tokens of a tree one
  ``forward`` verifies; the engine cuts a longer tree to its first that many nodes.
* ``set_hidden_taps(layers)`` (optional): ``hidden`` rows carry, beside the last-layer state, the input of
  each layer in ``layers`` (the residual stream before its norm), ``[n, (1 + len(layers)) * hidden]``: what a
  draft head that fuses several layers reads (:class:`~hvd_agents.draft_head.DraftHeadConfig`'s ``taps``).
  A runner without it gives the last-layer state alone, and such a head drafts from that (worse, never wrong).
* ``greedy_rows`` (optional, default PyTorch's): what reads a greedy step's rows' argmax and the target's
  signal from logits on the CPU (:class:`~hvd_agents.runtime.greedy_rows.GreedyRows`; the native CPU runner
  reads them on its own kernels).
* ``runs_own_threads`` (optional, default False): the forward runs on the runner's own
  threads rather than torch's; the engine then runs its steps inside
  :func:`hvd_agents.runtime.cpu.threads.step_threads`, so torch's small ops between forwards
  stay on the calling thread and never compete with the forward's threads for cores.

:class:`HFRunner` implements it over any HuggingFace causal LM with the
in-place cache of :mod:`hvd_agents.runtime.kv`. A tree's mask is given to the model
as is; for a model with sliding-window layers, the window is applied to it as well
(:func:`windowed_masks`), since a mask given to the model is used as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.kv import LayerKV, cache_argument, new_cache, window_of
from hvd_agents.runtime.profile import cached_cost_model


@runtime_checkable
class RunnerKV(Protocol):
    """A request's KV cache as the engine and the prefix cache use it."""

    @property
    def length(self) -> int:
        """Positions held."""

    @property
    def supports_trees(self) -> bool:
        """Whether :meth:`compact` can keep non-contiguous positions."""

    @property
    def supports_reuse(self) -> bool:
        """Whether a prefix of positions can be exported and imported."""

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` positions."""

    def compact(self, start: int, offsets: Sequence[int]) -> None:
        """Keep ``[0, start)`` and ``start + offsets`` (increasing)."""

    def export_prefix(self, n: int) -> tuple[LayerKV, ...]:
        """Per-layer (keys, values) of positions ``[0, n)``; read-only."""

    def import_prefix(self, layers: Sequence[LayerKV], n: int) -> None:
        """Copy positions ``[0, n)`` of exported ``layers`` into this empty cache."""

    def release(self) -> None:
        """Give the cache's memory back to its runner now (do not use the cache afterwards)."""


@dataclass(frozen=True)
class BatchCall:
    """One request's part of a batched decode step: ``forward(kv, token_ids, parents=parents)``."""

    kv: RunnerKV
    token_ids: Sequence[int]
    parents: Sequence[int] | None = None
    hidden: list | None = None  # when given, the rows' last-layer hidden states are appended to it


def add_hidden(hidden: list | None, rows: torch.Tensor) -> None:
    """Give a forward's ``[n, hidden]`` last-layer states to the caller's ``hidden`` (the ``forward`` contract):
    appended as one tensor to a list, extended row by row into anything else with ``extend``; nothing for None."""
    if hidden is None:
        return
    if isinstance(hidden, list):
        hidden.append(rows)
    else:
        hidden.extend(rows)


def forward_each(runner: Runner, calls: Sequence[BatchCall]) -> list[torch.Tensor]:
    """``forward_batch`` by separate forwards, in order: for runners with nothing to share among requests."""
    return [runner.forward(call.kv, call.token_ids, parents=call.parents, hidden=call.hidden) for call in calls]


@runtime_checkable
class Runner(Protocol):
    """The target as a device (see the module docstring)."""

    device: torch.device
    vocab_size: int
    context_window: int

    def new_kv(self) -> RunnerKV:
        """An empty KV cache for one request."""

    def forward(
        self,
        kv: RunnerKV,
        token_ids: Sequence[int],
        *,
        logits_to_keep: int = 0,
        hidden: list | None = None,
        parents: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Run ``token_ids`` after the cached positions; returns ``[n, vocab]`` logits."""

    def profile(self) -> CostModel:
        """The verification cost curve on this machine."""

    def forward_batch(self, calls: Sequence[BatchCall]) -> list[torch.Tensor]:
        """Each call's ``[n, vocab]`` logits, as ``forward`` would give them (see the module docstring)."""


class HFRunner:
    """A :class:`Runner` over a HuggingFace causal LM (eager forwards, the in-place KV cache).

    Args:
        model: the target, in eval mode.
        context_window: most positions a request may hold (default: the model's
            ``max_position_embeddings``).
        cost_model: the verification cost curve, when known; measured on first
            use (and cached per model and machine) otherwise.
    """

    def __init__(self, model: PreTrainedModel, *, context_window: int | None = None,
                 cost_model: CostModel | None = None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_window = int(context_window or model.config.max_position_embeddings)
        self._cost_model = cost_model
        self._cache_arg = cache_argument(model)
        self.hidden_taps: tuple[int, ...] = ()

    def set_hidden_taps(self, layers: Sequence[int]) -> None:
        """``hidden`` rows carry the input of each of ``layers`` beside the last-layer state (the module docstring).

        Raises:
            ValueError: a layer the model does not have.
        """
        count = int(self.model.config.num_hidden_layers)
        if any(not 0 <= layer < count for layer in layers):
            raise ValueError(f"layers {tuple(layers)} are not all in 0..{count - 1}")
        self.hidden_taps = tuple(layers)

    def new_kv(self) -> RunnerKV:
        return new_cache(self.model.config)

    def profile(self) -> CostModel:
        if self._cost_model is None:
            self._cost_model = cached_cost_model(self.model)
        return self._cost_model

    def forward_batch(self, calls: Sequence[BatchCall]) -> list[torch.Tensor]:
        return forward_each(self, calls)

    def forward(
        self,
        kv: RunnerKV,
        token_ids: Sequence[int],
        *,
        logits_to_keep: int = 0,
        hidden: list | None = None,
        parents: Sequence[int] | None = None,
    ) -> torch.Tensor:
        if not token_ids:
            return torch.empty(0, self.vocab_size, device=self.device)
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)  # [1, n]
        positions = mask = None
        if parents is not None:
            positions, mask = tree_inputs(kv.length, parents, self.device)
            mask = windowed_masks(mask, positions, window_of(kv))
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                **{self._cache_arg: kv},
                use_cache=True,
                logits_to_keep=logits_to_keep,
                output_hidden_states=hidden is not None,
                position_ids=positions,
                attention_mask=mask,
            )
        if hidden is not None:
            # hidden_states[l]: the input of layer l; [-1]: the last layer's output after the final norm
            rows = [out.hidden_states[-1][0], *(out.hidden_states[layer][0] for layer in self.hidden_taps)]
            add_hidden(hidden, torch.cat(rows, dim=-1))  # [n, (1 + taps) * hidden]
        return out.logits[0]  # [n or logits_to_keep, vocab]


def tree_inputs(past: int, parents: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids ``[1, n]`` and the boolean attention mask ``[1, 1, n, past + n]`` of a tree forward.

    The forward's rows are the root (the last emitted token) and then the draft
    tokens, token ``i`` with parent ``parents[i]`` (-1: the root). Each row sees
    every cached position, the root and its own ancestors, and sits at the
    position of its depth.

    Example: ``parents = (-1, 0, 0)`` (two alternatives after the first token)
    gives positions ``past + [0, 1, 2, 2]``; row 3 sees rows 0, 1 and 3.
    """
    n = len(parents) + 1  # the root and the draft tokens
    visible = torch.zeros(n, n, dtype=torch.bool)  # [n, n]: row attends to column (root and ancestors)
    visible[:, 0] = True
    depth = [0] * n
    for i, parent in enumerate(parents):
        visible[i + 1] = visible[parent + 1]
        visible[i + 1, i + 1] = True
        depth[i + 1] = depth[parent + 1] + 1
    mask = torch.cat([torch.ones(n, past, dtype=torch.bool), visible], dim=1)[None, None]  # [1, 1, n, past + n]
    positions = torch.tensor([[past + d for d in depth]], dtype=torch.long)  # [1, n]
    return positions.to(device), mask.to(device)


def windowed_masks(mask: torch.Tensor, positions: torch.Tensor,
                   windows: Sequence[int | None]) -> torch.Tensor | dict[str, torch.Tensor]:
    """A tree's mask (:func:`tree_inputs`) for a model whose cache layers have the attention ``windows``.

    A row at position ``p`` of a sliding-window layer of window ``w`` sees only keys at positions
    ``> p - w``: the cached keys sit at their index, the tree's own keys at their depth's position.

    Returns:
        ``mask`` itself when no layer has a window; the windowed mask ``[1, 1, n, past + n]`` when every
        layer has one; else ``{"full_attention": mask, "sliding_attention": windowed}``, the per-kind
        masks the models with both kinds of layers take.

    Raises:
        ValueError: the layers have different windows.
    """
    sizes = {w for w in windows if w is not None}
    if not sizes:
        return mask
    if len(sizes) > 1:
        raise ValueError(f"a tree mask needs one attention window, not {sorted(sizes)}")
    window = sizes.pop()
    rows = positions[0]  # [n]
    past = mask.shape[-1] - rows.shape[0]
    keys = torch.cat([torch.arange(past, device=rows.device), rows])  # [past + n]: each key's position
    near = (rows[:, None] - keys[None, :]) < window  # [n, past + n]
    windowed = mask & near[None, None]  # [1, 1, n, past + n]
    if all(w is not None for w in windows):
        return windowed
    return {"full_attention": mask, "sliding_attention": windowed}
