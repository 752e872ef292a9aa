"""Drafters: everything that proposes tokens for the target to verify.

``create_drafter(method, resources)`` maps a decoding method name to a fresh
drafter; the engine keeps one instance per method, so drafters with cross-request
state keep it between requests, and passes what it shares with them
(:class:`DrafterResources`: the cache store, the target's cost model) to the
factories.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvd_agents.drafters.base import (
    Draft,
    DraftContext,
    Drafter,
    DraftOutcome,
    NoDrafter,
    Outcome,
    never_drafts,
    uses_hidden_states,
)
from hvd_agents.drafters.cache.prompt_lookup import PromptLookupDrafter
from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.hybrid.drafter import HybridDrafter
from hvd_agents.drafters.hybrid.merge import ChainDrafter, GraftDrafter
from hvd_agents.drafters.hybrid.paper import PaperDrafter
from hvd_agents.drafters.model.draft_lm import DraftModelDrafter
from hvd_agents.drafters.model.head import DraftHeadDrafter
from hvd_agents.drafters.model.protocol import ModelDrafter, PlainModelDrafter
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.paper import TokenClasses
from hvd_agents.policy.token_text import TokenText


@dataclass(frozen=True)
class DrafterResources:
    """What an engine shares with the drafters it creates.

    Attributes:
        store: the cross-request cache store.
        cost: returns the target's cost model (measured lazily, on first call).
        model_drafter: returns a fresh model drafter for the target (a draft
            head or a draft LM, :class:`~hvd_agents.drafters.model.protocol.ModelDrafter`),
            or None when the engine has none.
        tokenizer: the target's tokenizer, when the engine has one (``hvd-paper`` reads its punctuation
            and bracket tokens off it, ``hvd`` its tokens' text classes).
    """

    store: CacheStore
    cost: Callable[[], CostModel] = CostModel.fallback
    model_drafter: Callable[[], ModelDrafter | None] = lambda: None
    tokenizer: Any = None


def _model_only(resources: DrafterResources) -> Drafter:
    drafter = resources.model_drafter()
    if drafter is None:
        raise InvalidRequestError(
            "method 'model' needs a model drafter: this target has no shipped draft head; pass draft_model= "
            "(a smaller LM with the same tokenizer) or draft_head= (a file from `hvd-agents train-drafter`)"
        )
    return drafter


DRAFTER_FACTORIES: dict[str, Callable[[DrafterResources], Drafter]] = {
    "ar": lambda res: NoDrafter(),
    "pld": lambda res: PromptLookupDrafter(),
    "hvd-cache": lambda res: SuffixDrafter(res.store, count_forks=False),
    "model": _model_only,
    "hvd": lambda res: HybridDrafter(SuffixDrafter(res.store, text=lambda: TokenText.from_tokenizer(res.tokenizer)),
                                     cost=res.cost, model=res.model_drafter()),
    "hvd-paper": lambda res: PaperDrafter(SuffixDrafter(res.store), model=res.model_drafter(),
                                          classes=lambda: TokenClasses.from_tokenizer(res.tokenizer)),
    "hvd-chain": lambda res: ChainDrafter(SuffixDrafter(res.store), model=res.model_drafter()),
    "hvd-graft": lambda res: GraftDrafter(SuffixDrafter(res.store), model=res.model_drafter()),
}


def available_methods() -> tuple[str, ...]:
    """Names accepted by :func:`create_drafter`, e.g. ``("ar", "pld", "hvd-cache", "model", "hvd")``."""
    return tuple(DRAFTER_FACTORIES)


def create_drafter(method: str, resources: DrafterResources) -> Drafter:
    """Create a fresh drafter for a decoding method name.

    Args:
        method: the method name.
        resources: what the engine shares (cache store, cost model).

    Raises:
        InvalidRequestError: the method name is unknown.
    """
    try:
        factory = DRAFTER_FACTORIES[method]
    except KeyError:
        raise InvalidRequestError(
            f"unknown decoding method {method!r}; choose one of {', '.join(available_methods())}"
        ) from None
    return factory(resources)


__all__ = [
    "CacheStore",
    "ChainDrafter",
    "Draft",
    "DraftContext",
    "DraftHeadDrafter",
    "DraftModelDrafter",
    "DraftOutcome",
    "Drafter",
    "DrafterResources",
    "GraftDrafter",
    "HybridConfig",
    "HybridDrafter",
    "ModelDrafter",
    "NoDrafter",
    "Outcome",
    "PaperDrafter",
    "PlainModelDrafter",
    "PromptLookupDrafter",
    "SuffixDrafter",
    "available_methods",
    "create_drafter",
    "never_drafts",
    "uses_hidden_states",
]
