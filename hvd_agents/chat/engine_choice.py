"""Which engine runs a chat call, and whether it knows the call's decoding method."""

from __future__ import annotations

from hvd_agents.chat.settings import DEFAULT_MODEL_NAME
from hvd_agents.drafters import available_methods
from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine
from hvd_agents.errors import InvalidRequestError


def check_method(method: str, engine: Engine | None) -> None:
    """Refuse an unknown decoding method (an injected engine may add its own drafters).

    Raises:
        InvalidRequestError: the method is neither built in nor known to ``engine``.
    """
    if method in available_methods():
        return
    if engine is None:
        raise InvalidRequestError(
            f"unknown decoding method {method!r}; choose one of {', '.join(available_methods())}"
        )
    engine.drafter(method)  # a drafter added with engine.add_drafter(), or InvalidRequestError


def resolve_engine(
    injected: Engine | None,
    model: str | None,
    device: str | None,
    call_model: str | None = None,
    draft_model: str | None = None,
) -> tuple[Engine, str]:
    """The engine of a call and the model name to report.

    Args:
        injected: the adapter's injected engine, if any.
        model: the adapter's model (hub id, path, ``.gguf``; None = embedded).
        device: the device for engines created here.
        call_model: a per-call model; another model selects another shared engine.
        draft_model: the adapter's draft model for engines created here (None:
            the target's shipped draft head, if any).
    """
    if call_model is not None and call_model != model:
        return shared_engine(call_model, device=device), call_model
    name = model if model is not None else DEFAULT_MODEL_NAME
    if injected is not None:
        return injected, name
    return shared_engine(model, device=device, draft_model=draft_model), name
