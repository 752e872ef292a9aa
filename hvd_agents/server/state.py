"""What the routes share: the config, the engine, the generation queue and the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hvd_agents.engine import Engine
from hvd_agents.server.config import ServerConfig
from hvd_agents.server.errors import APIError
from hvd_agents.server.loading import EngineSlot
from hvd_agents.server.metrics import ServerMetrics
from hvd_agents.server.queue import GenerationQueue


@dataclass
class ServerState:
    """One server's shared parts (``app.state.hvd``)."""

    config: ServerConfig
    slot: EngineSlot
    queue: GenerationQueue
    metrics: ServerMetrics
    started: int = field(default_factory=lambda: int(time.time()))

    def engine_for(self, model: str) -> Engine:
        """The engine, for a request that names ``model``.

        Raises:
            APIError: 404 for a model this server does not serve; 503 while loading.
        """
        if not self.config.serves(model):
            raise APIError(404, f"the model {model!r} does not exist: this server serves {self.config.model_name!r}",
                           "not_found_error", "model", "model_not_found")
        return self.slot.get()
