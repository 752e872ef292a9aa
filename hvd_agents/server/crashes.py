"""A bug's answer: a 500 in the OpenAI envelope, counted, logged once, the connection kept usable.

Starlette answers an unhandled exception from its outermost layer, outside every
middleware (so the status counter never saw the 500), then re-raises it to the
server, which logs it a second time and drops the connection. This middleware sits
inside the counter (:func:`hvd_agents.server.app.create_app`): it logs the exception
once, answers 500 itself (or ends an answer that had already started), and raises
nothing, so the server keeps the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hvd_agents.server.errors import APIError, send_error

logger = logging.getLogger(__name__)


class InternalErrorMiddleware:
    """ASGI middleware turning an exception that escaped the app into a 500 (see the module docstring)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            logger.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await send_error(send, APIError(500, f"internal error: {type(exc).__name__}", "server_error"),
                                 scope.get("path", ""))
                return
            try:  # the status line is out: end the body so the connection stays usable
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:
                logger.debug("could not end the answer after the error", exc_info=True)
