"""What a token's text looks like, as a few yes/no classes: the payoff predictor's view of the draft's text.

Where a copied draft breaks off is mostly a matter of where it stands in the text:
at the opening quote of a JSON value, after ``"name": "``, at a newline, an
argument's digits. The cache drafter's counts cannot see that (the four tokens
before an argument's value were followed by the same value every time before);
the characters of the tokens around a position can. So each token id gets a
bitmask of :data:`CLASS_NAMES` (quote, colon, digit, newline, ...), read once off
the tokenizer's text of each id, and a draft position's text features are the
classes of the three tokens before it and of the drafted token itself
(:func:`text_columns`). The classes are the same for any tokenizer, so weights
fitted through one tokenizer's ids apply to another's.

Worked example: with SmolLM2's tokenizer the token ``'": "'`` is ``punct``,
``dquote``, ``colon``, ``ends_quote``, ``starts_quote`` and ``len2``; a draft's
first position after it has those bits in its ``-1`` columns.
"""

from __future__ import annotations

import functools
import unicodedata
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

CLASS_NAMES: tuple[str, ...] = (
    "punct", "bracket", "dquote", "squote", "blank", "alpha", "lead_space", "digit", "newline", "colon", "comma",
    "ends_quote", "starts_quote", "underscore", "upper", "special", "len2", "len5",
)
"""A token's classes, by its decoded text ``s`` (``t`` = ``s`` stripped of whitespace): ``punct`` (a Unicode
punctuation character), ``bracket`` (one of ``()[]{}<>``), ``dquote`` / ``squote`` (holds ``"`` / ``'``),
``blank`` (``t`` is empty), ``alpha``, ``lead_space`` (``s`` starts with a space), ``digit``, ``newline``,
``colon``, ``comma``, ``ends_quote`` / ``starts_quote`` (``t`` ends / starts with a quote), ``underscore``,
``upper`` (``t`` starts upper case), ``special`` (a special token of the tokenizer), ``len2`` / ``len5`` (``t``
has at least 2 / 5 characters)."""
NUM_CLASSES = len(CLASS_NAMES)
BEFORE = 3
"""Context tokens before a draft whose classes a record carries (the first positions' ``-1..-3`` columns)."""
TEXT_OFFSETS: tuple[int, ...] = (-1, -2, -3, 0)
"""Which tokens, relative to a draft position, its text columns describe: the three before it, then itself."""
TEXT_COLUMNS: tuple[str, ...] = tuple(f"text{offset:+d}:{name}" for offset in TEXT_OFFSETS for name in CLASS_NAMES)
_QUOTES = ('"', "'")
_BRACKETS = frozenset("()[]{}<>")


def token_classes(text: str, special: bool = False) -> int:
    """The bitmask of :data:`CLASS_NAMES` (bit ``i`` for the ``i``-th) of a token whose text is ``text``."""
    mask = 0
    for ch in set(text):
        mask |= _char_classes(ch)
    stripped = text.strip()
    if not stripped:
        mask |= _BIT["blank"]
    else:
        mask |= (_BIT["ends_quote"] if stripped[-1] in _QUOTES else 0) | (
            _BIT["starts_quote"] if stripped[0] in _QUOTES else 0) | (_BIT["upper"] if stripped[0].isupper() else 0)
        mask |= (_BIT["len2"] if len(stripped) >= 2 else 0) | (_BIT["len5"] if len(stripped) >= 5 else 0)
    if text[:1] == " ":
        mask |= _BIT["lead_space"]
    return mask | (_BIT["special"] if special else 0)


_BIT = {name: 1 << i for i, name in enumerate(CLASS_NAMES)}


@functools.lru_cache(maxsize=1 << 16)
def _char_classes(ch: str) -> int:
    """The classes one character gives the token holding it."""
    flags = {
        "punct": unicodedata.category(ch).startswith("P"),
        "bracket": ch in _BRACKETS,
        "dquote": ch == '"',
        "squote": ch == "'",
        "alpha": ch.isalpha(),
        "digit": ch.isdigit(),
        "newline": ch == "\n",
        "colon": ch == ":",
        "comma": ch == ",",
        "underscore": ch == "_",
    }
    return sum(_BIT[name] for name, flag in flags.items() if flag)


class TokenText:
    """Each token id's classes (:func:`token_classes`), looked up as bitmasks.

    Args:
        masks: ``[V]`` the bitmask of each id; ids outside ``0..V-1`` read as 0 (no class).

    Example:
        >>> text = TokenText.from_decoder(['a', '": "', '\\n'].__getitem__, 3)
        >>> text.masks([1, 7]).tolist()  # an id out of range has no class
        [72197, 0]
    """

    def __init__(self, masks: np.ndarray) -> None:
        self._masks = np.asarray(masks, dtype=np.int64)  # [V]
        self._listed = self._masks.tolist()  # [V]: a draft's few ids are read faster off a list than through NumPy

    @property
    def vocab_size(self) -> int:
        return len(self._masks)

    @classmethod
    def from_decoder(cls, decode: Callable[[int], str], vocab_size: int, special: Iterable[int] = ()) -> TokenText:
        """Classes of ids ``0..vocab_size-1`` by their decoded text; ``special`` ids get the ``special`` class."""
        specials = set(special)
        return cls(np.array([token_classes(decode(token), token in specials) for token in range(vocab_size)],
                            dtype=np.int64))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenText | None:
        """Classes read off a Hugging Face style tokenizer (``decode`` and ``len``), built once per tokenizer
        object; None when it has neither."""
        if tokenizer is None or not hasattr(tokenizer, "decode"):
            return None
        try:
            cached = _BUILT.get(tokenizer)
        except TypeError:  # not weakly referenceable: build without caching
            cached = None
        if cached is not None:
            return cached
        try:
            size = len(tokenizer)
        except TypeError:
            return None
        special = getattr(tokenizer, "all_special_ids", None) or ()
        texts = decode_each(tokenizer, size)
        built = (cls.from_decoder(texts.__getitem__, size, special) if texts is not None
                 else cls.from_decoder(lambda token: tokenizer.decode([token]), size, special))
        try:
            _BUILT[tokenizer] = built
        except TypeError:
            pass
        return built

    def masks(self, token_ids: Sequence[int]) -> np.ndarray:
        """``[n]`` the bitmasks of ``token_ids`` (0 for an id this table does not cover)."""
        ids = np.asarray(token_ids, dtype=np.int64)  # [n]
        inside = (ids >= 0) & (ids < len(self._masks))
        return np.where(inside, self._masks[np.clip(ids, 0, max(len(self._masks) - 1, 0))], 0) if len(ids) else ids

    def around(self, context: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        """``[BEFORE + n]``: the bitmasks of the last :data:`BEFORE` context tokens (0 where the context is
        shorter), then of the ``n`` draft tokens: what :class:`~hvd_agents.policy.features.CacheDraftFeatures`
        keeps as ``text``."""
        head = list(context[-BEFORE:]) if BEFORE else []
        listed, size = self._listed, len(self._listed)
        masks = [0] * (BEFORE - len(head)) + [listed[token] if 0 <= token < size else 0 for token in head + list(draft)]
        return np.array(masks, dtype=np.int64)


_BUILT: weakref.WeakKeyDictionary[Any, TokenText] = weakref.WeakKeyDictionary()


def decode_each(tokenizer: Any, size: int) -> list[str] | None:
    """Each id's text ``tokenizer.decode([id])`` for ids ``0..size-1`` in one call of a fast tokenizer's backend
    (``backend_tokenizer.decode_batch``: about a fifth of the time of ``size`` decodes); None where the tokenizer
    has no such backend, cleans up its decoded text afterwards (``clean_up_tokenization_spaces``: the backend's text
    would differ) or the backend answers otherwise."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decode_batch = getattr(backend, "decode_batch", None)
    if decode_batch is None:
        return None
    try:
        texts = decode_batch([[token] for token in range(size)], skip_special_tokens=False)
    except (TypeError, ValueError):  # a backend that takes other arguments: decode one id at a time
        return None
    return list(texts) if len(texts) == size and all(isinstance(text, str) for text in texts) else None


def text_columns(text: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
    """The text columns of a draft's first ``length`` positions, ``[L, len(TEXT_COLUMNS)]`` of 0/1, from the
    ``text`` bitmasks (``[BEFORE + n]``, :meth:`TokenText.around`); positions past ``n`` read as no class.

    ``out``: a float ``[L, len(TEXT_COLUMNS)]`` array (a view into a wider one) written in place of a new one,
    so that a caller that lays the columns beside others builds no intermediate array."""
    padded = np.zeros(BEFORE + length, dtype=np.int64)  # [BEFORE + L]
    known = min(len(text), BEFORE + length)
    padded[:known] = text[:known]
    bits = (padded[:, None] >> _CLASS_SHIFTS) & 1  # [BEFORE + L, C]
    rows = np.arange(BEFORE, BEFORE + length)[:, None] + _OFFSETS  # [L, O]: the tokens each position describes
    if out is None:
        out = np.empty((length, len(TEXT_COLUMNS)))
    out[...] = bits[rows].reshape(length, len(TEXT_COLUMNS))  # [L, O, C] read offset by offset
    return out


_CLASS_SHIFTS = np.arange(NUM_CLASSES)  # [C]
_OFFSETS = np.array(TEXT_OFFSETS)  # [O]
