"""``POST /v1/responses``: a Responses API request planned as a chat generation.

:func:`plan_response` checks the body (:mod:`.responses_request`), puts together the
conversation (the ``instructions``, the stored history of ``previous_response_id``
(:mod:`.responses_store`), the new ``input``), and returns the same
:class:`~hvd_agents.server.jobs.ChatJob` the chat completions route runs, so a greedy
response is token for token the chat completion of the same conversation and is
registered in the cache drafter's store alike. Only the answer's shape differs
(:mod:`.responses_shaping`). A response with ``store`` not false is kept for the next
request's ``previous_response_id`` once its reply is complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.delta_stream import CollectedReply
from hvd_agents.server.errors import invalid
from hvd_agents.server.jobs import ChatJob
from hvd_agents.server.responses_request import ResponsesRequest
from hvd_agents.server.responses_shaping import (
    Remember,
    ResponseEvents,
    ResponseHead,
    reply_message,
    response_object,
)
from hvd_agents.server.responses_store import ResponseStore
from hvd_agents.server.shaping import Envelope
from hvd_agents.server.sizing import check_chat_size
from hvd_agents.server.state import ServerState


@dataclass(frozen=True)
class ResponsePlan:
    """What the generation route runs for one Responses request.

    Attributes:
        job: the chat generation.
        env: the response's id, time and model.
        shaper: the event writer of a streamed response; None answers whole.
        shape: the whole response of a collected reply.
    """

    job: ChatJob
    env: Envelope
    shaper: ResponseEvents | None
    shape: Callable[[Envelope, CollectedReply], dict[str, Any]]


def plan_response(body: ResponsesRequest, state: ServerState, store: ResponseStore,
                  session_id: str | None) -> ResponsePlan:
    """Check ``body`` and plan its generation.

    Args:
        body: the request.
        state: the server's config, engine and queue.
        store: the stored responses (``previous_response_id``).
        session_id: the ``X-Session-ID`` header, if any (else ``user`` names the session).

    Raises:
        APIError: 400 naming the field (unsupported, malformed, unknown ``previous_response_id``,
            a conversation that cannot fit the context window); 404 for an unknown model.
    """
    options = body.check()
    engine = state.engine_for(body.model)
    turn = body.turn_messages()
    history = store.history(body.previous_response_id) if body.previous_response_id else []
    messages = body.instruction_messages() + history + turn
    if not history + turn:
        raise invalid("input is empty and continues no previous response", "input")
    check_chat_size(messages, engine.tokenizer, engine.context_window)
    config = state.config
    job = ChatJob(
        engine=engine,
        messages=messages,
        tools=body.chat_tools(),
        settings=body.settings(config.method, engine.context_window, config.request_timeout_s),
        options=options,
        stop=body.stops(),
        session_id=session_id or body.user,
        model_name=config.model_name,
    )
    env = Envelope("resp_", config.model_name)
    head = ResponseHead.of(env, _echo(body))
    remember = None if body.store is False else _remembering(store, env.id, body.previous_response_id, turn)

    def shape(_: Envelope, reply: CollectedReply) -> dict[str, Any]:
        if remember is not None:
            remember(reply)
        return response_object(head, reply)

    return ResponsePlan(job, env, ResponseEvents(head, remember) if body.stream else None, shape)


def _remembering(store: ResponseStore, response_id: str, previous_id: str | None,
                 turn: list[dict[str, Any]]) -> Remember:
    def remember(reply: CollectedReply) -> None:
        store.put(response_id, previous_id, [*turn, reply_message(reply)])

    return remember


def _echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a response repeats them."""
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.store is not False,
        "temperature": body.temperature if body.temperature is not None else 0.0,
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [],
        "text": body.text or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.metadata or {},
        "user": body.user,
        "reasoning": {"effort": None, "summary": None},
    }
