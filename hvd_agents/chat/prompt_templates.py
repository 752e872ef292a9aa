"""Prompt templates tuned for cache reuse, and the canonical tool-schema transform.

Contract:

* Templates are files in the top-level ``templates/`` directory of the project,
  found from a source checkout and an editable install; a wheel carries a copy as
  ``hvd_agents/templates/`` (setup.py's build hook), found from an installed
  package. ``$HVD_AGENTS_TEMPLATES`` points at another directory of templates.
* A template file is ``<name>.txt`` or ``<name>.md`` and starts with a front matter
  between two ``---`` lines holding ``key: value`` lines (``name``, ``kind``,
  ``purpose``); the rest of the file is the template text.
* :func:`load_template` returns a :class:`Template`; an unknown name raises
  :class:`~hvd_agents.errors.InvalidRequestError` listing the available names.
* :func:`canonicalize_tools` sorts tools by name and orders every schema's keys
  canonically (deterministic and idempotent; see ``templates/tool-schemas-canonical.md``).
* :func:`apply_system_template` puts a template's text at the start of a
  conversation's system prompt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvd_agents.chat.toolcalls import normalize_tool
from hvd_agents.errors import HVDError, InvalidRequestError

TEMPLATES_ENV = "HVD_AGENTS_TEMPLATES"
_SUFFIXES = (".txt", ".md")
FUNCTION_KEY_ORDER = ("name", "description", "parameters")
SCHEMA_KEY_ORDER = ("type", "description", "enum", "items", "properties", "required")


@dataclass(frozen=True)
class Template:
    """A prompt template.

    Attributes:
        name: its name (the file stem).
        kind: ``"system-prompt"`` (text to put in a system message) or ``"document"``.
        purpose: what it is for, one sentence.
        text: the template text (front matter removed, stripped).
        path: the file it was read from.
    """

    name: str
    kind: str
    purpose: str
    text: str
    path: Path


def templates_dir() -> Path:
    """The templates directory: ``$HVD_AGENTS_TEMPLATES``, else the installed package's copy, else
    ``<repo root>/templates``."""
    explicit = os.environ.get(TEMPLATES_ENV)
    if explicit:
        return Path(explicit).expanduser()
    package = Path(__file__).resolve().parents[1]  # hvd_agents/
    installed = package / "templates"  # a wheel carries them as package data (setup.py)
    return installed if installed.is_dir() else package.parent / "templates"


def _template_files() -> dict[str, Path]:
    directory = templates_dir()
    if not directory.is_dir():
        raise HVDError(f"templates directory {directory} not found (set ${TEMPLATES_ENV} to a copy of templates/)")
    return {p.stem: p for p in sorted(directory.iterdir()) if p.is_file() and p.suffix in _SUFFIXES}


def available_templates() -> tuple[str, ...]:
    """Names of the available templates, sorted."""
    return tuple(sorted(_template_files()))


def load_template(name: str) -> Template:
    """Load a template by name.

    Args:
        name: e.g. ``"agent-system"`` or ``"tool-schemas-canonical"``.

    Raises:
        InvalidRequestError: no template has that name (the message lists the available ones).
        HVDError: the templates directory is missing, or the file has a malformed front matter.
    """
    files = _template_files()
    path = files.get(name)
    if path is None:
        raise InvalidRequestError(f"unknown template {name!r}; available: {', '.join(sorted(files)) or '(none)'}")
    meta, text = _split_front_matter(path, path.read_text(encoding="utf-8"))
    return Template(meta.get("name", name), meta.get("kind", "document"), meta.get("purpose", ""), text, path)


def _split_front_matter(path: Path, raw: str) -> tuple[dict[str, str], str]:
    """``(front matter, body)`` of a template file; no front matter gives an empty dict."""
    lines = raw.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, raw.strip()
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise HVDError(f"template {path} has an unterminated front matter (no closing '---')") from None
    meta: dict[str, str] = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(":")
        if not sep:
            raise HVDError(f"template {path}: front-matter line {line!r} is not 'key: value'")
        meta[key.strip()] = value.strip()
    return meta, "\n".join(lines[end + 1 :]).strip()


def canonicalize_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict]:
    """Tools sorted by name, every schema's keys in canonical order.

    Functions: ``name, description, parameters``, then other keys alphabetically.
    JSON schemas (recursively): ``type, description, enum, items, properties,
    required``, then others alphabetically; property names keep their given order
    (it is the argument order of the calls) and ``required`` is kept as given.
    The input is not modified; the shape of each tool (OpenAI wrapper or bare
    function dict) is kept.

    Raises:
        InvalidRequestError: a tool has no function name (see ``normalize_tool``).
    """
    out = []
    for tool in tools or ():
        function = _ordered(normalize_tool(tool), FUNCTION_KEY_ORDER)
        if "parameters" in function:
            function["parameters"] = _canonical_schema(function["parameters"])
        wrapped = "function" in tool
        out.append({"type": "function", "function": function} if wrapped else function)
    return sorted(out, key=lambda t: normalize_tool(t)["name"])


def _ordered(mapping: Mapping[str, Any], first: Sequence[str]) -> dict:
    """A copy of ``mapping`` with the keys of ``first`` first (in that order), then the rest sorted."""
    head = [key for key in first if key in mapping]
    tail = sorted((key for key in mapping if key not in first), key=str)
    return {key: mapping[key] for key in head + tail}


def _canonical_schema(schema: Any) -> Any:
    """A JSON schema with canonical key order, recursively (non-mappings are returned as they are)."""
    if not isinstance(schema, Mapping):
        return schema
    out = _ordered(schema, SCHEMA_KEY_ORDER)
    properties = out.get("properties")
    if isinstance(properties, Mapping):
        out["properties"] = {name: _canonical_schema(sub) for name, sub in properties.items()}
    if "items" in out:
        items = out["items"]
        out["items"] = [_canonical_schema(s) for s in items] if isinstance(items, list) else _canonical_schema(items)
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [_canonical_schema(s) for s in out[key]]
    if isinstance(out.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _canonical_schema(out["additionalProperties"])
    return out


def apply_system_template(messages: Sequence[Mapping[str, Any]], template: Template) -> list[dict]:
    """The conversation with ``template.text`` at the start of its system prompt.

    A leading system message gets the template text, a blank line, then its own
    content; without one, a system message holding the template text is inserted.
    Other messages are shallow-copied unchanged.
    """
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        content = out[0].get("content")
        own = content if isinstance(content, str) else ""
        if isinstance(content, list):
            own = "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        out[0]["content"] = f"{template.text}\n\n{own}" if own else template.text
    else:
        out.insert(0, {"role": "system", "content": template.text})
    return out
