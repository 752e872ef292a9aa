"""An OpenAI-, Anthropic- and Ollama-compatible HTTP server over the engine (``hvd-agents serve``).

* :mod:`.app`: :func:`~.app.create_app` (the FastAPI app) and :func:`~.app.serve` (uvicorn).
* :mod:`.routes`: the routes; :mod:`.jobs`: the generations they queue.
* :mod:`.schema`: request bodies and their checks; :mod:`.shaping`: responses and SSE chunks.
* :mod:`.anthropic`: Anthropic's Messages API; :mod:`.ollama`: Ollama's API (each over the same jobs).
* :mod:`.request_schemas`: what the published request schemas say the checks accept.
* :mod:`.errors`: each API's error envelope; :mod:`.auth`: API keys; :mod:`.limits`: body size.
* :mod:`.queue`: the one generation worker and its bounded queue; :mod:`.disconnect`:
  cancelling a generation whose client left; :mod:`.loading`: the engine while it loads.
* :mod:`.metrics`: Prometheus metrics; :mod:`.config`: the settings.
* :mod:`.loadtest`: a bounded load test against a running server.

Needs the ``server`` extra (``pip install 'hvd-agents[server]'``); this package's
``__init__`` imports nothing, so the CLI can read :mod:`.config` without it::

    from hvd_agents.server.app import create_app, serve
    from hvd_agents.server.config import ServerConfig
"""
