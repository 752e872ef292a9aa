"""The served engine: injected, or loaded in a background thread while ``/health`` answers 503.

Loading a model takes seconds to minutes; the server accepts connections at once so
that an orchestrator can poll ``/health`` (503 ``loading``, then 200 ``ok``, or 503
``failed`` with the reason). Generation requests during loading get a 503 with
``Retry-After``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hvd_agents.engine import Engine
from hvd_agents.errors import HVDError
from hvd_agents.server.errors import APIError

logger = logging.getLogger(__name__)


class EngineSlot:
    """Holds the engine once it is there.

    Args:
        engine: an engine to serve (ready at once), or None to call ``load``.
        load: builds the engine (called once, in a background thread, by :meth:`start`).
        retry_after_s: the ``Retry-After`` of a 503 while loading.
    """

    def __init__(self, engine: Engine | None = None, load: Callable[[], Engine] | None = None,
                 retry_after_s: int = 1) -> None:
        if engine is None and load is None:
            raise ValueError("give an engine or a way to load one")
        self._engine = engine
        self._load = load
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self.retry_after_s = retry_after_s

    @property
    def state(self) -> str:
        """``"ready"``, ``"loading"`` or ``"failed"``."""
        if self._engine is not None:
            return "ready"
        return "failed" if self._error is not None else "loading"

    @property
    def error(self) -> str | None:
        """Why loading failed, if it did."""
        return self._error

    def start(self) -> None:
        """Start loading in the background (no-op with an injected engine or once started)."""
        if self._engine is not None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="hvd-model-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._engine = self._load()
        except HVDError as exc:
            self._error = str(exc)
        except Exception as exc:  # reported by /health, and logged with its traceback
            logger.exception("loading the model failed")
            self._error = f"{type(exc).__name__}: {exc}"

    def get(self) -> Engine:
        """The engine.

        Raises:
            APIError: 503 while loading (with ``Retry-After``) or after a failed load.
        """
        if self._engine is not None:
            return self._engine
        if self._error is not None:
            raise APIError(503, f"the model failed to load: {self._error}", "server_error", None, "model_load_failed")
        raise APIError(503, "the model is loading", "server_error", None, "model_loading",
                       {"Retry-After": str(self.retry_after_s)})
