"""Chat layer: validation, tools block placement, tool-call rendering, prefix stability."""

from __future__ import annotations

import itertools
import json
from functools import lru_cache

import pytest

from hvd_agents.chat.render import encode_prompt, render_prompt, to_template_messages
from hvd_agents.chat.toolcalls import parse_tool_calls, render_tool_call, render_tools_system_block
from hvd_agents.errors import InvalidRequestError
from tests.helpers import make_byte_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
BLOCK = render_tools_system_block(TOOLS)

# A full agent turn: system, user, assistant with two tool calls, two tool results, answer, next user.
CONVERSATION = [
    {"role": "system", "content": "Be concise."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris"}, {"type": "text", "text": "and Oslo?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 9}'},
    {"role": "assistant", "content": "Paris 21°C, Oslo 9°C."},
    {"role": "user", "content": "Thanks!"},
]


@lru_cache(maxsize=2)
def tokenizer(with_chat_template: bool = True):
    return make_byte_tokenizer(with_chat_template=with_chat_template)


def test_tools_block_appended_to_existing_system_message() -> None:
    out = to_template_messages(CONVERSATION[:2], TOOLS)
    assert out[0] == {"role": "system", "content": "Be concise.\n\n" + BLOCK}
    assert out[1] == {"role": "user", "content": "Weather in Paris\nand Oslo?"}


def test_tools_block_creates_system_message_when_missing() -> None:
    out = to_template_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert out == [{"role": "system", "content": BLOCK}, {"role": "user", "content": "hi"}]
    # Without tools nothing is added (the model template supplies its default system prompt).
    assert to_template_messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]


def test_assistant_tool_calls_rendered_after_content() -> None:
    out = to_template_messages(CONVERSATION)
    paris, oslo = render_tool_call("get_weather", {"city": "Paris"}), render_tool_call("get_weather", {"city": "Oslo"})
    calls = paris + "\n" + oslo
    assert out[2] == {"role": "assistant", "content": calls}  # content None: the calls only
    with_text = {**CONVERSATION[2], "content": "Checking."}
    assert to_template_messages([with_text])[0]["content"] == "Checking.\n" + calls
    # What the chat layer renders, the parser reads back.
    parsed = parse_tool_calls(to_template_messages([with_text])[0]["content"])
    assert parsed.content == "Checking."
    assert [c.arguments for c in parsed.tool_calls] == [{"city": "Paris"}, {"city": "Oslo"}]


def test_tool_messages_wrapped_in_tool_response() -> None:
    out = to_template_messages(CONVERSATION)
    assert out[3] == {"role": "tool", "content": '<tool_response>\n{"temp": 21}\n</tool_response>'}
    assert all(isinstance(m["content"], str) and set(m) == {"role", "content"} for m in out)


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("with_chat_template", [True, False])
def test_rendering_is_prefix_stable(tools, with_chat_template: bool) -> None:
    tok = tokenizer(with_chat_template)
    for messages in (CONVERSATION, CONVERSATION[1:]):  # with and without a system message
        prompts = [
            render_prompt(tok, messages[:n], tools, add_generation_prompt=False) for n in range(1, len(messages) + 1)
        ]
        for shorter, longer in itertools.pairwise(prompts):
            assert longer.startswith(shorter) and len(longer) > len(shorter)
        with_generation = render_prompt(tok, messages, tools)
        assert with_generation == prompts[-1] + "<|im_start|>assistant\n"
        assert render_prompt(tok, messages, tools) == with_generation  # deterministic


def test_render_with_model_template_and_builtin_chatml() -> None:
    messages = [{"role": "user", "content": "hi"}]
    with_template = render_prompt(tokenizer(True), messages)
    assert with_template == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    builtin = render_prompt(tokenizer(False), messages, TOOLS, add_generation_prompt=False)
    assert builtin == f"<|im_start|>system\n{BLOCK}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_encode_prompt_tokenizes_template_specials_once() -> None:
    tok = tokenizer(True)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    ids = encode_prompt(tok, messages)
    text = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tok(text, add_special_tokens=False).input_ids
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
    assert tok.decode(ids) == render_prompt(tok, messages)


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "messages is empty"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], r"messages\[1\].*'robot'"),
        ([{"content": "no role"}], r"messages\[0\] has no role"),
        ([{"role": "user", "content": 42}], r"messages\[0\]\.content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], r"messages\[0\]\.content\[0\]"),
        (["not a dict"], r"messages\[0\]"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
            r"messages\[0\].*JSON object",
        ),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], r"messages\[0\].*name"),
        ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}], r"messages\[0\].*assistant"),
    ],
)
def test_invalid_messages_raise(messages, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        to_template_messages(messages)


@pytest.mark.parametrize("arguments", ["{bad", '{"city": "Par', "[" * 100_000])
def test_tool_call_arguments_that_are_not_json_render_as_written(arguments, caplog) -> None:
    """A call cut short or written wrong, sent back as the history holds it, renders as the text it is."""
    messages = [{"role": "user", "content": "a"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]}]
    with caplog.at_level("WARNING", logger="hvd_agents.chat.render"):
        rendered = to_template_messages(messages)
    assert rendered[1]["content"] == f'<tool_call>\n{{"name": "f", "arguments": {arguments}}}\n</tool_call>'
    assert "messages[1].tool_calls[0].function.arguments is not valid JSON" in caplog.text


def test_invalid_tool_schema_raises() -> None:
    with pytest.raises(InvalidRequestError, match=r"tools\[0\]"):
        to_template_messages([{"role": "user", "content": "x"}], [{"type": "function", "function": {}}])


def test_input_messages_are_not_mutated() -> None:
    before = json.dumps(CONVERSATION, sort_keys=True)
    to_template_messages(CONVERSATION, TOOLS)
    assert json.dumps(CONVERSATION, sort_keys=True) == before
