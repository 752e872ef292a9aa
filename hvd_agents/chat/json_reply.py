"""JSON mode: asking for a JSON reply, pre-filling it, and cutting it after its object.

* :func:`json_schema_of` reads a ``response_format``: ``"json"``,
  ``{"type": "json_object"}``, a JSON schema, or OpenAI's
  ``{"type": "json_schema", "json_schema": {"schema": ...}}``; anything else is refused.
* :class:`JsonFormat` is a checked ``response_format``: its schema and whether it is strict
  (the reply is decoded under the schema's grammar, :mod:`hvd_agents.chat.constraints`), and
  the instruction appended to the last user message (for an object schema with properties,
  the expected object with each key's description: the grammar makes the reply parse, the
  instruction tells the model what to put in it).
* :class:`VisibleReply` streams a reply's content; in JSON mode it is cut just after
  its first complete JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.toolcall_parser import JsonObjectScanner
from hvd_agents.errors import InvalidRequestError

JSON_INSTRUCTION = "Respond only with a JSON object."
JSON_KEYS_INSTRUCTION = "Respond only with a JSON object with these keys:"
JSON_SCHEMA_INSTRUCTION = "Respond only with JSON that matches this JSON schema:"


def json_schema_of(response_format: Any) -> Mapping[str, Any] | None:
    """The JSON schema of a ``response_format``, or None for plain JSON mode.

    Accepts ``"json"``, ``{"type": "json_object"}``, a JSON schema, and OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``.

    Raises:
        InvalidRequestError: anything else.
    """
    if response_format == "json":
        return None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_object":
        return None
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        inner = response_format.get("json_schema")
        if isinstance(inner, Mapping) and isinstance(inner.get("schema"), Mapping):
            return inner["schema"]
    if isinstance(response_format, Mapping) and response_format:
        return response_format
    raise InvalidRequestError(f"response_format must be 'json' or a JSON schema, got {response_format!r}")


@dataclass(frozen=True)
class JsonFormat:
    """A checked ``response_format`` (:meth:`of`).

    Attributes:
        schema: the JSON schema, or None for any JSON object.
        strict: OpenAI's ``json_schema.strict``: a schema keyword that cannot be enforced is refused
            (else it is ignored and the rest enforced).
    """

    schema: Mapping[str, Any] | None
    strict: bool = False

    @classmethod
    def of(cls, response_format: Any) -> JsonFormat:
        """Check a ``response_format`` (see :func:`json_schema_of`).

        Raises:
            InvalidRequestError: an unsupported ``response_format``.
        """
        inner = response_format.get("json_schema") if isinstance(response_format, Mapping) else None
        strict = isinstance(inner, Mapping) and inner.get("strict") is True
        return cls(json_schema_of(response_format), strict)

    def instruction(self) -> str:
        """The instruction asking for a JSON reply."""
        if self.schema is None:
            return JSON_INSTRUCTION
        properties = self.schema.get("properties")
        if self.schema.get("type", "object") == "object" and isinstance(properties, Mapping) and properties:
            shape = {key: _describe(value) for key, value in properties.items()}
            return f"{JSON_KEYS_INSTRUCTION} {json.dumps(shape, ensure_ascii=False)}"
        return f"{JSON_SCHEMA_INSTRUCTION} {json.dumps(self.schema, ensure_ascii=False)}"

    def ask(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Ask for a JSON reply at the end of the last user message (or in a closing system message)."""
        instruction = self.instruction()
        out = [dict(message) for message in messages]
        if out and out[-1].get("role") == "user":
            content = out[-1].get("content") or ""
            out[-1]["content"] = f"{content}\n\n{instruction}" if content else instruction
        else:
            out.append({"role": "system", "content": instruction})
        return out


def json_instruction(response_format: Any) -> str:
    """The instruction asking for a JSON reply (see :meth:`JsonFormat.instruction`).

    Raises:
        InvalidRequestError: an unsupported ``response_format``.
    """
    return JsonFormat.of(response_format).instruction()


def _describe(prop: Any) -> str:
    if not isinstance(prop, Mapping):
        return "value"
    for key in ("description", "type", "title"):
        if isinstance(prop.get(key), str) and prop[key]:
            return prop[key]
    return "value"


class VisibleReply:
    """The content a reply shows while it streams, as deltas: the prefix it was started with, then
    the generated text; in JSON mode, cut just after the first complete JSON object.

    Example:
        >>> reply = VisibleReply(prefix='{"a"', json_mode=True)
        >>> reply.push(": 1}"), reply.push(" trailing")
        ('{"a": 1}', '')
    """

    def __init__(self, prefix: str = "", json_mode: bool = False) -> None:
        self._pending = prefix
        self._text = ""
        self._shown = 0
        self._scanner = JsonObjectScanner() if json_mode else None

    def push(self, text: str) -> str:
        """Add generated ``text``; return what is newly visible."""
        new, self._pending = self._pending + text, ""
        self._text += new
        end = self._scanner.push(new) if self._scanner is not None else None
        visible = self._text if end is None else self._text[:end]
        delta, self._shown = visible[self._shown:], len(visible)
        return delta
