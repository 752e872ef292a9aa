"""Errors as each API returns them: OpenAI's ``{"error": {"message", "type", "param", "code"}}``,
Anthropic's ``{"type": "error", "error": {"type", "message"}}`` on ``/v1/messages`` and Ollama's
``{"error": "..."}`` on ``/api/`` (:func:`error_body`, chosen by the request's path).

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

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's body: ``{"type": "error", "error": {"type", "message"}}``.

        The type follows the status as Anthropic's API sets it (``overloaded_error`` for a full
        queue or a loading model, which its SDK retries); a prompt over the context window
        says ``prompt is too long``, as Anthropic's does (agents compact their history on it).
        """
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        message = self.message
        if self.code == "context_length_exceeded":
            message = f"prompt is too long: {message}"
        elif self.param and self.param not in message:
            message = f"{self.param}: {message}"
        return {"type": "error", "error": {"type": kind, "message": message}}

    def ollama_body(self) -> dict[str, Any]:
        """Ollama's body: ``{"error": "..."}`` (the field at fault first, when there is one)."""
        message = self.message
        if self.param and self.param not in message:
            message = f"{self.param}: {message}"
        return {"error": message}


ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api/"
# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def error_body(path: str, error: APIError) -> dict[str, Any]:
    """The body of ``error`` in the envelope of the API that ``path`` belongs to."""
    if path.startswith(ANTHROPIC_PREFIX):
        return error.anthropic_body()
    if path.startswith(OLLAMA_PREFIX):
        return error.ollama_body()
    return error.body()


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


async def send_error(send: Callable[[MutableMapping[str, Any]], Awaitable[None]], error: APIError,
                     path: str = "") -> None:
    """Answer with ``error`` through an ASGI ``send`` (for middleware, outside the app's handlers), in the
    envelope of the API ``path`` belongs to."""
    body = json.dumps(error_body(path, error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
