"""Hermes-style tool calls: the project's tool-call format.

Contract:

* A call is rendered as ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``
  (``json.dumps`` with ``ensure_ascii=False``; argument keys keep the caller's order).
* :func:`parse_tool_calls` splits a model reply into its content (the text outside
  tool-call blocks, stripped) and its calls. It never raises on model output: a
  block with bad JSON, no name, or arguments that are not an object, and an
  unterminated final block (generation cut short) become :class:`InvalidToolCall` s.
  Arguments given as a JSON string holding an object are decoded. Reading is
  :mod:`hvd_agents.chat.toolcall_parser`'s (the one parser of the grammar, whole or
  streamed); its types are re-exported here.
* :func:`render_tools_system_block` renders tool schemas (OpenAI shape, or bare
  function dicts) as the Hermes system-prompt block, one JSON line per tool. A
  schema needs a non-empty string name and, when it has ``parameters``, a JSON
  schema object (``type`` ``"object"`` when given); two tools may not share a name.
  Each refusal is an :class:`~hvd_agents.errors.InvalidRequestError` naming the tool.
* Call ids are ``call_`` + 24 hex characters from a uuid4 unless the block gives one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hvd_agents.chat.toolcall_parser import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    InvalidToolCall,
    ParsedOutput,
    ToolCall,
    new_call_id,
    parse_tool_calls,
)
from hvd_agents.errors import InvalidRequestError

logger = logging.getLogger(__name__)

TOOLS_PREAMBLE = (
    "You may call one or more functions to assist with the user query. "
    "You are provided with function signatures within <tools></tools> XML tags:"
)
TOOLS_CALL_INSTRUCTION = (
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:"
)
TOOLS_CALL_EXAMPLE = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "InvalidToolCall",
    "ParsedOutput",
    "ToolCall",
    "check_unicode",
    "forced_call_prefix",
    "named_call_prefix",
    "new_call_id",
    "normalize_tool",
    "parse_tool_calls",
    "render_raw_tool_call",
    "render_tool_call",
    "render_tools_system_block",
    "tool_list",
]


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """Render one call as a Hermes ``<tool_call>`` block.

    Args:
        name: the function name.
        arguments: the arguments object; its key order is kept.

    Returns:
        ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
    """
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def forced_call_prefix(tool_choice: str | None, tools: Sequence[Mapping[str, Any]] = ()) -> str:
    """The start of the assistant turn that forces a tool call (OpenAI ``tool_choice``).

    Args:
        tool_choice: ``None``, ``"auto"`` or ``"none"``: nothing is forced;
            ``"required"`` or ``"any"``: some tool call; a tool name: that tool.
        tools: the available tools, to check a named choice against.

    Returns:
        ``""``, ``"<tool_call>\n"``, or ``'<tool_call>\n{"name": "NAME", "arguments": '``.

    Raises:
        InvalidRequestError: a named tool that is not among ``tools``.
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    if tool_choice in ("required", "any"):
        return f"{TOOL_CALL_OPEN}\n"
    names = [normalize_tool(tool)["name"] for tool in tools]
    if tool_choice not in names:
        raise InvalidRequestError(f"tool_choice {tool_choice!r} names no available tool (tools: {names})")
    return named_call_prefix(tool_choice)


def render_raw_tool_call(name: str, arguments: str) -> str:
    """Render a call whose arguments are not valid JSON with their text as it is.

    Args:
        name: the function name.
        arguments: the arguments' text (e.g. a call cut short: ``'{"city": "Par'``).

    Returns:
        ``<tool_call>\n{"name": ..., "arguments": ARGUMENTS}\n</tool_call>``, laid out as
        :func:`render_tool_call` lays out a valid call.
    """
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'


def named_call_prefix(name: str) -> str:
    """The opening of a call to ``name``, up to its arguments: ``'<tool_call>\n{"name": "NAME", "arguments": '``."""
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '


def normalize_tool(tool: Mapping[str, Any]) -> dict:
    """The function dict of a tool schema.

    Args:
        tool: ``{"type": "function", "function": {...}}`` or a bare function dict
            ``{"name": ..., "description": ..., "parameters": ...}``.

    Returns:
        The function dict (a shallow copy, keys in the given order).

    Raises:
        InvalidRequestError: not a mapping, no non-empty string ``name``, or
            ``parameters`` that is not a JSON schema object.
    """
    if not isinstance(tool, Mapping):
        raise InvalidRequestError(f"tool schema must be an object, got {type(tool).__name__}")
    if "function" in tool and tool.get("type", "function") != "function":
        raise InvalidRequestError(f"unsupported tool type {tool.get('type')!r} (only 'function')")
    function = tool.get("function") if "function" in tool else tool
    if not isinstance(function, Mapping):
        raise InvalidRequestError("tool schema 'function' must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("tool schema has no function name")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise InvalidRequestError(
            f"tool {name!r}: parameters must be a JSON schema object, got {type(parameters).__name__}"
        )
    if parameters is not None and parameters.get("type", "object") != "object":
        raise InvalidRequestError(
            f"tool {name!r}: parameters must be a JSON schema of type 'object', got type {parameters.get('type')!r}"
        )
    return dict(function)


def check_unicode(where: str, text: str) -> None:
    """Refuse text that cannot be encoded as UTF-8 (a lone surrogate, e.g. from a ``"\\ud800"`` JSON escape).

    Raises:
        InvalidRequestError: naming ``where`` and the position of the first bad character.
    """
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{where} holds text that is not valid Unicode: {text[exc.start]!r} at position {exc.start} ({exc.reason})"
        ) from None


def tool_list(tools: Any) -> list[Any]:
    """``tools`` as a list (None: empty).

    Raises:
        InvalidRequestError: ``tools`` is not a list (a string, a single schema, ...).
    """
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidRequestError(f"tools must be a list of tool schemas, got {type(tools).__name__}")
    return list(tools)


def render_tools_system_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """Render tool schemas as the Hermes system-prompt block.

    Args:
        tools: OpenAI-shape tool schemas or bare function dicts.

    Returns:
        The instruction paragraph, ``<tools>``, one JSON line per tool,
        ``</tools>``, then the call-format instruction and example.

    Raises:
        InvalidRequestError: ``tools`` is not a list, a schema is invalid, or two
            schemas have one name (the message names the index).
    """
    lines = []
    seen: dict[str, int] = {}
    for index, tool in enumerate(tool_list(tools)):
        try:
            function = normalize_tool(tool)
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"tools[{index}]: {exc}") from exc
        name = function["name"]
        if name in seen:
            raise InvalidRequestError(f"tools[{index}]: duplicate tool name {name!r} (also tools[{seen[name]}])")
        seen[name] = index
        try:
            line = json.dumps(function, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"tools[{index}]: tool {name!r} is not JSON-serializable: {exc}") from None
        check_unicode(f"tools[{index}]", line)
        lines.append(line)
    return "\n".join([TOOLS_PREAMBLE, "<tools>", *lines, "</tools>", "", TOOLS_CALL_INSTRUCTION, TOOLS_CALL_EXAMPLE])
