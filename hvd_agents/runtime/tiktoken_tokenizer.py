"""A tiktoken encoding behind the small slice of the HF tokenizer API the chat layer and analyzer use.

Contract:

* ``TiktokenTokenizer(encoding)`` wraps a ``tiktoken.Encoding``;
  :meth:`TiktokenTokenizer.from_name` builds one from an encoding name
  (``"o200k_base"``, ``"cl100k_base"``, ...; tiktoken downloads its BPE file on
  first use and caches it).
* ``tok(text, add_special_tokens=False, return_offsets_mapping=True)`` returns an
  :class:`Encoding` (a dict that also allows attribute access) with ``input_ids`` and,
  on request, ``offset_mapping``: character ``(start, end)`` per token, computed
  with ``Encoding.decode_with_offsets`` (a token that starts inside a multi-byte
  character gets that character's start). ``is_fast`` is True so the analyzer
  uses these offsets.
* There is no chat template (``chat_template is None``): the chat layer renders
  with its built-in ChatML template, whose ``<|im_start|>`` / ``<|im_end|>``
  markers are ordinary text for the OpenAI encodings. The encoding's own special
  tokens found in the text are encoded as special tokens (like HF tokenizers).
* ``convert_tokens_to_ids(token)`` returns the id of a special token, else None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hvd_agents.errors import ModelLoadError, ModelNotFoundError


class Encoding(dict):
    """The result of a tokenizer call: a dict whose keys are also attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class TiktokenTokenizer:
    """An HF-tokenizer-shaped adapter over a ``tiktoken.Encoding``.

    Args:
        encoding: the tiktoken encoding.
    """

    is_fast = True
    chat_template = None
    eos_token = None
    unk_token = None
    unk_token_id = None

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.name_or_path = f"tiktoken:{encoding.name}"

    @classmethod
    def from_name(cls, name: str) -> TiktokenTokenizer:
        """The adapter for a named tiktoken encoding (e.g. ``"o200k_base"``).

        Raises:
            ModelNotFoundError: tiktoken is not installed or does not know ``name``.
            ModelLoadError: the encoding's BPE file cannot be fetched or read.
        """
        try:
            import tiktoken
        except ImportError as exc:
            raise ModelNotFoundError("tiktoken is not installed: pip install tiktoken") from exc
        if name not in tiktoken.list_encoding_names():
            known = ", ".join(tiktoken.list_encoding_names())
            raise ModelNotFoundError(f"unknown tiktoken encoding {name!r}; known: {known}")
        try:
            return cls(tiktoken.get_encoding(name))
        except Exception as exc:  # network / cache errors surface as assorted exception types
            raise ModelLoadError(f"cannot load tiktoken encoding {name!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.encoding.name!r})"

    def __len__(self) -> int:
        return int(self.encoding.n_vocab)

    @property
    def vocab_size(self) -> int:
        return len(self)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (special tokens in the text are encoded as such)."""
        del add_special_tokens  # tiktoken adds none
        return self.encoding.encode(text, allowed_special="all")

    def __call__(
        self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False, **kwargs: Any
    ) -> Encoding:
        """Tokenize one text like an HF tokenizer call.

        Args:
            text: the text.
            add_special_tokens: ignored (tiktoken adds none).
            return_offsets_mapping: also return character ``(start, end)`` per token.

        Raises:
            TypeError: ``text`` is not a string (batches are not supported).
        """
        del kwargs
        if not isinstance(text, str):
            raise TypeError(f"TiktokenTokenizer takes one str, got {type(text).__name__}")
        ids = self.encode(text, add_special_tokens)
        out = Encoding(input_ids=ids)
        if return_offsets_mapping:
            out["offset_mapping"] = self._offsets(ids, len(text))
        return out

    def _offsets(self, ids: Sequence[int], text_length: int) -> list[tuple[int, int]]:
        """Character spans of the tokens: each starts where decode_with_offsets says, ends at the next start."""
        if not ids:
            return []
        _, starts = self.encoding.decode_with_offsets(list(ids))
        ends = [*starts[1:], text_length]
        return [(int(start), max(int(start), int(end))) for start, end in zip(starts, ends)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False, **kwargs: Any) -> str:
        """The text of ``ids`` (invalid UTF-8 is replaced)."""
        del kwargs
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            special = {self.encoding.encode_single_token(t) for t in self.encoding.special_tokens_set}
            ids = [i for i in ids if i not in special]
        return self.encoding.decode(ids, errors="replace")

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of a special token of the encoding, else None."""
        if token in self.encoding.special_tokens_set:
            return int(self.encoding.encode_single_token(token))
        return None
