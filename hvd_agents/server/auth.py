"""API keys: with a key configured, every path but ``/``, ``/health`` and ``/openapi.json`` needs
``Authorization: Bearer <key>`` or, as Anthropic's clients send it, ``x-api-key: <key>``.

The comparison takes constant time. A missing or wrong key is a 401 in the route's
envelope (:func:`~hvd_agents.server.errors.error_body`) (``type`` ``authentication_error``, ``code`` ``invalid_api_key``), which the
OpenAI client does not retry. :class:`AuthMiddleware` checks it before anything else
reads the request, so a caller without the key cannot make the server read, parse
or size-check a body, and gets 401 whatever it sent (unknown paths included).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hvd_agents.server.errors import APIError, send_error

OPEN_PATHS = frozenset({"/", "/health", "/openapi.json"})


def check_api_key(path: str, authorization: str | None, api_key: str | None, x_api_key: str | None = None) -> None:
    """Refuse a request to ``path`` whose ``Authorization`` (bearer) and ``x-api-key`` headers do not carry
    ``api_key``.

    Raises:
        APIError: 401 when a key is configured and neither header holds it.
    """
    if api_key is None or path in OPEN_PATHS:
        return
    expected = api_key.encode()
    scheme, _, token = (authorization or "").partition(" ")
    bearer_ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)
    header_ok = x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), expected)
    if not (bearer_ok or header_ok):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                       "authentication_error", None, "invalid_api_key")


class AuthMiddleware:
    """ASGI middleware refusing HTTP requests without the key (see :func:`check_api_key`) before the app runs."""

    def __init__(self, app: Callable[..., Awaitable[None]], api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] == "http" and self.api_key is not None:
            headers = dict(scope.get("headers") or ())
            path = scope.get("path", "")
            try:
                check_api_key(path, _header(headers, b"authorization"), self.api_key, _header(headers, b"x-api-key"))
            except APIError as error:
                await send_error(send, error, path)
                return
        await self.app(scope, receive, send)


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")
