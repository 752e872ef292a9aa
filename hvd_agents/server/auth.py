"""API keys: with a key configured, every path but ``/health`` and ``/openapi.json`` needs
``Authorization: Bearer <key>``.

The comparison takes constant time. A missing or wrong key is a 401 in the OpenAI
envelope (``type`` ``authentication_error``, ``code`` ``invalid_api_key``), which the
OpenAI client does not retry. :class:`AuthMiddleware` checks it before anything else
reads the request, so a caller without the key cannot make the server read, parse
or size-check a body, and gets 401 whatever it sent (unknown paths included).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hvd_agents.server.errors import APIError, send_error

OPEN_PATHS = frozenset({"/health", "/openapi.json"})


def check_api_key(path: str, authorization: str | None, api_key: str | None) -> None:
    """Refuse a request to ``path`` whose ``Authorization`` header does not carry ``api_key``.

    Raises:
        APIError: 401 when a key is configured and the header lacks it.
    """
    if api_key is None or path in OPEN_PATHS:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                       "authentication_error", None, "invalid_api_key")


class AuthMiddleware:
    """ASGI middleware refusing HTTP requests without the key (see :func:`check_api_key`) before the app runs."""

    def __init__(self, app: Callable[..., Awaitable[None]], api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] == "http" and self.api_key is not None:
            authorization = dict(scope.get("headers") or ()).get(b"authorization")
            try:
                check_api_key(scope.get("path", ""), None if authorization is None else authorization.decode("latin-1"),
                              self.api_key)
            except APIError as error:
                await send_error(send, error)
                return
        await self.app(scope, receive, send)
