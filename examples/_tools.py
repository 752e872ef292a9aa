"""Tool plumbing the examples share: string-parameter schemas and calls checked against them."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence


def string_tool(name: str, description: str, patterns: dict[str, str] | None = None, **params: str) -> dict:
    """An OpenAI-style tool schema whose parameters (name -> description) are all required strings; ``patterns``
    gives some of them a regular expression their value must match (JSON Schema ``pattern``)."""
    patterns = patterns or {}
    properties = {key: {"type": "string", "description": text} | ({"pattern": patterns[key]} if key in patterns else {})
                  for key, text in params.items()}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(params)}}}


def call_tool(functions: dict[str, Callable[..., str]], schemas: Sequence[dict], name: str, arguments: dict) -> str:
    """Execute a call by name, passing only the arguments its schema declares.

    Others are dropped, as a validating framework drops them. An unknown tool or a
    missing argument returns a JSON error for the model.
    """
    function = functions.get(name)
    if function is None:
        return json.dumps({"error": f"unknown tool {name}"})
    schema = next(t["function"]["parameters"] for t in schemas if t["function"]["name"] == name)
    try:
        return function(**{key: value for key, value in arguments.items() if key in schema["properties"]})
    except TypeError as exc:
        return json.dumps({"error": str(exc)})
