"""An engine's drafters: one per method, the ones a caller added, and the model drafter they may ask.

* :meth:`DrafterSet.get` makes the drafter of a built-in method on first use
  (:func:`~hvd_agents.drafters.create_drafter`) and keeps it across requests;
  :meth:`DrafterSet.add` makes a caller's drafter the one of its method.
* :meth:`DrafterSet.for_request` is the drafter a request runs with: the kept one, or,
  for a batched request of a built-in method, a new one of its own (a drafter keeps one
  request's model-drafter state); an added drafter is always shared.
* The model drafter is over ``draft_model`` when one is given, else over the draft head
  (``"auto"``: the head shipped for the target, looked up on first use).
* With ``quantize_head`` (the engine sets it when the target runs on the native CPU forward), a
  head the set loads itself (``"auto"`` or a path) drafts on the native int8 kernel
  (:meth:`~hvd_agents.draft_head.DraftHead.quantize_for_cpu`); a :class:`DraftHead` given as an
  object is used as it is.
* A head that fuses several of the target's layers (its config's ``taps``) has the runner give them with the
  hidden states (``set_hidden_taps``, passed in as ``tap_layers``); without it the head drafts from the
  last-layer state alone (a warning says so).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from hvd_agents.draft_head import DraftHead, load_head, shipped_head_for
from hvd_agents.drafters import (
    CacheStore,
    Drafter,
    DrafterResources,
    DraftHeadDrafter,
    DraftModelDrafter,
    create_drafter,
)
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel

# a padded embedding matrix may have a few more rows than the tokenizer has tokens; another tokenizer differs more
_VOCAB_PADDING = 1024


class DrafterSet:
    """The drafters of one engine (see the module docstring).

    Args:
        target: the target model (a draft head is fitted to it).
        vocab_size: the target's vocabulary (a draft model must share it).
        cache_store: the cross-request store the cache drafters share.
        cost: returns the target's verification cost profile (measured on first call).
        draft_model: a smaller causal LM sharing the target's tokenizer, or None.
        draft_head: a :class:`~hvd_agents.draft_head.DraftHead`, a path to a head file,
            ``"auto"`` or None.
        quantize_head: a head loaded here (``"auto"`` or a path) drafts on the native int8 kernel.
        tap_layers: the runner's ``set_hidden_taps``, or None when it has none.

    Raises:
        InvalidRequestError: the draft model's vocabulary is not the target's.
    """

    def __init__(self, target: PreTrainedModel, vocab_size: int, cache_store: CacheStore,
                 cost: Callable[[], CostModel], draft_model: PreTrainedModel | None = None,
                 draft_head: DraftHead | str | Path | None = "auto", tokenizer: Any = None,
                 quantize_head: bool = False,
                 tap_layers: Callable[[Sequence[int]], None] | None = None) -> None:
        self.tap_layers = tap_layers
        self.tokenizer = tokenizer  # handed to the drafter factories (hvd-paper reads punctuation ids off it)
        if draft_model is not None:
            draft_vocab = draft_model.get_output_embeddings().weight.shape[0]
            if abs(draft_vocab - vocab_size) > _VOCAB_PADDING:
                raise InvalidRequestError(
                    f"the draft model's vocabulary ({draft_vocab}) does not match the target's ({vocab_size}): "
                    "a draft model must share the target's tokenizer"
                )
        self.quantize_head = quantize_head
        if isinstance(draft_head, (str, Path)) and draft_head != "auto":
            draft_head = self._prepared(load_head(draft_head, target))
        elif isinstance(draft_head, DraftHead):
            if draft_head.embed is None:
                draft_head.attach(target)
            self._tap(draft_head)
        self.target = target
        self.vocab_size = vocab_size
        self.cache_store = cache_store
        self.cost = cost
        self.draft_model = draft_model
        self._draft_head = draft_head
        self._kept: dict[str, Drafter] = {}
        self._added: set[str] = set()  # methods whose drafter a caller added (shared by batched requests)

    @property
    def draft_head(self) -> DraftHead | None:
        """The draft head (the one shipped for the target when ``"auto"``), or None."""
        if isinstance(self._draft_head, str):  # "auto", resolved on first use
            self._draft_head = self._prepared(shipped_head_for(self.target))
        return self._draft_head

    def _prepared(self, head: DraftHead | None) -> DraftHead | None:
        """``head`` on the native int8 kernel when the set quantizes the heads it loads, its layers tapped."""
        if head is not None:
            if self.quantize_head:
                head.quantize_for_cpu()
            self._tap(head)
        return head

    def _tap(self, head: DraftHead) -> None:
        """Have the runner give the layers ``head`` fuses with the hidden states."""
        taps = head.config.taps
        if self.tap_layers is not None:
            self.tap_layers(taps)
        elif taps:
            warnings.warn(f"the runner cannot give the inputs of layers {taps} the draft head fuses: it drafts from "
                          "the last layer's states alone", stacklevel=3)

    def model_drafter(self) -> Drafter | None:
        """A fresh model drafter: over ``draft_model`` when given, else over the draft head; None without either."""
        if self.draft_model is not None:
            return DraftModelDrafter(self.draft_model, self.vocab_size)
        head = self.draft_head
        return DraftHeadDrafter(head) if head is not None else None

    def get(self, method: str) -> Drafter:
        """The drafter kept for ``method`` (created on first use)."""
        if method not in self._kept:
            self._kept[method] = create_drafter(method, self._resources())
        return self._kept[method]

    def add(self, method: str, drafter: Drafter) -> None:
        """Make ``drafter`` the one of ``method``.

        Raises:
            InvalidRequestError: ``drafter`` does not implement the Drafter protocol.
        """
        if not isinstance(drafter, Drafter):
            raise InvalidRequestError(f"{type(drafter).__name__} does not implement the Drafter protocol")
        self._kept[method] = drafter
        self._added.add(method)

    def for_request(self, method: str, *, batched: bool) -> Drafter:
        """The drafter a request of ``method`` runs with: a batched request of a built-in method gets its own.

        Raises:
            InvalidRequestError: ``method`` names no drafter.
        """
        drafter = self.get(method)  # an unknown method fails here, for a batched request too
        if batched and method not in self._added:
            return create_drafter(method, self._resources())
        return drafter

    def _resources(self) -> DrafterResources:
        return DrafterResources(self.cache_store, self.cost, self.model_drafter, self.tokenizer)
