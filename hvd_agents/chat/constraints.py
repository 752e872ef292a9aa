"""A chat call's structure as one constraint: ``response_format``, tools, ``strict`` and ``tool_choice``.

This is the one place that turns what a chat request asks of its reply into the engine's
:class:`~hvd_agents.engine.constraint.Constraint`; the adapters, every server route and the
examples reach it through :func:`~hvd_agents.chat.request.build_chat_request`.

* ``response_format`` ``json_schema`` -> that schema (``strict: true`` refuses a keyword
  that cannot be enforced, naming it and its path; otherwise such keywords are ignored);
  ``json_object`` (or ``"json"``) -> any JSON object.
* A forced call (``tool_choice`` ``"required"`` / ``"any"`` / a tool name) -> exactly one
  call in the model's own tool-call syntax (``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``) over the declared names (or the named one), each name with its
  own argument schema.
* ``tool_choice`` ``"auto"`` with tools -> a lazy grammar: free text that never opens a
  call, or free text and then one or more valid calls; once the model writes
  ``<tool_call>``, what follows is a valid call.
* ``"none"`` -> no grammar (the reply stops before any ``<tool_call>``).
* A tool with ``"strict": true`` has its argument schema checked as a strict JSON schema
  (the refusal names the tool); the others are enforced leniently.

JSON is laid out as :func:`~hvd_agents.chat.toolcalls.render_tool_call` writes it
(``json.dumps``' separators), so keys and punctuation are text the grammar forces. An object
schema with ``properties`` that does not say ``additionalProperties`` is closed (no other
keys), as llama.cpp's and xgrammar's converters do: a reply's keys are the declared ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hvd_agents.chat.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, normalize_tool
from hvd_agents.engine import Constraint, Engine
from hvd_agents.engine.constraint import JSON_LAYOUT
from hvd_agents.errors import InvalidRequestError

ANY_OBJECT: dict[str, Any] = {"type": "object"}


OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed(schema: Any) -> Any:
    """``schema`` with every object schema that lists ``properties`` and says nothing of other keys closed
    (``"additionalProperties": false``); other schemas unchanged.

    Example:
        >>> closed({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}})
        {'type': 'object', 'properties': {'a': {'type': 'object', 'properties': {}, 'additionalProperties': False}}, \
'additionalProperties': False}
    """
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: closed(value) if key not in ("const", "enum", "default", "examples") else value
           for key, value in schema.items()}
    if isinstance(schema.get("properties"), Mapping) and not any(key in schema for key in OPEN_KEYWORDS):
        out["additionalProperties"] = False
    return out


def call_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call's body: ``{"name": NAME, "arguments": {...}}`` in that order.

    Example:
        >>> call_schema({"name": "f", "parameters": {"type": "object"}})["properties"]["name"]
        {'const': 'f'}
    """
    parameters = closed(function.get("parameters") or ANY_OBJECT)
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def calls_constraint(functions: Sequence[Mapping[str, Any]], *, lazy: bool, strict: bool) -> Constraint:
    """A grammar of tool calls over ``functions``: exactly one call, or (``lazy``) free text with none, or free
    text followed by one or more calls.

    Args:
        functions: the declared functions (normalised tool dicts) the call may name.
        lazy: ``tool_choice="auto"``: the model may answer in text; only what follows ``<tool_call>`` is held.
        strict: refuse argument-schema keywords that cannot be enforced (else they are ignored).
    """
    bodies = [call_schema(function) for function in functions]
    body = bodies[0] if len(bodies) == 1 else {"anyOf": bodies}
    body = {**body, "x-guidance": dict(JSON_LAYOUT, lenient=not strict, coerce_one_of=not strict)}
    tail = f'"\\n" %json {json.dumps(body, ensure_ascii=False)} "\\n{TOOL_CALL_CLOSE}"'
    if not lazy:
        return Constraint.lark(f'start: "{TOOL_CALL_OPEN}" call_rest\ncall_rest: {tail}\n')
    return Constraint.lark("\n".join([
        "start: TEXT | opened call_rest more*",
        f'more: "\\n{TOOL_CALL_OPEN}" call_rest',
        f"call_rest: {tail}",
        # free text that never opens a call; a call opens at the first "<tool_call>"
        f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{TOOL_CALL_OPEN}(.|\\n)*/",
        f"opened[lazy]: /(.|\\n)*{TOOL_CALL_OPEN}/",
        "",
    ]))


def json_constraint(schema: Mapping[str, Any] | None, *, strict: bool) -> Constraint:
    """A reply that is JSON valid against ``schema`` (None: any JSON object)."""
    return Constraint.json_schema(ANY_OBJECT if schema is None else closed(schema), strict=strict)


def check_strict_tools(engine: Engine, functions: Sequence[Mapping[str, Any]]) -> None:
    """Compile each ``strict`` tool's argument schema once (cached) so that a keyword that cannot be enforced
    is refused naming the tool, the keyword and its path.

    Raises:
        InvalidRequestError: ``tools[i] (NAME): the JSON schema cannot be enforced: ...``.
    """
    for index, function in enumerate(functions):
        if function.get("strict") is True and engine.grammars is not None:
            try:
                engine.grammars.check(json_constraint(function.get("parameters") or ANY_OBJECT, strict=True))
            except InvalidRequestError as exc:
                raise InvalidRequestError(f"tools[{index}] ({function['name']!r}): {exc}") from exc


def reply_constraint(engine: Engine, tools: Sequence[Mapping[str, Any]] | None, tool_choice: str | None,
                     json_schema: Mapping[str, Any] | None, json_mode: bool, json_strict: bool) -> Constraint | None:
    """The constraint of a chat reply (see the module docstring), or None.

    Args:
        engine: the engine that will run it (its grammar compiler checks strict tools).
        tools: the request's tool schemas (OpenAI shape or bare functions).
        tool_choice: the normalised ``tool_choice``: None (auto), ``"none"``, ``"required"`` or a tool name.
        json_schema: ``response_format``'s schema, or None.
        json_mode: a ``response_format`` was given.
        json_strict: its schema is strict.

    Raises:
        InvalidRequestError: a strict tool's argument schema that cannot be enforced.
    """
    functions = [normalize_tool(tool) for tool in tools or ()]
    check_strict_tools(engine, functions)
    strict_tools = all(function.get("strict") is True for function in functions)
    if functions and tool_choice not in (None, "none"):
        chosen = functions if tool_choice == "required" else [f for f in functions if f["name"] == tool_choice]
        return calls_constraint(chosen, lazy=False, strict=strict_tools)
    if json_mode:
        return json_constraint(json_schema, strict=json_strict)
    if functions and tool_choice is None:
        return calls_constraint(functions, lazy=True, strict=strict_tools)
    return None
