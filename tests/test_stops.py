"""StopStringMatcher: emitted text == text before the first completed stop, over any chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_agents.engine.stops import StopStringMatcher
from hvd_agents.errors import InvalidRequestError


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """Obvious model: read char by char, stop at the first position where a stop string ends
    (the longest one if several end there), return the text before it."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            return text[: end - max(len(s) for s in ending)], True
    return text, False


def run(text: str, stops: list[str], cuts: list[int]) -> tuple[str, bool, StopStringMatcher]:
    """Feed ``text`` in chunks whose sizes cycle through ``cuts``; flush if no stop."""
    matcher = StopStringMatcher(stops)
    out, position, step, stopped = [], 0, 0, False
    while position < len(text) and not stopped:
        size = cuts[step % len(cuts)]
        emitted, stopped = matcher.feed(text[position : position + size])
        out.append(emitted)
        position += size
        step += 1
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped, matcher


# A small alphabet so that stop strings and their partial prefixes occur often.
_texts = st.text(alphabet="abc😀", max_size=30)
_stops = st.lists(st.text(alphabet="abc😀", min_size=1, max_size=4), min_size=1, max_size=3)
_cuts = st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=6)


@settings(max_examples=500, deadline=None)
@given(text=_texts, stops=_stops, cuts=_cuts)
def test_matches_reference_over_any_chunking(text: str, stops: list[str], cuts: list[int]) -> None:
    emitted, stopped, matcher = run(text, stops, cuts)
    assert (emitted, stopped) == reference(text, stops)
    if not stopped:
        assert emitted == text
    assert matcher.stopped == stopped


@settings(max_examples=200, deadline=None)
@given(text=_texts, stops=_stops)
def test_holds_back_only_a_possible_stop_prefix(text: str, stops: list[str]) -> None:
    # Intent: text is emitted as early as possible; only a suffix that could start a stop waits.
    matcher = StopStringMatcher(stops)
    emitted = ""
    for char in text:
        out, stopped = matcher.feed(char)
        emitted += out
        if stopped:
            return
        held = matcher.pending
        assert emitted + held == text[: len(emitted) + len(held)]
        assert held == "" or any(s.startswith(held) and s != held for s in stops)


@pytest.mark.parametrize(
    ("stops", "deltas", "expected", "stopped"),
    [
        # A stop string split over many deltas is still found; it is not returned.
        (["</s>"], ["Hello <", "/", "s", "> tail"], "Hello ", True),
        # The earliest-completing match wins even if another stop occurs in the same delta.
        (["END", "x"], ["abxcdEND"], "ab", True),
        # Two stops ending at the same place: the earliest start (longest) wins.
        (["b", "ab"], ["cab"], "c", True),
        # A stop at the very start yields nothing.
        (["stop"], ["stop here"], "", True),
        # A false start ("aa" of "aab") is released once it cannot match.
        (["aab"], ["a", "a", "a", "b"], "a", True),
        # No stop: everything comes out (the held tail via flush).
        (["xyz"], ["abc x", "y"], "abc xy", False),
        # A bare string is one stop string.
        ("##", ["a#", "b##c"], "a#b", True),
    ],
)
def test_table(stops, deltas, expected, stopped) -> None:
    matcher = StopStringMatcher(stops)
    out, done = [], False
    for delta in deltas:
        text, done = matcher.feed(delta)
        out.append(text)
        if done:
            break
    if not done:
        out.append(matcher.flush())
    assert ("".join(out), done) == (expected, stopped)


def test_after_stop_feed_and_flush_return_nothing() -> None:
    matcher = StopStringMatcher(["\n\n"])
    assert matcher.feed("one\n\ntwo") == ("one", True)
    assert matcher.matched == "\n\n"
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_holds_back_partial_then_releases() -> None:
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.feed("Hi <|e") == ("Hi ", False)
    assert matcher.pending == "<|e"
    assert matcher.feed("x") == ("<|ex", False)


@pytest.mark.parametrize("stops", [[""], ["ok", ""], [None], [b"x"]])
def test_invalid_stops_are_rejected(stops) -> None:
    with pytest.raises(InvalidRequestError):
        StopStringMatcher(stops)


def test_no_stops_passes_everything_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.feed("anything") == ("anything", False)
    assert matcher.flush() == ""
