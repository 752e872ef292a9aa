"""The server's OpenAPI document (``GET /openapi.json``): what client generators and fuzzers read.

FastAPI generates the operations and the request bodies from the routes; this module
replaces what it gets wrong for this server: it declares the statuses the server
really answers (400, not FastAPI's 422, for a bad body; 401 where a key is configured;
404, 413, 503 and 504 with the OpenAI error envelope), the JSON or server-sent-event
bodies of the generation routes (chat completions, completions, responses), the text
body of ``/metrics``, and the bearer key.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hvd_agents.server.auth import OPEN_PATHS

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}
_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
_OBJECT = {"application/json": {"schema": {"type": "object"}}}
_STATUS_TEXT = {
    400: "a malformed or unsupported request; `param` names the field (`context_length_exceeded`: too long)",
    401: "the API key is missing or wrong",
    404: "an unknown model",
    413: "the body is over the server's bound",
    503: "the model is loading, or the queue is full (with Retry-After)",
    504: "the generation ran past the server's request timeout",
}
_GENERATION_ERRORS = (400, 404, 413, 503, 504)
# What each generation route answers with status 200; streamed, the events' data are chunk objects
# then "[DONE]" (completions), or typed events (responses): no one schema describes them.
_GENERATED = {
    "/v1/chat/completions": "the chat completion, whole or (stream=true) as server-sent chunks",
    "/v1/completions": "the text completion, whole or (stream=true) as server-sent chunks",
    "/v1/responses": "the response, whole or (stream=true) as server-sent events "
                     "(response.created ... response.completed)",
}


def build_openapi(app: FastAPI, keyed: bool) -> dict[str, Any]:
    """The OpenAPI document of ``app``.

    Args:
        app: the server's app (its routes).
        keyed: whether an API key is configured (then every path but the open ones
            declares 401 and the bearer scheme).
    """
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Error"] = ERROR_SCHEMA
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _fix_operation(path, method, operation, keyed)
    return schema


def _fix_operation(path: str, method: str, operation: dict[str, Any], keyed: bool) -> None:
    responses: dict[str, Any] = {}
    if path == "/health":
        responses["200"] = {"description": "the model is loaded", "content": _OBJECT}
        responses["503"] = {"description": "the model is loading (Retry-After) or failed to load", "content": _OBJECT}
    elif path == "/metrics":
        responses["200"] = {"description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}}
    elif method == "post":
        responses["200"] = {"description": _GENERATED.get(path, "the generation, whole or as server-sent events"),
                            "content": {**_OBJECT, "text/event-stream": {}}}
        responses.update(_errors(_GENERATION_ERRORS))
        operation.get("requestBody", {})["required"] = True
    else:
        responses["200"] = {"description": "OK", "content": _OBJECT}
        if "{" in path:
            responses.update(_errors((404,)))
    if keyed and path not in OPEN_PATHS:
        responses.update(_errors((401,)))
        operation["security"] = [{"bearer": []}]
    operation["responses"] = dict(sorted(responses.items()))


def _errors(statuses: tuple[int, ...]) -> dict[str, Any]:
    return {str(status): {"description": _STATUS_TEXT[status], "content": _ERROR} for status in statuses}
