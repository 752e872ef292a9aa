"""IncrementalDetokenizer: streamed text == full decode, never a broken character, cheap calls."""

from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_agents.engine.detok import IncrementalDetokenizer
from tests.helpers import IM_END_ID, SPECIAL_TOKENS, make_byte_tokenizer


@lru_cache(maxsize=1)
def tokenizer():
    return make_byte_tokenizer()


def encode(text: str) -> list[int]:
    return tokenizer()(text, add_special_tokens=False).input_ids


def stream(
    ids: list[int], cuts: list[int], skip_special_tokens: bool = True
) -> tuple[list[str], IncrementalDetokenizer]:
    """Push ``ids`` in chunks whose sizes cycle through ``cuts`` (0 = an empty push); flush last."""
    if not any(cuts):
        cuts = [*cuts, 1]  # guarantee progress
    detok = IncrementalDetokenizer(tokenizer(), skip_special_tokens=skip_special_tokens)
    deltas, position, step = [], 0, 0
    while position < len(ids):
        size = cuts[step % len(cuts)]
        deltas.append(detok.push(ids[position : position + size]))
        position += size
        step += 1
    deltas.append(detok.flush())
    return deltas, detok


# Text mixing ASCII, accents, CJK, emoji (incl. ZWJ sequences) and special tokens.
_pieces = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="ab !éß日本語😀🎉👩‍💻\n", max_size=12),
    st.sampled_from(SPECIAL_TOKENS),
)
_texts = st.lists(_pieces, max_size=8).map("".join)
_cuts = st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(text=_texts, cuts=_cuts, skip=st.booleans())
def test_stream_of_text_equals_full_decode(text: str, cuts: list[int], skip: bool) -> None:
    ids = encode(text)
    deltas, detok = stream(ids, cuts, skip)
    expected = tokenizer().decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == expected
    assert detok.text == expected
    # Valid text never yields a broken character mid-stream (U+FFFD only if the text has one).
    if "\ufffd" not in text:
        assert not any("\ufffd" in d for d in deltas)


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=263), max_size=40), cuts=_cuts, skip=st.booleans())
def test_stream_of_arbitrary_ids_equals_full_decode(ids: list[int], cuts: list[int], skip: bool) -> None:
    # Arbitrary ids include invalid UTF-8 (lone continuation bytes, truncated sequences).
    deltas, _ = stream(ids, cuts, skip)
    assert "".join(deltas) == tokenizer().decode(ids, skip_special_tokens=skip)


def test_multibyte_character_is_held_back_until_complete() -> None:
    ids = encode("😀")
    assert len(ids) > 1  # the emoji spans several tokens
    detok = IncrementalDetokenizer(tokenizer())
    outputs = [detok.push([t]) for t in ids]
    assert outputs[:-1] == [""] * (len(ids) - 1)
    assert outputs[-1] == "😀"
    assert detok.flush() == ""


def test_flush_returns_broken_tail_with_replacement() -> None:
    detok = IncrementalDetokenizer(tokenizer())
    assert detok.push(encode("ok ")) == "ok "
    assert detok.push([0xF0, 0x9F]) == ""  # first half of a 4-byte character
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""  # nothing left
    assert detok.text == "ok \ufffd"


def test_special_tokens_skipped_or_kept() -> None:
    ids = [*encode("hi"), IM_END_ID, *encode(" there")]
    skipped, _ = stream(ids, [1], skip_special_tokens=True)
    kept, _ = stream(ids, [1], skip_special_tokens=False)
    assert "".join(skipped) == "hi there"
    assert "".join(kept) == "hi<|im_end|> there"


def test_empty_push_and_flush_on_fresh_detokenizer() -> None:
    detok = IncrementalDetokenizer(tokenizer())
    assert detok.push([]) == ""
    assert detok.flush() == ""
    assert detok.text == ""


class _SpyTokenizer:
    """Wraps a tokenizer and records the length of every decoded window."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.window_sizes: list[int] = []

    def decode(self, ids, **kwargs) -> str:
        self.window_sizes.append(len(ids))
        return self.inner.decode(ids, **kwargs)


@pytest.mark.parametrize("text", ["the quick brown fox " * 40, "日本語のテキスト😀" * 30])
def test_each_push_decodes_only_a_small_window(text: str) -> None:
    spy = _SpyTokenizer(tokenizer())
    detok = IncrementalDetokenizer(spy)
    ids = encode(text)
    out = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert out == text
    assert len(ids) > 300
    assert max(spy.window_sizes) <= 8  # bounded by the token span of one character, not the output
