"""A Responses API ``input`` as chat messages, the shape the chat pipeline renders.

* a string is one user message;
* a message item (``{"role", "content"}``, with or without ``"type": "message"``) keeps its
  role (``developer`` is ``system``); its content is a string or text parts
  (``input_text``, ``output_text``, ``refusal``), joined as the chat template joins text parts;
* ``function_call`` items become the ``tool_calls`` of an assistant message: of the
  assistant message just before them when there is one (a reply that wrote text, then
  called), so a reply sent back renders as the prompt the model wrote it in;
* a ``function_call_output`` item is a ``tool`` message answering its ``call_id``.

Anything else (images, files, audio, reasoning items, item references, built-in tool
calls) is refused with a 400 naming it (``input[3].content[0]``, ``input[2].type``).

Example::

    turn_messages([{"role": "user", "content": "Weather in Paris?"},
                   {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                    "arguments": '{"city": "Paris"}'},
                   {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}])
    # [{"role": "user", ...}, {"role": "assistant", "content": None, "tool_calls": [...]},
    #  {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hvd_agents.server.errors import invalid

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def turn_messages(items: str | list[Any]) -> list[dict[str, Any]]:
    """The chat messages of a request's ``input``.

    Raises:
        APIError: 400 naming the item (and part) that is not supported or malformed.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise invalid(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(where, item))
        elif kind == "function_call":
            _add_call(messages, where, item)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(where, item, "call_id"),
                             "content": _text(f"{where}.output", item.get("output"))})
        else:
            raise invalid(f"input items of type {kind!r} are not supported: send messages, function_call and "
                          "function_call_output items", f"{where}.type")
    return messages


def _message(where: str, item: Mapping[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise invalid(f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}", f"{where}.role")
    return {"role": _ROLES[role], "content": _text(f"{where}.content", item.get("content"))}


def _add_call(messages: list[dict[str, Any]], where: str, item: Mapping[str, Any]) -> None:
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise invalid(f"{where}.arguments must be a string (JSON text)", f"{where}.arguments")
    call = {"id": _string(where, item, "call_id"), "type": "function",
            "function": {"name": _string(where, item, "name"), "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _string(where: str, item: Mapping[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{where}.{key} must be a non-empty string", f"{where}.{key}")
    return value


def _text(where: str, content: Any) -> str:
    """A string, or text parts joined with newlines (as the chat template joins them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or a list of text parts", where)
    texts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            raise invalid(f"content parts of type {kind!r} are not supported: the served models read text",
                          f"{where}[{number}]")
        if not isinstance(part.get(key), str):
            raise invalid(f"a {kind} part needs a string {key!r}", f"{where}[{number}].{key}")
        texts.append(part[key])
    return "\n".join(texts)
