"""The HTTP routes: chat completions, completions, responses, models, health and metrics.

A generation request is checked in full before it is queued (a 400 names the field);
the worker then prepares and runs it (:mod:`hvd_agents.server.jobs`). The route waits
for the first step before it answers, so an error the engine finds in the request
(the prompt does not fit the context window, an unknown method) is still a 4xx with
the OpenAI envelope; a streamed reply is sent as server-sent events from then on. A
client that disconnects, while queued or while its reply is generated, stops its
generation after the current step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from hvd_agents.chat.delta_stream import CollectedReply, ReplyDelta
from hvd_agents.errors import HVDError
from hvd_agents.server.disconnect import ClientGone, until_disconnect
from hvd_agents.server.errors import APIError, api_error_of
from hvd_agents.server.jobs import ChatJob, CompletionJob, counted
from hvd_agents.server.responses import plan_response
from hvd_agents.server.responses_request import ResponsesRequest
from hvd_agents.server.schema import ChatCompletionRequest, CompletionRequest
from hvd_agents.server.shaping import (
    ChatChunks,
    CompletionChunks,
    Envelope,
    chat_completion,
    error_event,
    text_completion,
)
from hvd_agents.server.sizing import check_chat_size, check_completion_size
from hvd_agents.server.state import ServerState

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
REQUEST_ID_HEADER = "x-request-id"
# The status nginx logs for a request whose client closed the connection first.
CLIENT_CLOSED = 499


def state_of(request: Request) -> ServerState:
    return request.app.state.hvd


# Open routes, and those that need the API key when one is set (checked by
# hvd_agents.server.auth.AuthMiddleware before the body is read).
router = APIRouter()
guarded = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 ``ok`` once the model is loaded; 503 ``loading`` (with Retry-After) or ``failed`` before."""
    slot = state_of(request).slot
    if slot.state == "ready":
        return JSONResponse({"status": "ok"})
    if slot.state == "failed":
        return JSONResponse({"status": "failed", "error": slot.error}, status_code=503)
    return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": str(slot.retry_after_s)})


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> PlainTextResponse:
    """A liveness answer at the root, where clients probe a server (Claude Code sends ``HEAD /``; Ollama
    answers ``GET /`` with a line of text)."""
    return PlainTextResponse("hvd-agents is running")


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> JSONResponse:
    """The OpenAPI document (:mod:`hvd_agents.server.openapi`)."""
    return JSONResponse(request.app.openapi())


@guarded.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


@guarded.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(state_of(request))]}


@guarded.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    state = state_of(request)
    if not state.config.serves(model_id):
        raise APIError(404, f"the model {model_id!r} does not exist", "not_found_error", "model", "model_not_found")
    return _model_card(state)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.config.model_name, "object": "model", "created": state.started, "owned_by": "hvd-agents"}


@guarded.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    state = state_of(request)
    options = body.check()
    engine = state.engine_for(body.model)
    messages = body.chat_messages()
    check_chat_size(messages, engine.tokenizer, engine.context_window)
    job = ChatJob(
        engine=engine,
        messages=messages,
        tools=body.tools,
        settings=body.settings(body.max_new_tokens(), state.config.method, engine.context_window,
                               state.config.request_timeout_s),
        options=options,
        stop=body.stops_with_calls(),
        session_id=request.headers.get(SESSION_HEADER) or body.user,
        model_name=state.config.model_name,
    )
    env = Envelope("chatcmpl-", state.config.model_name)
    shaper = ChatChunks(env, body.include_usage()) if body.stream else None
    return await generate(request, state, job, env, shaper, chat_completion)


@guarded.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest) -> Response:
    state = state_of(request)
    body.check()
    engine = state.engine_for(body.model)
    prompt = body.prompt_value()
    check_completion_size(prompt, engine.tokenizer, engine.context_window)
    job = CompletionJob(
        engine=engine,
        prompt=prompt,
        settings=body.settings(body.max_tokens, state.config.method, engine.context_window,
                               state.config.request_timeout_s),
        stop=body.stops(),
        model_name=state.config.model_name,
    )
    env = Envelope("cmpl-", state.config.model_name)
    shaper = CompletionChunks(env, body.include_usage()) if body.stream else None
    return await generate(request, state, job, env, shaper, text_completion)


@guarded.post("/v1/responses")
async def responses(request: Request, body: ResponsesRequest) -> Response:
    """OpenAI's Responses API over the same generations (:mod:`hvd_agents.server.responses`)."""
    state = state_of(request)
    plan = plan_response(body, state, request.app.state.responses, request.headers.get(SESSION_HEADER))
    return await generate(request, state, plan.job, plan.env, plan.shaper, plan.shape)


async def generate(request: Request, state: ServerState, job: ChatJob | CompletionJob, env: Envelope, shaper,
                   shape) -> Response:
    """Queue ``job`` (prepared off the worker), wait for its first step, then answer whole (``shaper`` None)
    or as a stream.

    Every protocol's generation route ends here. ``shaper`` writes the stream: ``first()`` and
    ``step(delta)`` return its bytes; a shaper may declare its ``media_type`` (server-sent events when it
    does not) and an ``error(api_error)`` that writes a failure after the first byte in its protocol's
    shape (the OpenAI error event when it does not). ``shape(env, reply)`` is the whole answer's body.
    """
    arrived = time.perf_counter()
    deltas = state.queue.submit_after(lambda: counted(job.prepare(), state.metrics))
    headers = {"X-Request-ID": request.headers.get(REQUEST_ID_HEADER) or env.id}
    try:
        first = await until_disconnect(request, anext(deltas))
        if shaper is None:
            reply = CollectedReply()
            reply.add(first)
            reply = await until_disconnect(request, _collect(deltas, reply))
    except ClientGone:
        await deltas.aclose()
        return Response(status_code=CLIENT_CLOSED)
    except HVDError as exc:
        await deltas.aclose()
        raise api_error_of(exc) from exc
    except BaseException:
        await deltas.aclose()
        raise
    if shaper is None:
        state.metrics.finished(reply.summary, time.perf_counter() - arrived)
        return JSONResponse(shape(env, reply), headers=headers)
    stream = _events(state, deltas, first, shaper, arrived)
    return StreamingResponse(stream, media_type=getattr(shaper, "media_type", "text/event-stream"),
                             headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _collect(deltas: AsyncIterator[ReplyDelta], reply: CollectedReply) -> CollectedReply:
    async for delta in deltas:
        reply.add(delta)
    return reply


async def _events(state: ServerState, deltas: AsyncIterator[ReplyDelta], first: ReplyDelta, shaper,
                  arrived: float) -> AsyncIterator[bytes]:
    """The SSE body; a disconnect cancels this generator, which stops the generation."""
    try:
        delta = first
        data = shaper.first()
        while True:
            data += shaper.step(delta)
            if delta.finish_reason is not None:  # the client may leave once it has the last chunk
                state.metrics.finished(delta.summary, time.perf_counter() - arrived)
                yield data
                return
            if data:
                yield data
            delta, data = await anext(deltas), b""
    except StopAsyncIteration:  # cancelled in the worker without a last step
        return
    except HVDError as exc:
        yield _stream_error(shaper, api_error_of(exc))
    except Exception:  # the status line is sent: report the failure in the stream
        logger.exception("generation failed while streaming")
        yield _stream_error(shaper, APIError(500, "the generation failed", "server_error"))
    finally:
        await deltas.aclose()


def _stream_error(shaper, error: APIError) -> bytes:
    """A failure after the stream began, in the stream's protocol."""
    write = getattr(shaper, "error", None)
    return write(error) if write is not None else error_event(error.body())
