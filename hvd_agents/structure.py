"""Prompt structure: typed token spans and where they came from.

The prompt-structure analyzer (:mod:`hvd_agents.chat.analyzer`) cuts a rendered prompt
into spans typed by what produced them; the cache store keeps such spans across
requests with their provenance, and the cache drafter reports the kind of the span
a draft was copied from, which the payoff predictor uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class SpanKind(str, Enum):
    """What produced a span of tokens."""

    SYSTEM = "system"
    TOOL_SCHEMA = "tool_schema"
    TOOL_CALL_SKELETON = "tool_call_skeleton"
    USER = "user"
    ASSISTANT_TEXT = "assistant_text"
    ASSISTANT_TOOL_CALL = "assistant_tool_call"
    TOOL_OUTPUT = "tool_output"
    TEMPLATE = "template"  # chat-template markup between messages
    GENERATED = "generated"  # output of a finished request
    PROMPT = "prompt"  # prompt tokens of unknown structure


SPAN_KINDS: tuple[SpanKind, ...] = tuple(SpanKind)


@dataclass(frozen=True)
class TypedSpan:
    """Tokens ``[start, end)`` of a prompt, of one kind."""

    start: int
    end: int
    kind: SpanKind


@dataclass(frozen=True)
class PromptStructure:
    """A prompt's token ids cut into typed spans, for one session.

    Attributes:
        prompt_ids: the full prompt.
        spans: non-overlapping spans covering parts (usually all) of ``prompt_ids``.
        session_id: the conversation this prompt belongs to, if known.
        extra: spans registered alongside the prompt but not part of it (e.g. the
            tool-call skeletons the model will emit), as ``(token_ids, kind)``.
    """

    prompt_ids: tuple[int, ...]
    spans: tuple[TypedSpan, ...] = ()
    session_id: str | None = None
    extra: tuple[tuple[tuple[int, ...], SpanKind], ...] = ()

    def kind_at(self, position: int) -> SpanKind:
        """The kind of the prompt token at ``position`` (``PROMPT`` when no span covers it)."""
        for span in self.spans:
            if span.start <= position < span.end:
                return span.kind
        return SpanKind.PROMPT
