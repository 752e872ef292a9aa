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

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, NoDrafter, Outcome
from hvd_agents.drafters.hybrid import HybridDrafter
from hvd_agents.drafters.prompt_lookup import PromptLookupDrafter
from hvd_agents.drafters.store import CacheStore
from hvd_agents.drafters.suffix import SuffixDrafter
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel


@dataclass(frozen=True)
class DrafterResources:
    """What an engine shares with the drafters it creates.

    Attributes:
        store: the cross-request cache store.
        cost: returns the target's cost model (measured lazily, on first call).
    """

    store: CacheStore
    cost: Callable[[], CostModel] = lambda: CostModel.linear(0.02)


DRAFTER_FACTORIES: dict[str, Callable[[DrafterResources], Drafter]] = {
    "ar": lambda res: NoDrafter(),
    "pld": lambda res: PromptLookupDrafter(),
    "hvd-cache": lambda res: SuffixDrafter(res.store),
    "hvd": lambda res: HybridDrafter(SuffixDrafter(res.store), cost=res.cost),
}


def available_methods() -> tuple[str, ...]:
    """Names accepted by :func:`create_drafter`, e.g. ``("ar", "pld", "hvd-cache", "hvd")``."""
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
    "Draft",
    "DraftContext",
    "Drafter",
    "DrafterResources",
    "HybridDrafter",
    "NoDrafter",
    "Outcome",
    "PromptLookupDrafter",
    "SuffixDrafter",
    "available_methods",
    "create_drafter",
]
