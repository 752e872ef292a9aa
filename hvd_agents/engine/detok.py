"""Incremental detokenization: token ids in, complete text deltas out.

Contract:

* :class:`IncrementalDetokenizer` turns a stream of generated token ids into text
  deltas with the prefix-offset / read-offset algorithm of TGI and vLLM: each
  :meth:`~IncrementalDetokenizer.push` decodes only a small window of recent tokens
  (the tokens already returned as text in the previous delta, plus the new ones), so
  a call costs O(window), not O(output).
* A delta never ends in a broken character: when the decoded window ends with
  U+FFFD (a multi-byte character split across tokens), the new tokens are held back
  until more tokens complete it. :meth:`~IncrementalDetokenizer.flush` returns what
  is still held back at the end (broken bytes decoded as U+FFFD).
* For byte-level tokenizers, the concatenation of every ``push`` output over any
  chunking of the ids, plus ``flush()``, equals
  ``tokenizer.decode(all_ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``.
  Tokenization-space clean-up is never applied: it is not stable under windowing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Stateful streaming decoder for one generated sequence.

    Args:
        tokenizer: a HuggingFace tokenizer (anything with a ``decode`` method taking
            ``skip_special_tokens`` and ``clean_up_tokenization_spaces``).
        skip_special_tokens: drop special tokens from the text, as ``decode`` does.

    Example (``ids`` a token sequence, ``text`` its full decoding)::

        detok = IncrementalDetokenizer(tokenizer)
        assert "".join(detok.push([t]) for t in ids) + detok.flush() == text
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        # Tokens [prefix_offset, read_offset) were the tail of the last returned delta:
        # they are decoded again as left context so that the decoder sees the same
        # neighbourhood (leading spaces, byte merges) as a full decode would.
        self._prefix_offset = 0
        self._read_offset = 0
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All text returned so far by :meth:`push` and :meth:`flush`."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Every token id pushed so far."""
        return tuple(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated token ids and return the newly complete text.

        Args:
            token_ids: the next token ids of the sequence (may be empty).

        Returns:
            The text that became complete with these tokens; ``""`` when they only
            extend a still-incomplete character (or decode to nothing, e.g. skipped
            special tokens).
        """
        self._ids.extend(int(t) for t in token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever is still held back, at the end of the sequence.

        Incomplete characters are decoded with U+FFFD. Calling ``flush`` again
        without pushing more tokens returns ``""``.
        """
        return self._advance(final=True)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            list(ids),
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def _advance(self, *, final: bool) -> str:
        """Decode the window and return the new text, moving the offsets when emitting."""
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR)):
            return ""  # nothing new yet, or a character still split across tokens
        if not new_text.startswith(prefix_text):
            logger.debug("detokenizer window changed its prefix: %r -> %r", prefix_text, new_text)
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if delta:
            self._chunks.append(delta)
        return delta
