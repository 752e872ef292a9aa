"""An Anthropic Messages API conversation (``system`` + ``messages``) as chat messages, the shape the chat
pipeline renders.

* ``system`` is a string or text blocks (``cache_control`` accepted, as on every block), joined with
  newlines into one system message; a ``system`` message inside ``messages`` (Claude Code sends
  them mid-conversation) is a system message where it stands;
* a user message's ``text`` blocks are its content; each ``tool_result`` block
  (``{"tool_use_id", "content", "is_error"}``) is a ``tool`` message answering its call, placed
  before the message's text (Anthropic puts the results of a turn's calls first); a result with
  ``is_error`` reads ``Error: <content>``, so the model sees that the call failed;
* an assistant message's ``text`` blocks are its content and its ``tool_use`` blocks
  (``{"id", "name", "input"}``) its ``tool_calls`` (``input`` written as JSON); ``thinking`` and
  ``redacted_thinking`` blocks are dropped (the served models do not reason);
* anything else (``image``, ``document``, ``search_result``, server tool blocks, ...) is refused
  with a 400 naming the block (``messages[2].content[0]``): the served models read text.

**Claude Code's billing header.** Claude Code (2.1.36 and later) sends as its first system block a
line ``x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=<5 hex>;`` whose ``cch``
changes with every request. Kept, it would make every prompt differ from its first tokens and no
prefix would ever be reused; :func:`strip_billing_header` drops it before the conversation is
rendered, so it reaches neither the prefix cache nor the cache drafter's store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from hvd_agents.server.errors import invalid

BILLING_HEADER = re.compile(r"^\s*x-anthropic-billing-header:[^\n]*(\n|$)", re.IGNORECASE)
"""The billing header line Claude Code writes at the start of its first system block."""

_REASONING_BLOCKS = ("thinking", "redacted_thinking")
_REFUSED_NAMES = {"image": "images", "document": "documents (PDF, text files)", "search_result": "search results",
                  "container_upload": "container uploads"}


def strip_billing_header(text: str) -> str:
    """``text`` without a leading ``x-anthropic-billing-header:`` line (Claude Code's per-request value)."""
    return BILLING_HEADER.sub("", text, count=1)


def system_text(system: str | list[Any] | None) -> str | None:
    """The system prompt as one text (text blocks joined with newlines), the billing header dropped.

    Raises:
        APIError: 400 naming a block that is not text.
    """
    if system is None:
        return None
    if isinstance(system, str):
        return strip_billing_header(system) or None
    texts = []
    for number, block in enumerate(system):
        where = f"system[{number}]"
        if not isinstance(block, Mapping) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise invalid(f"{where}: system blocks must be text blocks, got {kind!r}", where)
        text = _string(where, block, "text")
        if number == 0:
            text = strip_billing_header(text)
            if not text.strip():
                continue
        texts.append(text)
    return "\n".join(texts) or None


def chat_messages(system: str | list[Any] | None, messages: list[Any]) -> list[dict[str, Any]]:
    """The chat messages of a Messages API request (the system prompt first).

    Raises:
        APIError: 400 naming the message or block that is malformed or not supported.
    """
    out: list[dict[str, Any]] = []
    text = system_text(system)
    if text is not None:
        out.append({"role": "system", "content": text})
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise invalid(f"{where} must be an object", where)
        role = message.get("role")
        if role == "user":
            out += _user(where, message.get("content"))
        elif role == "assistant":
            out.append(_assistant(where, message.get("content")))
        elif role == "system":  # a system message in the conversation, as Claude Code sends them
            out.append({"role": "system", "content": _system_message(where, message.get("content"))})
        else:
            raise invalid(f"{where}.role must be 'user', 'assistant' or 'system', got {role!r}", f"{where}.role")
    return out


def _blocks(where: str, content: Any) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    for number, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise invalid(f"{where}.content[{number}] must be a content block with a type", f"{where}.content[{number}]")
    return content


def _system_message(where: str, content: Any) -> str:
    texts = []
    for number, block in enumerate(_blocks(where, content)):
        at = f"{where}.content[{number}]"
        if block["type"] != "text":
            _refuse(at, block["type"])
        texts.append(_string(at, block, "text"))
    return "\n".join(texts)


def _user(where: str, content: Any) -> list[dict[str, Any]]:
    results, texts = [], []
    for number, block in enumerate(_blocks(where, content)):
        at = f"{where}.content[{number}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_string(at, block, "text"))
        elif kind == "tool_result":
            results.append(_tool_result(at, block))
        else:
            _refuse(at, kind)
    if not texts and results:
        return results
    return [*results, {"role": "user", "content": "\n".join(texts)}]


def _tool_result(where: str, block: Mapping[str, Any]) -> dict[str, Any]:
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for number, part in enumerate(content):
            at = f"{where}.content[{number}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text":
                _refuse(at, kind)
            texts.append(_string(at, part, "text"))
        content = "\n".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise invalid(f"{where}.content must be a string or text blocks", f"{where}.content")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": _string(where, block, "tool_use_id"), "content": content}


def _assistant(where: str, content: Any) -> dict[str, Any]:
    texts, calls = [], []
    for number, block in enumerate(_blocks(where, content)):
        at = f"{where}.content[{number}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_string(at, block, "text"))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, Mapping):
                raise invalid(f"{at}.input must be an object", f"{at}.input")
            calls.append({"id": _string(at, block, "id"), "type": "function",
                          "function": {"name": _string(at, block, "name"), "arguments": json.dumps(arguments)}})
        elif kind not in _REASONING_BLOCKS:
            _refuse(at, kind)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _refuse(where: str, kind: Any) -> None:
    what = _REFUSED_NAMES.get(kind, f"{kind!r} blocks") if isinstance(kind, str) else "blocks without a type"
    raise invalid(f"{where}: {what} are not supported: the served model reads text", where)


def _string(where: str, block: Mapping[str, Any], key: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise invalid(f"{where}.{key} must be a string", f"{where}.{key}")
    return value
