"""One engine per model per process, created lazily on first use."""

from __future__ import annotations

import threading

from hvd_agents.engine.engine import Engine
from hvd_agents.runtime.device import resolve_device

_engines: dict[tuple[str | None, str, str | None], Engine] = {}
_lock = threading.Lock()


def shared_engine(model: str | None = None, *, device: str | None = None, draft_model: str | None = None) -> Engine:
    """The process-wide engine for ``model`` on ``device`` (with ``draft_model``), loading it on first call.

    Args:
        model: hub id, local path or GGUF file; None for the embedded default.
        device: "cpu", "cuda", ...; None picks CUDA when available.
        draft_model: a smaller model with the same tokenizer that drafts for
            ``model`` (loaded the same way); None uses the draft head shipped
            for ``model``, if any.

    Raises:
        ModelNotFoundError: ``model`` cannot be found.
        ModelLoadError: it was found but cannot be loaded.
        InvalidRequestError: ``device`` is malformed or unavailable.
    """
    key = (
        None if model is None else str(model),
        str(resolve_device(device)[0]),  # None and "cpu" share
        None if draft_model is None else str(draft_model),
    )
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = Engine.load(model, device=device, draft_model=draft_model)
            _engines[key] = engine
        return engine
