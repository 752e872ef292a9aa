"""Drafters: everything that proposes tokens for the target to verify.

``create_drafter(method)`` maps a decoding method name to a fresh drafter; the
engine keeps one instance per method so that drafters with cross-request state
keep it between requests.
"""

from __future__ import annotations

from collections.abc import Callable

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, NoDrafter, Outcome
from hvd_agents.drafters.prompt_lookup import PromptLookupDrafter
from hvd_agents.errors import InvalidRequestError

DRAFTER_FACTORIES: dict[str, Callable[[], Drafter]] = {
    "ar": NoDrafter,
    "pld": PromptLookupDrafter,
}


def available_methods() -> tuple[str, ...]:
    """Names accepted by :func:`create_drafter`, e.g. ``("ar", "pld")``."""
    return tuple(DRAFTER_FACTORIES)


def create_drafter(method: str) -> Drafter:
    """Create a fresh drafter for a decoding method name.

    Raises:
        InvalidRequestError: the method name is unknown.
    """
    try:
        factory = DRAFTER_FACTORIES[method]
    except KeyError:
        raise InvalidRequestError(
            f"unknown decoding method {method!r}; choose one of {', '.join(available_methods())}"
        ) from None
    return factory()


__all__ = [
    "Draft",
    "DraftContext",
    "Drafter",
    "NoDrafter",
    "Outcome",
    "PromptLookupDrafter",
    "available_methods",
    "create_drafter",
]
