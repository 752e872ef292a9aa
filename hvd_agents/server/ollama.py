"""Ollama's API: ``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``, ``/api/version``.

The generation routes check their body (:mod:`.ollama_request`) and run the same
:class:`~hvd_agents.server.jobs.ChatJob` the chat completions route runs (``/api/generate`` with
``raw: true``: the :class:`~hvd_agents.server.jobs.CompletionJob` of ``/v1/completions``), so tool
calls, ``format`` (the chat call's ``response_format``), the decoding method, the prefix cache and
the cache drafter's store behave exactly as there; only the answer's shape differs
(:mod:`.ollama_shaping`). Errors are Ollama's ``{"error": "..."}``
(:meth:`~hvd_agents.server.errors.APIError.ollama_body`).

``/api/generate`` with an empty prompt loads the model and answers ``done_reason: "load"``, as
Ollama does. ``/api/tags`` lists the served model, ``/api/show`` describes it (its chat template,
context window and capabilities), ``/api/version`` says which version of Ollama's API this server
follows.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from hvd_agents.server.jobs import ChatJob, CompletionJob
from hvd_agents.server.ollama_request import ChatBody, GenerateBody
from hvd_agents.server.ollama_shaping import NDJSON, OllamaLines, chat_reply, created_at, generate_reply
from hvd_agents.server.routes import SESSION_HEADER, generate, state_of
from hvd_agents.server.shaping import Envelope
from hvd_agents.server.sizing import check_chat_size, check_completion_size
from hvd_agents.server.state import ServerState

OLLAMA_API_VERSION = "0.12.0"
"""The version of Ollama's API these routes follow (``/api/version``)."""

ollama_router = APIRouter()


class ShowBody(BaseModel):
    """The body of ``POST /api/show``: the model (``name`` is its older spelling)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


@ollama_router.post("/api/chat")
async def chat(request: Request, body: ChatBody) -> Response:
    """A chat reply, as NDJSON lines unless ``stream`` is false."""
    state = state_of(request)
    options = body.check()
    engine = state.engine_for(body.model_name())
    messages = body.chat_messages()
    check_chat_size(messages, engine.tokenizer, engine.context_window)
    job = ChatJob(engine=engine, messages=messages, tools=body.tools or None,
                  settings=body.settings(state.config.method, engine.context_window, state.config.request_timeout_s),
                  options=options, stop=body.stops(), session_id=request.headers.get(SESSION_HEADER),
                  model_name=state.config.model_name)
    env = Envelope("", state.config.model_name)
    return await generate(request, state, job, env, OllamaLines(env) if body.stream else None, chat_reply)


@ollama_router.post("/api/generate")
async def generate_text(request: Request, body: GenerateBody) -> Response:
    """A completion of ``prompt`` (through the chat template unless ``raw``), as NDJSON lines unless
    ``stream`` is false."""
    state = state_of(request)
    options = body.check()
    engine = state.engine_for(body.model_name())
    env = Envelope("", state.config.model_name)
    if not body.prompt and not body.system:
        return _loaded(env, body.stream)
    settings = body.settings(state.config.method, engine.context_window, state.config.request_timeout_s)
    if body.raw:
        check_completion_size(body.prompt, engine.tokenizer, engine.context_window)
        job = CompletionJob(engine=engine, prompt=body.prompt, settings=settings, stop=body.stops(),
                            model_name=state.config.model_name)
    else:
        messages = body.chat_messages()
        check_chat_size(messages, engine.tokenizer, engine.context_window)
        job = ChatJob(engine=engine, messages=messages, tools=None, settings=settings, options=options,
                      stop=body.stops(), session_id=request.headers.get(SESSION_HEADER),
                      model_name=state.config.model_name)
    shaper = OllamaLines(env, chat=False) if body.stream else None
    return await generate(request, state, job, env, shaper, generate_reply)


def _loaded(env: Envelope, stream: bool) -> Response:
    """The answer to an empty prompt: the model is loaded, nothing is generated."""
    body = {"model": env.model, "created_at": created_at(), "response": "", "done": True, "done_reason": "load"}
    if stream:
        return Response(json.dumps(body) + "\n", media_type=NDJSON)
    return JSONResponse(body)


@ollama_router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    """The served model, as Ollama lists its local models."""
    state = state_of(request)
    return {"models": [{"name": state.config.model_name, "model": state.config.model_name,
                        "modified_at": _started(state), "size": 0, "digest": "", "details": _details(state)}]}


@ollama_router.post("/api/show")
async def show(request: Request, body: ShowBody) -> dict[str, Any]:
    """The served model's details, chat template, context window and capabilities (404 for another model)."""
    state = state_of(request)
    name = (body.model or body.name or "").removesuffix(":latest")
    engine = state.engine_for(name)
    template = getattr(engine.tokenizer, "chat_template", None) or ""
    return {"modelfile": "", "parameters": "", "template": template if isinstance(template, str) else "",
            "details": _details(state), "model_info": {"general.context_length": engine.context_window},
            "capabilities": ["completion", "tools"], "modified_at": _started(state)}


@ollama_router.get("/api/version")
async def version() -> dict[str, str]:
    """The version of Ollama's API these routes follow."""
    return {"version": OLLAMA_API_VERSION}


def _details(state: ServerState) -> dict[str, Any]:
    model = state.config.model or ""
    return {"parent_model": "", "format": "gguf" if model.endswith(".gguf") else "safetensors", "family": "",
            "families": None, "parameter_size": "", "quantization_level": ""}


def _started(state: ServerState) -> str:
    return datetime.fromtimestamp(state.started, timezone.utc).isoformat().replace("+00:00", "Z")
