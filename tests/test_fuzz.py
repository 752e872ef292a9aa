"""Property tests: the readers of untrusted input raise only their documented errors.

* The tool-call parser reads model output: it never raises (content + calls + invalid calls).
* The prompt-structure analyzer: a conversation it accepts gives in-bounds, ordered spans
  covering the prompt; anything else raises ``InvalidRequestError``.
* The trace reader raises only ``TraceFormatError``; the store file reader only
  ``StoreFormatError`` (and ``load_or_empty`` recovers with an empty store, the file kept aside).
"""

from __future__ import annotations

import io
import json
import re
import tempfile
from functools import lru_cache
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvd_agents.chat.analyzer import _token_spans, analyze, kind_by_token, register
from hvd_agents.chat.render import encode_prompt
from hvd_agents.chat.toolcalls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    InvalidToolCall,
    ToolCall,
    forced_call_prefix,
    parse_tool_calls,
    render_tool_call,
)
from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.errors import InvalidRequestError, StoreFormatError, TraceFormatError
from hvd_agents.structure import SpanKind
from hvd_agents.trace.loader import load_trace
from tests.helpers import make_byte_tokenizer

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=2)
def tokenizer(with_chat_template: bool = True):
    return make_byte_tokenizer(with_chat_template=with_chat_template)


# Text that tends to break things: markup of the format and the template, JSON syntax, odd characters.
PIECES = [TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<tool_response>", "<|im_start|>", "<|im_end|>", "{", "}", "[", "]",
          '"', "\\", ":", ",", '"name"', '"arguments"', '"id"', '"f"', "null", "1e999", "\n", " ", "\u2028", "é", "😀"]
surrogates = st.sampled_from(["\ud800", "\udfff", "a\udc80b"])
tricky_text = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=20).map("".join)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=10))
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)


# ================================================================ the tool-call parser


def _check_parse(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert isinstance(parsed.content, str) and parsed.content == parsed.content.strip()
    assert TOOL_CALL_OPEN not in parsed.content  # every opening tag starts a block, valid or not
    assert all(isinstance(c, ToolCall) and isinstance(c.name, str) and c.name and isinstance(c.arguments, dict)
               for c in parsed.tool_calls)
    assert all(isinstance(b, InvalidToolCall) and b.error and b.id for b in parsed.invalid_tool_calls)
    opened = len(re.findall(re.escape(TOOL_CALL_OPEN) + r".*?" + re.escape(TOOL_CALL_CLOSE), text, re.DOTALL))
    tail = re.sub(re.escape(TOOL_CALL_OPEN) + r".*?" + re.escape(TOOL_CALL_CLOSE), "", text, flags=re.DOTALL)
    blocks = opened + (TOOL_CALL_OPEN in tail)
    assert len(parsed.tool_calls) + len(parsed.invalid_tool_calls) == blocks
    if TOOL_CALL_OPEN not in text:
        assert parsed.content == text.strip() and not parsed.tool_calls and not parsed.invalid_tool_calls


@FAST
@given(st.text())
def test_parser_never_raises_on_arbitrary_text(text) -> None:
    _check_parse(text)


@FAST
@given(tricky_text)
def test_parser_never_raises_on_tag_and_json_soup(text) -> None:
    _check_parse(text)


@st.composite
def near_valid_replies(draw) -> str:
    """A reply holding well-formed calls, then damaged: cut, spliced, or with characters dropped or added."""
    calls = draw(st.lists(st.tuples(st.text(min_size=1, max_size=8), json_objects), min_size=1, max_size=3))
    text = draw(st.text(max_size=10)) + "\n".join(render_tool_call(name, args) for name, args in calls)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["cut", "drop", "insert"]))
        if action == "cut":
            text = text[:at]
        elif action == "drop":
            text = text[:at] + text[at + draw(st.integers(1, 4)):]
        else:
            text = text[:at] + draw(st.one_of(st.sampled_from(PIECES), st.text(max_size=3))) + text[at:]
    return text


@FAST
@given(near_valid_replies())
def test_parser_never_raises_on_near_valid_json(text) -> None:
    _check_parse(text)


@FAST
@given(st.text(max_size=10), st.lists(st.tuples(st.text(min_size=1, max_size=8), json_objects), max_size=3))
def test_rendered_calls_parse_back(content, calls) -> None:
    text = content.replace(TOOL_CALL_OPEN, "") + "".join(render_tool_call(name, args) for name, args in calls)
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls and not parsed.invalid_tool_calls


# ================================================================ the analyzer

TOOL_NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True)
tool_schemas = st.lists(
    st.tuples(TOOL_NAMES, st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), max_size=3, unique=True)),
    max_size=3, unique_by=lambda t: t[0],
).map(lambda tools: [
    {"type": "function", "function": {"name": name, "description": "d",
                                      "parameters": {"type": "object",
                                                     "properties": {key: {"type": "string"} for key in keys}}}}
    for name, keys in tools
])


@st.composite
def conversations(draw, text=tricky_text):
    """A conversation of the shape the chat layer accepts, its tools and a forced reply prefix."""
    tools = draw(tool_schemas)
    names = [tool["function"]["name"] for tool in tools]
    messages = []
    for _ in range(draw(st.integers(1, 5))):
        role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
        content = draw(text)
        if role == "assistant" and names and draw(st.booleans()):
            calls = [{"type": "function", "function": {"name": draw(st.sampled_from(names)),
                                                       "arguments": draw(json_objects)}}
                     for _ in range(draw(st.integers(1, 2)))]
            messages.append({"role": role, "content": draw(st.none() | st.just(content)), "tool_calls": calls})
        else:
            messages.append({"role": role, "content": content if draw(st.booleans()) else [
                {"type": "text", "text": content}, {"type": "text", "text": draw(text)}]})
    choice = draw(st.sampled_from([None, "required", *names]))
    return messages, tools, forced_call_prefix(choice, tools) if tools else ""


def _check_structure(tok, structure, messages, tools, prefix) -> None:
    ids = structure.prompt_ids
    assert list(ids) == encode_prompt(tok, messages, tools, assistant_prefix=prefix)
    position = 0
    for span in structure.spans:  # sorted, non-overlapping, covering every token
        assert span.start == position and span.start < span.end <= len(ids) and isinstance(span.kind, SpanKind)
        position = span.end
    assert position == len(ids)
    assert len(kind_by_token(structure)) == len(ids)
    register(CacheStore(token_budget=10_000), structure)


@SLOW
@given(conversations(), st.booleans())
def test_analyzer_spans_stay_in_bounds_and_ordered(conversation, with_chat_template) -> None:
    messages, tools, prefix = conversation
    tok = tokenizer(with_chat_template)
    structure = analyze(tok, messages, tools, assistant_prefix=prefix)
    _check_structure(tok, structure, messages, tools, prefix)


loose_values = st.recursive(
    st.one_of(json_scalars, surrogates),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "tool_calls", "function", "name", "arguments",
                         "parameters", "properties"]), children, max_size=4)),
    max_leaves=10,
)
loose_messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
                          optional={"content": st.one_of(tricky_text, surrogates, loose_values),
                                    "tool_calls": loose_values}),
    loose_values,
), max_size=4)


@SLOW
@given(conversations(text=st.lists(st.one_of(st.sampled_from(PIECES), surrogates, st.text(max_size=4)),
                                   max_size=6).map("".join)))
def test_analyzer_refuses_text_that_is_not_unicode(conversation) -> None:
    messages, tools, prefix = conversation
    tok = tokenizer(True)
    try:
        structure = analyze(tok, messages, tools, assistant_prefix=prefix)
    except InvalidRequestError as exc:
        assert "not valid Unicode" in str(exc)
        return
    _check_structure(tok, structure, messages, tools, prefix)


@SLOW
@given(st.one_of(loose_messages, loose_values), st.one_of(st.none(), st.lists(loose_values, max_size=2), loose_values))
def test_analyzer_raises_only_invalid_request_errors(messages, tools) -> None:
    tok = tokenizer(True)
    try:
        structure = analyze(tok, messages, tools)
    except InvalidRequestError:
        return
    _check_structure(tok, structure, messages, tools, "")


@FAST
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=30),
       st.lists(st.tuples(st.integers(0, 80), st.integers(0, 20), st.sampled_from(list(SpanKind))), max_size=8))
def test_token_spans_cover_any_token_sequence_in_order(token_chars, raw_pieces) -> None:
    starts = sorted(start for start, _ in token_chars)
    offsets = [(start, start + width) for start, (_, width) in zip(starts, token_chars)]
    pieces, end = [], 0  # non-overlapping pieces, as the analyzer builds them
    for start, length, kind in sorted(raw_pieces):
        start = max(start, end)
        pieces.append((start, start + length, kind))
        end = start + length
    spans = _token_spans(offsets, [p for p in pieces if p[0] < p[1]])
    assert [s.start for s in spans] == ([0, *[s.end for s in spans[:-1]]] if spans else [])
    assert (spans[-1].end if spans else 0) == len(offsets)
    assert all(s.start < s.end for s in spans)
    assert all(a.kind != b.kind for a, b in pairwise(spans))  # adjacent tokens of one kind form one span


# ================================================================ the trace reader


def _load_trace_bytes(data: bytes, suffix: str, **kwargs):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"trace{suffix}"
        path.write_bytes(data)
        return load_trace(path, **kwargs)


@FAST
@given(st.binary(max_size=300), st.sampled_from([".jsonl", ".json"]), st.booleans())
def test_trace_reader_on_arbitrary_bytes_raises_only_trace_format_errors(data, suffix, skip_bad) -> None:
    try:
        _load_trace_bytes(data, suffix, skip_bad=skip_bad)
    except TraceFormatError:
        pass


conversation_records = st.one_of(
    json_values,
    st.fixed_dictionaries({"messages": st.one_of(loose_messages, json_values)},
                          optional={"id": json_values, "tools": st.one_of(st.lists(loose_values, max_size=2),
                                                                          json_values)}),
)


@FAST
@given(st.lists(conversation_records, max_size=5), st.booleans(), st.booleans())
@example([[None, None]], False, True)  # one JSONL line holding an array reads as a JSON array file
def test_trace_reader_on_arbitrary_json_raises_only_trace_format_errors(records, as_array, skip_bad) -> None:
    if as_array:
        text = "[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]"
    else:
        text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    try:
        trace = _load_trace_bytes(text.encode("utf-8", "surrogatepass"), ".jsonl", skip_bad=skip_bad)
    except TraceFormatError:
        return
    units = records
    if not as_array and len(records) == 1 and isinstance(records[0], list):
        units = records[0]  # one line holding an array is a JSON array file: its items are the conversations
    assert len(trace.conversations) + len(trace.skipped) <= len(units)
    for conversation in trace.conversations:
        assert isinstance(conversation.id, str) and conversation.messages


# ================================================================ the store file reader


def _store_bytes() -> bytes:
    store = CacheStore(token_budget=100)
    store.add([1, 2, 3], SpanKind.SYSTEM, "s")
    store.add([4, 5, 6, 7], SpanKind.TOOL_SCHEMA)
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "store.npz"
        store.save(path)
        buffer.write(path.read_bytes())
    return buffer.getvalue()


GOOD_STORE = _store_bytes()


def _check_store_file(data: bytes) -> None:
    """``load`` raises only StoreFormatError; ``load_or_empty`` then starts empty, the bytes kept aside."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "store.npz"
        path.write_bytes(data)
        try:
            store = CacheStore.load(path)
        except StoreFormatError:
            assert len(CacheStore.load_or_empty(path)) == 0
            [kept] = [p for p in Path(directory).iterdir() if p.name.startswith("store.npz.corrupt-")]
            assert kept.read_bytes() == data and not path.exists()
            return
        assert sum(span.length for span in store.spans) == store.num_tokens <= store.token_budget


@FAST
@given(st.binary(max_size=400))
def test_store_reader_on_arbitrary_bytes(data) -> None:
    _check_store_file(data)


def test_a_store_file_whose_entries_say_they_are_encrypted_is_a_corrupt_store() -> None:
    raw = bytearray(GOOD_STORE)
    at = raw.find(b"PK\x01\x02")  # the central directory's first entry: its flags at offset 8
    assert at >= 0
    while at >= 0:
        raw[at + 8] |= 0x01  # "encrypted": zipfile asks for a password (RuntimeError)
        at = raw.find(b"PK\x01\x02", at + 4)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "store.npz"
        path.write_bytes(bytes(raw))
        with pytest.raises(StoreFormatError, match="corrupt or not a store.*encrypted"):
            CacheStore.load(path)
    _check_store_file(bytes(raw))


@FAST
@given(st.data())
def test_store_reader_on_damaged_store_files(data) -> None:
    raw = bytearray(GOOD_STORE)
    action = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    if action == "truncate":
        raw = raw[:at]
    elif action == "flip":
        raw[at] ^= data.draw(st.integers(1, 255))
    else:
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    _check_store_file(bytes(raw))


headers = st.one_of(
    json_values,
    st.fixed_dictionaries({
        "format": st.sampled_from(["hvd-agents-store", "other"]),
        "version": st.sampled_from([1, 1, 2, "1"]),
        "token_budget": st.one_of(st.integers(-5, 50), json_values),
        "clock": st.one_of(st.integers(-5, 50), json_values),
        "spans": st.one_of(json_values, st.lists(st.fixed_dictionaries({
            "length": st.one_of(st.integers(-2, 6), json_values),
            "kind": st.sampled_from([*(k.value for k in SpanKind), "nope", 3]),
            "session_id": st.one_of(st.none(), st.text(max_size=4), st.integers()),
            "age": st.one_of(st.integers(-2, 9), json_values),
        }), max_size=4)),
    }),
)
token_arrays = st.one_of(
    st.lists(st.integers(-3, 2**40), max_size=12).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(allow_nan=True), max_size=6).map(np.array),
    st.lists(st.text(max_size=3), max_size=4).map(np.array),
    st.just(np.zeros((2, 2), dtype=np.int64)),
    st.just(np.array(7)),
    st.lists(st.integers(0, 2**64 - 1), max_size=4).map(lambda v: np.array(v, dtype=np.uint64)),
)


@FAST
@given(headers, token_arrays, st.booleans())
def test_store_reader_on_arbitrary_headers_and_arrays(header, tokens, header_as_bytes) -> None:
    buffer = io.BytesIO()
    encoded = json.dumps(header).encode()
    raw_header = np.frombuffer(encoded, np.uint8) if header_as_bytes else np.array([len(encoded)], dtype=np.int32)
    np.savez(buffer, tokens=tokens, header=raw_header)
    _check_store_file(buffer.getvalue())
