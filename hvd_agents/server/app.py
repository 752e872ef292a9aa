"""The OpenAI-, Anthropic- and Ollama-compatible HTTP server: :func:`create_app` builds it, :func:`serve` runs it.

::

    hvd-agents serve                       # embedded model on http://127.0.0.1:8000/v1
    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")

Routes (:mod:`.routes`): ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/responses`` (:mod:`.responses`), Anthropic's ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (:mod:`.anthropic`), Ollama's ``/api/chat``,
``/api/generate``, ``/api/tags``, ``/api/show`` and ``/api/version`` (:mod:`.ollama`),
``GET /v1/models``, ``GET /health`` (503 while the model loads), ``GET /metrics``
(Prometheus), ``GET /openapi.json`` (:mod:`.openapi`). Every error is in its API's envelope
(:mod:`.errors`: OpenAI's, Anthropic's on ``/v1/messages``, Ollama's on ``/api/``): 400
naming the field for a bad request, 401 without the key, 404 for an unknown model or route, 413 for a body over the bound, 503 with
``Retry-After`` while loading or when the queue is full; a 500 only for a bug
(:mod:`.crashes`).

The middleware, outermost first: the status counter (every answer is counted, 500s
too), the bug catcher, the API key (checked before the body is read), the body bound,
the memory trim after large bodies (:mod:`.memory`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine
from hvd_agents.errors import HVDError
from hvd_agents.runtime.chat_template import set_chat_template
from hvd_agents.server.anthropic import anthropic_router
from hvd_agents.server.auth import AuthMiddleware
from hvd_agents.server.config import ServerConfig
from hvd_agents.server.crashes import InternalErrorMiddleware
from hvd_agents.server.errors import APIError, api_error_of, error_body
from hvd_agents.server.limits import BodyLimitMiddleware
from hvd_agents.server.loading import EngineSlot
from hvd_agents.server.memory import TrimMiddleware
from hvd_agents.server.metrics import ServerMetrics, StatusCountMiddleware
from hvd_agents.server.ollama import ollama_router
from hvd_agents.server.openapi import build_openapi
from hvd_agents.server.queue import GenerationQueue
from hvd_agents.server.responses_store import ResponseStore
from hvd_agents.server.routes import guarded, router
from hvd_agents.server.schema import validation_error
from hvd_agents.server.state import ServerState

logger = logging.getLogger(__name__)

_HTTP_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


def create_app(
    config: ServerConfig | None = None, engine: Engine | None = None, load: Callable[[], Engine] | None = None
) -> FastAPI:
    """The ASGI app.

    Args:
        config: the settings (defaults: embedded model, loopback, no key).
        engine: an engine to serve; None loads one in the background when the app
            starts (``/health`` says 503 until it is loaded).
        load: how to load it; None = ``shared_engine`` of ``config.model``, ``config.device``
            and ``config.draft_model``. ``config.chat_template``, when set, is given to the loaded
            engine's tokenizer (or to ``engine``'s).
    """
    config = config or ServerConfig()
    metrics = ServerMetrics()
    if load is None:
        def load() -> Engine:
            if config.max_batch > 1:  # an engine of its own: the process-wide one serialises its requests
                return Engine.load(config.model, device=config.device, draft_model=config.draft_model,
                                   max_batch=config.max_batch)
            return shared_engine(config.model, device=config.device, draft_model=config.draft_model)
    if config.chat_template is not None:
        engine, load = _with_template(engine, load, config.chat_template)
    slot = EngineSlot(engine, load, config.retry_after_s)
    queue = GenerationQueue(config.max_pending, config.retry_after_s, metrics.set_pending, workers=config.max_batch)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        slot.start()
        yield
        queue.close()

    app = FastAPI(title="hvd-agents", description="OpenAI-compatible server over hvd-agents", lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hvd = ServerState(config, slot, queue, metrics)
    app.state.responses = ResponseStore()  # what previous_response_id continues
    routers = (router, guarded, anthropic_router, ollama_router)
    for part in routers:
        app.include_router(part)
    _add_error_handlers(app)
    routes = [route.path for part in routers for route in part.routes if "{" not in route.path]
    document: dict = {}

    def openapi() -> dict:
        if not document:
            document.update(build_openapi(app, keyed=config.api_key is not None))
        return document

    app.openapi = openapi
    app.add_middleware(TrimMiddleware)  # added first: innermost, so it trims after the answer
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_key=config.api_key)
    app.add_middleware(InternalErrorMiddleware)
    app.add_middleware(StatusCountMiddleware, metrics=metrics, routes=routes)
    return app


def _with_template(engine: Engine | None, load: Callable[[], Engine],
                   template: str) -> tuple[Engine | None, Callable[[], Engine]]:
    """``engine`` and ``load`` with the chat template ``template`` given to the engine's tokenizer."""
    if engine is not None:
        set_chat_template(engine.tokenizer, template)
        return engine, load

    def load_with_template() -> Engine:
        loaded = load()
        set_chat_template(loaded.tokenizer, template)
        return loaded

    return None, load_with_template


def _error_response(request: Request, error: APIError) -> JSONResponse:
    """``error`` in the envelope of the API the request's path belongs to (OpenAI, Anthropic, Ollama)."""
    return JSONResponse(error_body(request.url.path, error), status_code=error.status, headers=error.headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(request, validation_error(exc))

    @app.exception_handler(HVDError)
    async def on_hvd_error(request: Request, exc: HVDError) -> JSONResponse:
        return _error_response(request, api_error_of(exc))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = _HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request_error")
        error = APIError(exc.status_code, str(exc.detail), kind, None, None, dict(exc.headers or {}))
        return _error_response(request, error)


def serve(config: ServerConfig, log_level: str = "info") -> None:
    """Run the server until interrupted (uvicorn, one process: the engine decodes one request at a time)."""
    import uvicorn

    logger.info("serving %s on http://%s:%d/v1", config.model_name, config.host, config.port)
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=log_level)
