"""Hermes tool calls: rendering, parsing (never raising on model output), tools system block."""

from __future__ import annotations

import json
import re

import pytest

from hvd_agents.chat.toolcalls import (
    InvalidToolCall,
    ParsedOutput,
    ToolCall,
    normalize_tool,
    parse_tool_calls,
    render_tool_call,
    render_tools_system_block,
)
from hvd_agents.errors import InvalidRequestError

ID_RE = re.compile(r"^call_[0-9a-f]{24}$")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_render_tool_call_exact_format_and_key_order() -> None:
    text = render_tool_call("f", {"z": 1, "a": "é"})
    assert text == '<tool_call>\n{"name": "f", "arguments": {"z": 1, "a": "é"}}\n</tool_call>'


def test_render_then_parse_round_trips() -> None:
    parsed = parse_tool_calls(render_tool_call("get_weather", {"city": "Zürich", "days": [1, 2]}))
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", {"city": "Zürich", "days": [1, 2]})]
    assert ID_RE.match(parsed.tool_calls[0].id)
    assert parsed.invalid_tool_calls == ()


# (intent, text, content, valid (name, arguments) pairs, invalid (name, error substring) pairs)
CASES = [
    (
        "plain text, no calls",
        "  Just an answer.\n",
        "Just an answer.",
        [],
        [],
    ),
    (
        "two calls in one turn, in order, with text before",
        "Let me check.\n"
        + block('{"name": "a", "arguments": {"x": 1}}')
        + "\n"
        + block('{"name": "b", "arguments": {}}'),
        "Let me check.",
        [("a", {"x": 1}), ("b", {})],
        [],
    ),
    (
        "text before and after a call is kept as content",
        "Before " + block('{"name": "a", "arguments": {}}') + " after",
        "Before  after",
        [("a", {})],
        [],
    ),
    (
        "bad JSON is an invalid call (name recovered), the good call still parses",
        block('{"name": "broken", "arguments": {"x": }') + block('{"name": "ok", "arguments": {"y": 2}}'),
        "",
        [("ok", {"y": 2})],
        [("broken", "invalid JSON")],
    ),
    (
        "arguments given as a JSON string holding an object are decoded",
        block('{"name": "s", "arguments": "{\\"q\\": \\"hi\\"}"}'),
        "",
        [("s", {"q": "hi"})],
        [],
    ),
    (
        "arguments that are a string not holding JSON are invalid",
        block('{"name": "s", "arguments": "not json"}'),
        "",
        [],
        [("s", "not valid JSON")],
    ),
    (
        "arguments that are not an object are invalid",
        block('{"name": "s", "arguments": [1, 2]}'),
        "",
        [],
        [("s", "must be a JSON object")],
    ),
    (
        "missing name is invalid",
        block('{"arguments": {}}'),
        "",
        [],
        [(None, "name")],
    ),
    (
        "a block that is not a JSON object is invalid",
        block("[1, 2]"),
        "",
        [],
        [(None, "not a JSON object")],
    ),
    (
        "missing arguments means no arguments",
        block('{"name": "noargs"}'),
        "",
        [("noargs", {})],
        [],
    ),
    (
        "an unterminated final block (generation cut) is invalid; earlier text stays content",
        "Sure. " + block('{"name": "a", "arguments": {}}') + ' <tool_call>\n{"name": "cut", "argu',
        "Sure.",
        [("a", {})],
        [("cut", "unterminated")],
    ),
]


@pytest.mark.parametrize(("intent", "text", "content", "valid", "invalid"), CASES, ids=[c[0] for c in CASES])
def test_parse_table(intent, text, content, valid, invalid) -> None:
    parsed = parse_tool_calls(text)
    assert isinstance(parsed, ParsedOutput)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == valid
    assert [c.name for c in parsed.invalid_tool_calls] == [name for name, _ in invalid]
    for call, (_, error) in zip(parsed.invalid_tool_calls, invalid):
        assert error in call.error
        assert isinstance(call, InvalidToolCall) and ID_RE.match(call.id)
    assert all(isinstance(c, ToolCall) and ID_RE.match(c.id) for c in parsed.tool_calls)


def test_ids_are_unique_unless_provided() -> None:
    text = block('{"name": "a", "arguments": {}}') * 2 + block('{"name": "b", "arguments": {}, "id": "mine"}')
    ids = [c.id for c in parse_tool_calls(text).tool_calls]
    assert ids[0] != ids[1] and ids[2] == "mine"


@pytest.mark.parametrize("text", ["", "<tool_call>", "</tool_call>", "<tool_call></tool_call>", "<tool_call>{}\n"])
def test_parse_never_raises(text: str) -> None:
    parse_tool_calls(text)


def test_system_block_layout() -> None:
    bare = {"name": "ping", "description": "Ping ünïcode", "parameters": {"type": "object", "properties": {}}}
    text = render_tools_system_block([WEATHER, bare])
    lines = text.split("\n")
    assert lines[0].startswith("You may call one or more functions to assist with the user query.")
    assert lines[0].endswith("You are provided with function signatures within <tools></tools> XML tags:")
    start, end = lines.index("<tools>"), lines.index("</tools>")
    assert [json.loads(line) for line in lines[start + 1 : end]] == [WEATHER["function"], bare]
    assert lines[start + 1] == json.dumps(WEATHER["function"], ensure_ascii=False)  # keys as given
    assert "Ping ünïcode" in lines[start + 2]  # ensure_ascii=False
    assert text.endswith(
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@pytest.mark.parametrize(
    "tools",
    [[WEATHER, {"type": "function", "function": {"description": "no name"}}], [WEATHER, {"description": "x"}]],
)
def test_system_block_rejects_schema_without_name_naming_index(tools) -> None:
    with pytest.raises(InvalidRequestError, match=r"tools\[1\]"):
        render_tools_system_block(tools)


def test_normalize_tool_accepts_both_shapes() -> None:
    assert normalize_tool(WEATHER) == WEATHER["function"]
    assert normalize_tool(WEATHER["function"]) == WEATHER["function"]
    with pytest.raises(InvalidRequestError):
        normalize_tool("get_weather")
