"""A bound on request bodies: larger ones are refused with 413 before any parsing.

An ASGI middleware: a ``Content-Length`` over the bound is refused at once; a body
sent without one (chunked) is read up to the bound and refused as soon as it
passes it. An accepted body is handed to the app as it was received; after it, the
app's ``receive`` is the server's own, so a client's disconnect still reaches it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hvd_agents.server.errors import APIError, send_error

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimitMiddleware:
    """Refuse HTTP request bodies over ``max_bytes`` with a 413 in the OpenAI envelope."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send, scope.get("path", ""))
            return
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(send, scope.get("path", ""))
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, path: str) -> None:
        await send_error(send, APIError(413, f"request body larger than {self.max_bytes} bytes",
                                        "invalid_request_error", None, "request_too_large"), path)
