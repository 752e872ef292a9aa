"""Trace files: JSONL and JSON arrays, validation through the chat layer, file:line errors, skip_bad."""

from __future__ import annotations

import json
import logging

import pytest

from hvd_agents.errors import HVDError, TraceFormatError
from hvd_agents.trace.loader import load_trace
from tests.trace_data import conversations, write_jsonl


def test_jsonl_reads_conversations_in_order(tmp_path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", conversations())
    trace = load_trace(path)
    assert [c.id for c in trace.conversations] == ["w1", "f1", "w2"]
    assert [c.line for c in trace.conversations] == [1, 2, 3]
    assert trace.conversations[0].assistant_indices == [2, 4, 6]
    assert trace.skipped == []


def test_json_array_names_the_line_of_each_element(tmp_path) -> None:
    rows = conversations()
    rows[1] = {"id": "bad", "messages": [{"role": "wizard", "content": "hi"}]}
    text = "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"
    path = tmp_path / "t.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"t\.json:3: .*unknown role"):
        load_trace(path)
    trace = load_trace(path, skip_bad=True)
    assert [c.id for c in trace.conversations] == ["w1", "w2"]
    assert [c.line for c in trace.conversations] == [2, 4]
    assert [b.line for b in trace.skipped] == [3]


def test_broken_json_array_always_raises(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text('[{"messages": [{"role": "user", "content": "hi"}]},\n{"messages": [}\n]', encoding="utf-8")
    with pytest.raises(TraceFormatError, match="t.json:2"):
        load_trace(path, skip_bad=True)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "x", "messages": [', "invalid JSON"),
        ('["not", "an", "object"]', "must be a JSON object"),
        ('{"id": "x"}', "'messages' must be a non-empty list"),
        ('{"id": "x", "messages": []}', "'messages' must be a non-empty list"),
        ('{"id": "x", "messages": [{"role": "user", "content": 5}]}', r"messages\[0\]\.content"),
        ('{"id": "x", "messages": [{"role": "user", "content": "a"}], "tools": {"a": 1}}', "'tools' must be a list"),
        ('{"id": "x", "messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}', "tools"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line: str, message: str) -> None:
    rows = conversations()
    path = write_jsonl(tmp_path / "trace.jsonl", [rows[0], "", bad_line, rows[2]])
    with pytest.raises(TraceFormatError, match=rf"trace\.jsonl:3: .*{message}"):
        load_trace(path)


def test_skip_bad_reports_and_reads_the_rest(tmp_path, caplog) -> None:
    rows = conversations()
    path = write_jsonl(tmp_path / "trace.jsonl", [rows[0], "{oops", rows[1], '{"messages": "hi"}', rows[2]])
    with caplog.at_level(logging.WARNING, logger="hvd_agents.trace.loader"):
        trace = load_trace(path, skip_bad=True)
    assert [c.id for c in trace.conversations] == ["w1", "f1", "w2"]
    assert [b.line for b in trace.skipped] == [2, 4]
    assert "trace.jsonl:2" in caplog.text and "trace.jsonl:4" in caplog.text


def test_tool_call_arguments_that_are_not_json_load_as_written(tmp_path) -> None:
    # a call cut short is real agent history: it renders as the text it is (the chat layer logs a warning)
    row = conversations()[0]
    row["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{""}'
    path = write_jsonl(tmp_path / "trace.jsonl", [row])
    trace = load_trace(path)
    assert trace.conversations[0].messages[2]["tool_calls"][0]["function"]["arguments"] == '{""}'


def test_missing_file_and_errors_are_hvd_errors(tmp_path) -> None:
    with pytest.raises(TraceFormatError, match="does not exist") as info:
        load_trace(tmp_path / "nope.jsonl")
    assert isinstance(info.value, HVDError) and isinstance(info.value, ValueError)


def test_default_ids_limit_and_null_tools(tmp_path) -> None:
    rows = [{"messages": [{"role": "user", "content": "a"}], "tools": None}, {"id": 7, **conversations()[0]}]
    rows[1]["id"] = 7
    path = write_jsonl(tmp_path / "log.jsonl", rows + [conversations()[1]])
    trace = load_trace(path, limit=2)
    assert [c.id for c in trace.conversations] == ["log:1", "7"]
    assert trace.conversations[0].tools == []
