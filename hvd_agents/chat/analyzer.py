"""The prompt-structure analyzer: a rendered prompt cut into typed token spans.

Contract:

* :func:`analyze` renders the conversation exactly like
  :func:`hvd_agents.chat.encode_prompt` (its ``prompt_ids`` are equal to what that
  returns for the same arguments) and cuts the prompt into sorted, non-overlapping
  :class:`~hvd_agents.structure.TypedSpan` s that cover every prompt token:

  - the content of each message is typed ``SYSTEM``, ``USER``, ``ASSISTANT_TEXT``
    or ``TOOL_OUTPUT`` (the whole ``<tool_response>`` wrapper) by its role;
  - inside the system message, the Hermes tools block is ``TOOL_SCHEMA``;
  - inside an assistant message, its ``<tool_call>`` blocks (and the newlines
    joining them) are ``ASSISTANT_TOOL_CALL``;
  - the forced ``assistant_prefix`` is ``ASSISTANT_TEXT`` up to its first
    ``<tool_call>`` and ``ASSISTANT_TOOL_CALL`` from there;
  - everything else (role headers, end-of-turn markers, the generation prompt, a
    default system prompt injected by the template) is ``TEMPLATE``.

  Characters are located in the rendered text, then mapped to tokens with the
  fast tokenizer's offsets: a token belongs to the piece holding its first
  character, and adjacent tokens of the same kind form one span. A tokenizer
  without offsets (not fast) gets a single ``PROMPT`` span over the prompt.
* ``session_id`` is passed through; when None it is derived from the first system
  and first user message contents, so every turn of a conversation gets the same id.
* ``extra`` holds, for each tool, the call skeletons the model will emit, typed
  ``TOOL_CALL_SKELETON``: the opening of a call up to the first argument key
  (``<tool_call>\\n{"name": "f", "arguments": {"city": ``) and the whole call with
  every argument an empty string; built with :func:`render_tool_call`'s JSON
  conventions so their tokens match the model's output.
* :func:`register` adds the non-template spans (at least 2 tokens) and the extras
  to a cache store (``store.add(token_ids, kind, session_id) -> bool``) and returns
  how many were new. :func:`kind_by_token` gives the kind of each prompt token.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hvd_agents.chat.render import render_prompt, to_template_messages
from hvd_agents.chat.toolcalls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    normalize_tool,
    render_tool_call,
    render_tools_system_block,
)
from hvd_agents.errors import InvalidRequestError
from hvd_agents.structure import PromptStructure, SpanKind, TypedSpan

logger = logging.getLogger(__name__)

MIN_REGISTERED_TOKENS = 2
SESSION_ID_LENGTH = 16

_ROLE_KINDS = {
    "system": SpanKind.SYSTEM,
    "user": SpanKind.USER,
    "assistant": SpanKind.ASSISTANT_TEXT,
    "tool": SpanKind.TOOL_OUTPUT,
}

# A character range ``[start, end)`` of the prompt text and its kind.
Piece = tuple[int, int, SpanKind]


class SpanStore(Protocol):
    """What :func:`register` needs of a cache store."""

    token_budget: int  # the most tokens it holds: a longer span cannot be kept

    def add(self, token_ids: Sequence[int], kind: SpanKind, session_id: str | None) -> bool:
        """Add a span; True if it was new."""
        ...


def analyze(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    session_id: str | None = None,
    add_generation_prompt: bool = True,
    assistant_prefix: str = "",
) -> PromptStructure:
    """Render the conversation and cut its prompt into typed spans.

    Args:
        tokenizer: a HuggingFace tokenizer (fast, for offsets; else one PROMPT span).
        messages: the conversation, OpenAI shape (see :func:`hvd_agents.chat.to_template_messages`).
        tools: tool schemas, or None.
        session_id: the conversation id; derived from the messages when None.
        add_generation_prompt: end with the opening of an assistant turn.
        assistant_prefix: forced start of the assistant turn (see ``encode_prompt``).

    Returns:
        The :class:`PromptStructure`: prompt ids, spans, session id, tool skeletons.

    Raises:
        InvalidRequestError: invalid messages or tools (see ``to_template_messages``),
            or an ``assistant_prefix`` without ``add_generation_prompt``.
    """
    if assistant_prefix and not add_generation_prompt:
        raise InvalidRequestError("assistant_prefix needs add_generation_prompt=True")
    text = render_prompt(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
    full_text = text + assistant_prefix
    if session_id is None:
        session_id = derive_session_id(messages)
    extra = tool_call_skeletons(tokenizer, tools or ())
    encoding = _encode_with_offsets(tokenizer, full_text)
    if encoding is None:
        ids = tuple(tokenizer(full_text, add_special_tokens=False).input_ids)
        spans = (TypedSpan(0, len(ids), SpanKind.PROMPT),) if ids else ()
        return PromptStructure(ids, spans, session_id, extra)
    ids, offsets = encoding
    pieces = _message_pieces(text, messages, tools)
    pieces.extend(_prefix_pieces(len(text), assistant_prefix))
    spans = _token_spans(offsets, pieces)
    return PromptStructure(ids, spans, session_id, extra)


def _encode_with_offsets(tokenizer: Any, text: str) -> tuple[tuple[int, ...], list[tuple[int, int]]] | None:
    """Token ids and character offsets of ``text``, or None when the tokenizer has no offsets."""
    if not getattr(tokenizer, "is_fast", False):
        logger.debug("tokenizer %s is not fast; one PROMPT span", type(tokenizer).__name__)
        return None
    try:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [(int(start), int(end)) for start, end in encoding["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError, KeyError) as exc:
        logger.debug("no offsets from %s (%s); one PROMPT span", type(tokenizer).__name__, exc)
        return None
    ids = tuple(encoding["input_ids"])
    if len(ids) != len(offsets):
        logger.debug("offsets do not match the ids; one PROMPT span")
        return None
    return ids, offsets


def _message_pieces(
    text: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[Piece]:
    """Typed character pieces of the message contents in the rendered ``text``."""
    lowered = to_template_messages(messages, tools)
    inserted_system = bool(tools) and len(lowered) > len(messages)
    originals: list[Mapping[str, Any] | None] = ([None] if inserted_system else []) + list(messages)
    block = render_tools_system_block(tools) if tools else ""
    pieces: list[Piece] = []
    position = 0
    for index, (template_message, original) in enumerate(zip(lowered, originals)):
        content = template_message["content"]
        local = _content_pieces(template_message["role"], content, original, block if index == 0 else "")
        found = _locate(text, content, position)
        if found is None:
            logger.debug("content of template message %d not found in the rendered prompt", index)
            continue
        at, shift, length = found
        for start, end, kind in local:
            start, end = max(start - shift, 0), min(end - shift, length)
            if start < end:
                pieces.append((at + start, at + end, kind))
        position = at + length
    return pieces


def _locate(text: str, content: str, position: int) -> tuple[int, int, int] | None:
    """Where ``content`` is in ``text`` from ``position``: (index, chars stripped in front, length).

    Falls back to the stripped content, for templates that trim message contents.
    """
    if not content:
        return None
    at = text.find(content, position)
    if at >= 0:
        return at, 0, len(content)
    stripped = content.strip()
    if not stripped:
        return None
    at = text.find(stripped, position)
    if at < 0:
        return None
    return at, len(content) - len(content.lstrip()), len(stripped)


def _content_pieces(role: str, content: str, original: Mapping[str, Any] | None, block: str) -> list[Piece]:
    """Typed pieces of one lowered message content, in content coordinates."""
    size = len(content)
    if block and role == "system" and content.endswith(block):
        cut = size - len(block)
        return [p for p in ((0, cut, SpanKind.SYSTEM), (cut, size, SpanKind.TOOL_SCHEMA)) if p[0] < p[1]]
    if role == "assistant" and original is not None and original.get("tool_calls"):
        plain = to_template_messages([{"role": "assistant", "content": original.get("content")}])[0]["content"]
        cut = len(plain) + 1 if plain else 0  # the text, its "\n", then the call blocks
        if content.startswith(plain) and content[cut:].startswith(TOOL_CALL_OPEN):
            text_piece = (0, cut, SpanKind.ASSISTANT_TEXT)
            return [p for p in (text_piece, (cut, size, SpanKind.ASSISTANT_TOOL_CALL)) if p[0] < p[1]]
    return [(0, size, _ROLE_KINDS.get(role, SpanKind.PROMPT))] if size else []


def _prefix_pieces(offset: int, assistant_prefix: str) -> list[Piece]:
    """Typed pieces of the forced assistant prefix, which starts at ``offset``."""
    if not assistant_prefix:
        return []
    call_at = assistant_prefix.find(TOOL_CALL_OPEN)
    if call_at < 0:
        call_at = len(assistant_prefix)
    pieces = [
        (offset, offset + call_at, SpanKind.ASSISTANT_TEXT),
        (offset + call_at, offset + len(assistant_prefix), SpanKind.ASSISTANT_TOOL_CALL),
    ]
    return [p for p in pieces if p[0] < p[1]]


def _token_spans(offsets: Sequence[tuple[int, int]], pieces: Sequence[Piece]) -> tuple[TypedSpan, ...]:
    """Spans over all tokens: each token takes the kind of the piece holding its first character."""
    ordered = sorted(pieces)
    spans: list[TypedSpan] = []
    cursor = 0
    for token, (first_char, _) in enumerate(offsets):
        while cursor < len(ordered) and ordered[cursor][1] <= first_char:
            cursor += 1
        inside = cursor < len(ordered) and ordered[cursor][0] <= first_char
        kind = ordered[cursor][2] if inside else SpanKind.TEMPLATE
        if spans and spans[-1].kind == kind and spans[-1].end == token:
            spans[-1] = TypedSpan(spans[-1].start, token + 1, kind)
        else:
            spans.append(TypedSpan(token, token + 1, kind))
    return tuple(spans)


def derive_session_id(messages: Sequence[Mapping[str, Any]]) -> str:
    """A stable conversation id from the first system and first user message contents.

    Args:
        messages: the conversation, OpenAI shape (already validated or not).

    Returns:
        The first 16 hex characters of the sha256 of those contents; later turns
        of the same conversation give the same id.
    """
    lowered = to_template_messages(messages)
    system = next((m["content"] for m in lowered if m["role"] == "system"), None)
    user = next((m["content"] for m in lowered if m["role"] == "user"), None)
    key: list[Any] = [system, user] if system is not None or user is not None else [lowered[0]]
    digest = hashlib.sha256(json.dumps(key, ensure_ascii=False, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()[:SESSION_ID_LENGTH]


def skeleton_texts(tool: Mapping[str, Any]) -> list[str]:
    """The call skeleton texts of one tool, as the model will emit them.

    Args:
        tool: an OpenAI-shape tool schema or a bare function dict.

    Returns:
        With arguments: the opening of a call up to the first argument key
        (``<tool_call>\\n{"name": "f", "arguments": {"a": ``) and the whole call with
        every argument (schema order) an empty string. Without arguments: the
        whole call with empty arguments.

    Raises:
        InvalidRequestError: an invalid schema (see :func:`normalize_tool`).
    """
    function = normalize_tool(tool)
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    keys = [str(key) for key in properties] if isinstance(properties, Mapping) else []
    full = render_tool_call(function["name"], {key: "" for key in keys})
    if not keys:
        return [full]
    empty = render_tool_call(function["name"], {})
    tail = "}}\n" + TOOL_CALL_CLOSE
    if not empty.endswith(tail):  # defensive: the format changed
        logger.debug("unexpected tool-call rendering %r; no opening skeleton", empty)
        return [full]
    opening = empty[: -len(tail)] + json.dumps(keys[0], ensure_ascii=False) + ": "
    return [opening, full]


def tool_call_skeletons(
    tokenizer: Any, tools: Sequence[Mapping[str, Any]]
) -> tuple[tuple[tuple[int, ...], SpanKind], ...]:
    """The tokenized call skeletons of all tools, without duplicates.

    Args:
        tokenizer: the tokenizer (called with ``add_special_tokens=False``).
        tools: tool schemas.

    Returns:
        ``(token_ids, TOOL_CALL_SKELETON)`` pairs, in tool order.
    """
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[tuple[int, ...], SpanKind]] = []
    for tool in tools:
        for text in skeleton_texts(tool):
            ids = tuple(tokenizer(text, add_special_tokens=False).input_ids)
            if ids and ids not in seen:
                seen.add(ids)
                out.append((ids, SpanKind.TOOL_CALL_SKELETON))
    return tuple(out)


def register(store: SpanStore, structure: PromptStructure) -> int:
    """Add a prompt's spans and extras to a cache store.

    Template spans, spans shorter than 2 tokens and spans longer than the store's whole
    budget (which it cannot keep; the request still runs) are skipped.

    Args:
        store: has ``add(token_ids, kind, session_id) -> bool`` (True when new).
        structure: from :func:`analyze`.

    Returns:
        How many spans were newly added.
    """
    added = 0
    for span in structure.spans:
        if span.kind == SpanKind.TEMPLATE or not MIN_REGISTERED_TOKENS <= span.end - span.start <= store.token_budget:
            continue
        if store.add(structure.prompt_ids[span.start : span.end], span.kind, structure.session_id):
            added += 1
    for token_ids, kind in structure.extra:
        if not MIN_REGISTERED_TOKENS <= len(token_ids) <= store.token_budget:
            continue
        if store.add(token_ids, kind, structure.session_id):
            added += 1
    logger.debug("registered %d new spans for session %s", added, structure.session_id)
    return added


def kind_by_token(structure: PromptStructure) -> list[SpanKind]:
    """The kind of each prompt token (``PROMPT`` where no span covers it).

    Args:
        structure: from :func:`analyze`.

    Returns:
        A list as long as ``structure.prompt_ids``.
    """
    kinds = [SpanKind.PROMPT] * len(structure.prompt_ids)
    for span in structure.spans:
        kinds[span.start : span.end] = [span.kind] * (span.end - span.start)
    return kinds
