"""Tool calls streamed as deltas: the pieces add up to what the whole-reply parser reads, in every chunking."""

from __future__ import annotations

import json

import pytest

from hvd_agents.chat.toolcall_stream import ToolCallDeltaParser
from hvd_agents.chat.toolcalls import parse_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "note": "a}b <x>"}}\n</tool_call>'
# keys in the other order: read whole when the block closes
REVERSED = '<tool_call>\n{"arguments": {"q": 1}, "name": "search"}\n</tool_call>'


def run(pieces: list[str], prefix: str = "", close: bool = False):
    """Content, calls ({index: [id, name, arguments]}) and the deltas of ``pieces``."""
    parser = ToolCallDeltaParser(prefix)
    deltas = [parser.push(piece) for piece in pieces] + [parser.finish(close)]
    calls: dict[int, list] = {}
    for delta in deltas:
        for call in delta.tool_calls:
            if call.id is not None:
                assert call.index not in calls, "a call's id and name come once"
                calls[call.index] = [call.id, call.name, ""]
            calls[call.index][2] += call.arguments
    return "".join(d.content for d in deltas), calls, deltas


def chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 5, 13, 1000])
@pytest.mark.parametrize(
    "text",
    [
        f"Let me check.\n{CALL}\n{REVERSED} Done.",
        f"  {CALL}{CALL}",
        "no call at all, just text <tool",  # a partial tag at the end is content
        "plain",
    ],
)
def test_deltas_add_up_to_the_whole_reply_parse(text, size) -> None:
    content, calls, deltas = run(chunked(text, size))
    whole = parse_tool_calls(text)
    assert content == whole.content == "".join(d.prose for d in deltas)
    assert not any(d.invalid_calls for d in deltas)
    assert [(c[1], json.loads(c[2])) for c in calls.values()] == [(c.name, c.arguments) for c in whole.tool_calls]
    assert len({c[0] for c in calls.values()}) == len(calls)  # distinct ids


def test_arguments_stream_before_the_block_closes() -> None:
    pieces = chunked(CALL, 3)
    _, calls, deltas = run(pieces)
    first_args = next(i for i, d in enumerate(deltas) if any(c.arguments for c in d.tool_calls))
    name_at = next(i for i, d in enumerate(deltas) if any(c.name for c in d.tool_calls))
    close_at = next(i for i in range(len(pieces)) if "</tool_call>" in "".join(pieces[: i + 1]))
    assert name_at <= first_args < close_at
    assert sum(1 for d in deltas for c in d.tool_calls if c.arguments) > 5  # many argument pieces
    assert calls[0][2] == '{"city": "Oslo", "note": "a}b <x>"}'  # the raw object, as written


def test_a_forced_call_closed_by_its_stop_string() -> None:
    prefix = '<tool_call>\n{"name": "get_weather", "arguments": '
    content, calls, deltas = run(['{"city": ', '"Paris"}', "}"], prefix=prefix, close=True)
    assert content == ""
    assert calls[0][1:] == ["get_weather", '{"city": "Paris"}']
    assert deltas[0].tool_calls[0].name == "get_weather"  # the name comes with the first push


def test_a_call_cut_short_keeps_what_was_written() -> None:
    content, calls, _ = run(['<tool_call>\n{"name": "f", "arguments": {"a": "unfini'])
    assert content == ""
    assert calls[0][1:] == ["f", '{"a": "unfini']


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": 5}\n</tool_call>',  # no valid name: the block is content
        'hi <tool_call>\n{"na',  # unterminated before the name could be read
    ],
)
def test_blocks_without_a_readable_call_are_content(text) -> None:
    content, calls, _ = run(chunked(text, 4))
    assert calls == {}
    assert content == text.strip()


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_block_that_is_no_call_is_reported_once_by_every_reading(size) -> None:
    """Streamed, it keeps its call index (its deltas went out as a call); read whole, its text is content only."""
    streamed = '<tool_call>\n{"name": "f", "arguments": {"a": 1}, oops}\n</tool_call>'
    whole = "<tool_call>\n[1, 2]\n</tool_call>"
    text = f"A {streamed} B {whole} C"
    content, calls, deltas = run(chunked(text, size))
    invalid = [bad for d in deltas for bad in d.invalid_calls]
    assert [(bad.index, bad.name) for bad in invalid] == [(0, "f"), (None, None)]
    assert invalid[0].id == calls[0][0] and calls[0][1:] == ["f", '{"a": 1}']
    parsed = parse_tool_calls(text)
    records = [bad.as_invalid_tool_call() for bad in invalid]
    assert [(bad.text, bad.error, bad.name) for bad in records] == [
        (bad.text, bad.error, bad.name) for bad in parsed.invalid_tool_calls]
    assert content == f"A  B {whole} C" and "".join(d.prose for d in deltas) == parsed.content == "A  B  C"
