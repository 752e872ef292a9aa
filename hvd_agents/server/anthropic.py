"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

:func:`plan_message` checks the body (:mod:`.anthropic_request`), turns the conversation into
chat messages (:mod:`.anthropic_input`: Claude Code's per-request billing header dropped, so
consecutive requests share their prefix) and returns the same
:class:`~hvd_agents.server.jobs.ChatJob` the chat completions route runs: tool calls, tool choice,
the decoding method, the prefix cache and the cache drafter's store serve this route exactly as
they serve ``/v1/chat/completions``, and a greedy message is token for token the chat completion
of the same conversation. Only the answer's shape differs (:mod:`.anthropic_shaping`); errors
have Anthropic's envelope (:meth:`~hvd_agents.server.errors.APIError.anthropic_body`).

``count_tokens`` renders and tokenizes the conversation as a generation would (without
registering it anywhere) and answers ``{"input_tokens": n}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from hvd_agents.chat.delta_stream import CollectedReply
from hvd_agents.chat.render import encode_prompt
from hvd_agents.errors import InvalidRequestError
from hvd_agents.server.anthropic_request import CountTokensRequest, MessagesRequest
from hvd_agents.server.anthropic_shaping import MessageEvents, message_object
from hvd_agents.server.errors import invalid, param_of
from hvd_agents.server.jobs import ChatJob
from hvd_agents.server.routes import SESSION_HEADER, generate, state_of
from hvd_agents.server.shaping import Envelope
from hvd_agents.server.sizing import check_chat_size
from hvd_agents.server.state import ServerState

anthropic_router = APIRouter()


@dataclass(frozen=True)
class MessagePlan:
    """What the generation route runs for one Messages request.

    Attributes:
        job: the chat generation.
        env: the message's id and model.
        shaper: the event writer of a streamed message; None answers whole.
        shape: the whole message of a collected reply.
    """

    job: ChatJob
    env: Envelope
    shaper: MessageEvents | None
    shape: Callable[[Envelope, CollectedReply], dict[str, Any]]


def plan_message(body: MessagesRequest, state: ServerState, session_id: str | None) -> MessagePlan:
    """Check ``body`` and plan its generation.

    Args:
        body: the request.
        state: the server's config, engine and queue.
        session_id: the ``X-Session-ID`` header, if any (else ``metadata.user_id`` names the session).

    Raises:
        APIError: 400 naming the field (unsupported, malformed, a conversation that cannot fit the
            context window); 404 for an unknown model; 503 while the model loads.
    """
    options = body.check()
    engine = state.engine_for(body.model)
    messages = body.chat_messages()
    check_chat_size(messages, engine.tokenizer, engine.context_window)
    config = state.config
    job = ChatJob(
        engine=engine,
        messages=messages,
        tools=body.chat_tools(),
        settings=body.settings(config.method, config.request_timeout_s),
        options=options,
        stop=body.stops(),
        session_id=session_id or body.session_id(),
        model_name=config.model_name,
    )
    env = Envelope("msg_", config.model_name)
    stops = tuple(body.stop_sequences or ())

    def shape(env: Envelope, reply: CollectedReply) -> dict[str, Any]:
        return message_object(env, reply, stops)

    return MessagePlan(job, env, MessageEvents(env, stops) if body.stream else None, shape)


@anthropic_router.post("/v1/messages")
async def messages(request: Request, body: MessagesRequest) -> Response:
    """Anthropic's Messages API over the chat generations."""
    state = state_of(request)
    plan = plan_message(body, state, request.headers.get(SESSION_HEADER))
    return await generate(request, state, plan.job, plan.env, plan.shaper, plan.shape)


@anthropic_router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, body: CountTokensRequest) -> dict[str, int]:
    """The prompt tokens of a Messages request: ``{"input_tokens": n}``."""
    state = state_of(request)
    tools = body.chat_tools()
    engine = state.engine_for(body.model)
    messages = body.chat_messages()
    check_chat_size(messages, engine.tokenizer, engine.context_window)
    if engine.tokenizer is None:
        raise invalid("counting tokens needs a model with a tokenizer", "model")
    try:
        ids = await run_in_threadpool(encode_prompt, engine.tokenizer, messages, tools)
    except InvalidRequestError as exc:
        raise invalid(str(exc), param_of(str(exc))) from exc
    return {"input_tokens": len(ids)}
