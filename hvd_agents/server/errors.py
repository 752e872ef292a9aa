"""Errors as the OpenAI API returns them: ``{"error": {"message", "type", "param", "code"}}``.

Every error a caller can cause gets a 4xx status and names what was wrong (``param``
is the request field, dotted, when there is one); a 500 means a bug in the server.
The OpenAI client retries 408, 409, 429 and 5xx answers, so a caller's mistake must
never be one of those. :func:`api_error_of` maps the library's
:class:`~hvd_agents.errors.HVDError` s onto statuses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hvd_agents.errors import (
    ContextLengthError,
    HVDError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    RequestTimeoutError,
)

# A message of the chat layer that starts with the field it is about: "messages[2].content[0] must ...".
_FIELD_PATH = re.compile(r"^((?:messages|tools|tool_choice|response_format)(?:\[\d+\]|\.\w+)*)(?=[\s:,]|$)")


class APIError(Exception):
    """An error answer: HTTP status, message, OpenAI error type, field and code.

    Args:
        status: the HTTP status.
        message: what went wrong, for a person.
        type: the OpenAI error type (``invalid_request_error``, ``authentication_error``,
            ``not_found_error``, ``server_error``, ...).
        param: the request field at fault (``messages[1].content``), if any.
        code: a machine-readable code (``model_not_found``, ``queue_full``, ...), if any.
        headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 ``invalid_request_error`` about ``param``."""
    return APIError(400, message, "invalid_request_error", param, code)


def param_of(message: str) -> str | None:
    """The request field a chat-layer message names at its start (``messages[2].content``), if any."""
    found = _FIELD_PATH.match(message)
    return found.group(1) if found else None


def api_error_of(exc: HVDError) -> APIError:
    """The answer to a library error raised while preparing or running a request."""
    message = str(exc)
    if isinstance(exc, ContextLengthError):
        return invalid(message, "messages", "context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return invalid(message, param_of(message))
    if isinstance(exc, ModelNotFoundError):
        return APIError(404, message, "not_found_error", "model", "model_not_found")
    if isinstance(exc, ModelLoadError):
        return APIError(503, message, "server_error", None, "model_load_failed")
    if isinstance(exc, RequestTimeoutError):
        return APIError(504, message, "server_error", None, "timeout")
    if isinstance(exc, QueueFullError):
        return APIError(503, message, "server_error", None, "queue_full")
    return APIError(500, message, "server_error")


async def send_error(send: Callable[[MutableMapping[str, Any]], Awaitable[None]], error: APIError) -> None:
    """Answer with ``error`` through an ASGI ``send`` (for middleware, outside the app's handlers)."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
