"""What a request's output must match: a JSON schema, a regular expression or a grammar.

A :class:`Constraint` is part of the distribution being decoded, never of the drafter: at
every position, plain step or draft row, the target's logits are masked by the grammar's
state after the tokens before that position (:mod:`hvd_agents.engine.grammar`). It is a
plain value (kind + source), checked for shape on construction and compiled by the
engine that runs it, once per distinct grammar (compiled grammars are cached).

Kinds:

* ``"json_schema"``: a JSON schema (a dict). ``strict=True`` refuses a schema keyword the
  grammar engine cannot enforce (the error names the keyword and its path); ``strict=False``
  ignores such keywords and enforces the rest. JSON is written compactly with ``", "`` and
  ``": "`` as separators (``json.dumps``' layout), so keys and punctuation are forced text.
* ``"regex"``: a regular expression the whole output matches (Rust ``regex`` syntax).
* ``"lark"``: a grammar in llguidance's Lark syntax (``%json {...}`` inlines a schema).
* ``"gbnf"``: a llama.cpp GBNF grammar, converted to Lark.

Example:
    >>> c = Constraint.json_schema({"type": "object", "properties": {"city": {"type": "string"}}})
    >>> c.kind, c.strict
    ('json_schema', True)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hvd_agents.errors import InvalidRequestError

KINDS = ("json_schema", "regex", "lark", "gbnf")
# The largest grammar source accepted (characters): a bound on what one request makes the
# grammar engine compile; real schemas and tool sets are far smaller.
MAX_SOURCE_CHARS = 1_000_000
# JSON's layout under a schema: json.dumps' separators and no other whitespace.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """A request's output constraint (see the module docstring).

    Attributes:
        kind: one of :data:`KINDS`.
        source: the schema as canonical JSON text (``json_schema``), or the regex / grammar text.
        strict: ``json_schema`` only: refuse (True) or ignore (False) keywords that cannot be enforced.

    Raises:
        InvalidRequestError: an unknown kind, an empty or oversized source, or a schema that is
            not a JSON object (raised on construction).
    """

    kind: str
    source: str
    strict: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"constraint kind must be one of {list(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise InvalidRequestError(f"a {self.kind} constraint needs a non-empty source")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise InvalidRequestError(f"the {self.kind} constraint has {len(self.source)} characters; "
                                      f"at most {MAX_SOURCE_CHARS} are accepted")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool, *, strict: bool = True) -> Constraint:
        """Output that is JSON valid against ``schema`` (``True`` or ``{}``: any JSON value).

        Raises:
            InvalidRequestError: ``schema`` is not a JSON object (or a boolean), or does not serialise.
        """
        if schema is True:
            schema = {}
        if not isinstance(schema, Mapping):
            raise InvalidRequestError(f"a JSON schema must be an object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema, ensure_ascii=False, sort_keys=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"the JSON schema does not serialise as JSON: {exc}") from exc
        return cls("json_schema", text, strict)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Output that matches ``pattern`` whole."""
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        """Output in the language of a llguidance Lark ``grammar`` (its ``start`` rule)."""
        return cls("lark", grammar)

    @classmethod
    def gbnf(cls, grammar: str) -> Constraint:
        """Output in the language of a llama.cpp GBNF ``grammar`` (its ``root`` rule)."""
        return cls("gbnf", grammar)

    def schema(self) -> dict[str, Any]:
        """The JSON schema of a ``json_schema`` constraint."""
        if self.kind != "json_schema":
            raise ValueError(f"a {self.kind} constraint has no JSON schema")
        return json.loads(self.source)


def keyword_paths(schema: Any, keyword: str, value: Any = None, path: str = "") -> Iterator[str]:
    """JSON pointers to where ``keyword`` occurs as a key in ``schema`` (with ``value`` when given).

    Used to name where an unsupported keyword sits in a refused schema.

    Example:
        >>> list(keyword_paths({"properties": {"a": {"not": {}}}, "not": {"type": "string"}}, "not"))
        ['/properties/a/not', '/not']
    """
    if isinstance(schema, Mapping):
        for key, item in schema.items():
            here = f"{path}/{_escape(str(key))}"
            yield from keyword_paths(item, keyword, value, here)
            if key == keyword and (value is None or item == value):
                yield here
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from keyword_paths(item, keyword, value, f"{path}/{index}")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
