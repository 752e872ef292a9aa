"""Drafters: everything that proposes tokens for the target to verify.

``create_drafter(method, store)`` maps a decoding method name to a fresh drafter;
the engine keeps one instance per method, so drafters with cross-request state
keep it between requests, and passes its shared cache store to the factories.
"""

from __future__ import annotations

from collections.abc import Callable

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, NoDrafter, Outcome
from hvd_agents.drafters.prompt_lookup import PromptLookupDrafter
from hvd_agents.drafters.store import CacheStore
from hvd_agents.drafters.suffix import SuffixDrafter
from hvd_agents.errors import InvalidRequestError

DRAFTER_FACTORIES: dict[str, Callable[[CacheStore], Drafter]] = {
    "ar": lambda store: NoDrafter(),
    "pld": lambda store: PromptLookupDrafter(),
    "hvd-cache": lambda store: SuffixDrafter(store),
}


def available_methods() -> tuple[str, ...]:
    """Names accepted by :func:`create_drafter`, e.g. ``("ar", "pld", "hvd-cache")``."""
    return tuple(DRAFTER_FACTORIES)


def create_drafter(method: str, store: CacheStore) -> Drafter:
    """Create a fresh drafter for a decoding method name.

    Args:
        method: the method name.
        store: the engine's cross-request cache store (used by cache drafters).

    Raises:
        InvalidRequestError: the method name is unknown.
    """
    try:
        factory = DRAFTER_FACTORIES[method]
    except KeyError:
        raise InvalidRequestError(
            f"unknown decoding method {method!r}; choose one of {', '.join(available_methods())}"
        ) from None
    return factory(store)


__all__ = [
    "CacheStore",
    "Draft",
    "DraftContext",
    "Drafter",
    "NoDrafter",
    "Outcome",
    "PromptLookupDrafter",
    "SuffixDrafter",
    "available_methods",
    "create_drafter",
]
