"""The server's OpenAPI document (``GET /openapi.json``): what client generators and fuzzers read.

FastAPI generates the operations and the request bodies from the routes; this module
replaces what it gets wrong for this server: it declares the statuses the server
really answers (400, not FastAPI's 422, for a bad body; 401 where a key is configured;
404, 413, 503 and 504, each in its API's error envelope: OpenAI's, Anthropic's on
``/v1/messages``, Ollama's on ``/api/``), the JSON, server-sent-event or NDJSON bodies of
the generation routes, the text body of ``/metrics``, and the keys (a bearer token, or
Anthropic's ``x-api-key`` header).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hvd_agents.server.auth import OPEN_PATHS
from hvd_agents.server.errors import ANTHROPIC_PREFIX, OLLAMA_PREFIX

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
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
    }},
}
OLLAMA_ERROR_SCHEMA: dict[str, Any] = {"type": "object", "required": ["error"],
                                       "properties": {"error": {"type": "string"}}}
_ERROR_SCHEMAS = {"Error": ERROR_SCHEMA, "AnthropicError": ANTHROPIC_ERROR_SCHEMA, "OllamaError": OLLAMA_ERROR_SCHEMA}
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
    "/v1/messages": "the message, whole or (stream=true) as server-sent events (message_start ... message_stop)",
    "/v1/messages/count_tokens": "the prompt's tokens: {\"input_tokens\": n}",
    "/api/chat": "the chat reply, as NDJSON lines (the default) or whole (stream=false)",
    "/api/generate": "the completion, as NDJSON lines (the default) or whole (stream=false)",
    "/api/show": "the model's details",
}
# What a generation route's 200 may be besides JSON.
_STREAMED = {"/v1/chat/completions": "text/event-stream", "/v1/completions": "text/event-stream",
             "/v1/responses": "text/event-stream", "/v1/messages": "text/event-stream",
             "/api/chat": "application/x-ndjson", "/api/generate": "application/x-ndjson"}


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
    schemas.update(_ERROR_SCHEMAS)
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"},
                                         "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _fix_operation(path, method, operation, keyed)
    return schema


def _fix_operation(path: str, method: str, operation: dict[str, Any], keyed: bool) -> None:
    responses: dict[str, Any] = {}
    error = _error_ref(path)
    if path == "/health":
        responses["200"] = {"description": "the model is loaded", "content": _OBJECT}
        responses["503"] = {"description": "the model is loading (Retry-After) or failed to load", "content": _OBJECT}
    elif path == "/metrics":
        responses["200"] = {"description": "Prometheus text format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}}
    elif method == "post":
        streamed = {_STREAMED[path]: {}} if path in _STREAMED else {}
        responses["200"] = {"description": _GENERATED.get(path, "the generation, whole or as server-sent events"),
                            "content": {**_OBJECT, **streamed}}
        responses.update(_errors(_GENERATION_ERRORS, error))
        operation.get("requestBody", {})["required"] = True
    else:
        responses["200"] = {"description": "OK", "content": _OBJECT}
        if "{" in path:
            responses.update(_errors((404,), error))
    if keyed and path not in OPEN_PATHS:
        responses.update(_errors((401,), error))
        operation["security"] = [{"bearer": []}, {"apiKey": []}]
    operation["responses"] = dict(sorted(responses.items()))


def _error_ref(path: str) -> str:
    """The error schema of ``path``'s API (see :func:`hvd_agents.server.errors.error_body`)."""
    if path.startswith(ANTHROPIC_PREFIX):
        return "AnthropicError"
    if path.startswith(OLLAMA_PREFIX):
        return "OllamaError"
    return "Error"


def _errors(statuses: tuple[int, ...], schema: str) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
    return {str(status): {"description": _STATUS_TEXT[status], "content": content} for status in statuses}
