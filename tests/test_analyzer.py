"""Tests of the prompt-structure analyzer on the in-process byte tokenizer (no model)."""

from __future__ import annotations

import json

import pytest

from hvd_agents.chat.analyzer import analyze, derive_session_id, kind_by_token, register, skeleton_texts
from hvd_agents.chat.render import encode_prompt, render_prompt
from hvd_agents.chat.toolcalls import (
    forced_call_prefix,
    parse_tool_calls,
    render_tool_call,
    render_tools_system_block,
)
from hvd_agents.structure import PromptStructure, SpanKind, TypedSpan
from tests.helpers import make_byte_tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
# A bare function dict without arguments, and a non-ASCII name and key.
CLOCK_TOOL = {"name": "now", "description": "The time."}
EURO_TOOL = {"name": "préparer", "parameters": {"properties": {"café": {"type": "string"}}}}
TOOLS = [WEATHER_TOOL, CLOCK_TOOL, EURO_TOOL]

SYSTEM = "You are a terse weather bot."
USER = "What is the weather in Paris?"
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RESULT = '{"temp": 21, "sky": "clear ☀"}'

# The conversations the analyzer sees during one tool-using exchange, turn by turn.
TURN_1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
TURN_2 = [
    *TURN_1,
    {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
]
TURN_3 = [
    *TURN_2,
    {"role": "assistant", "content": "It is 21 degrees and clear."},
    {"role": "user", "content": [{"type": "text", "text": "And in Oslo?"}, {"type": "text", "text": "Thanks!"}]},
]
# No system message (the template injects its default), a call without text, two calls.
NO_SYSTEM = [
    {"role": "user", "content": "Weather in Rome and the time? 😀"},
    {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": "noon"},
]

CASES = [
    pytest.param(TURN_1, None, True, "", id="plain"),
    pytest.param(TURN_1, TOOLS, True, "", id="tools"),
    pytest.param(TURN_2, TOOLS, True, "", id="call-and-result"),
    pytest.param(TURN_3, TOOLS, True, "", id="three-turns"),
    pytest.param(TURN_3, TOOLS, False, "", id="no-generation-prompt"),
    pytest.param(NO_SYSTEM, [WEATHER_TOOL], True, "", id="no-system-two-calls"),
    pytest.param(NO_SYSTEM, None, True, "", id="no-system-no-tools"),
    pytest.param(TURN_1, TOOLS, True, forced_call_prefix("get_weather", TOOLS), id="forced-call"),
    pytest.param(TURN_1, None, True, "Sure: ", id="text-prefix"),
]


@pytest.fixture(scope="module")
def tokenizer():
    return make_byte_tokenizer()


def span_text(tokenizer, structure: PromptStructure, span: TypedSpan) -> str:
    return tokenizer.decode(list(structure.prompt_ids[span.start : span.end]))


def texts_of(tokenizer, structure: PromptStructure, kind: SpanKind) -> list[str]:
    return [span_text(tokenizer, structure, s) for s in structure.spans if s.kind == kind]


@pytest.mark.parametrize(("messages", "tools", "generation", "prefix"), CASES)
def test_prompt_ids_equal_encode_prompt_and_spans_tile_the_prompt(tokenizer, messages, tools, generation, prefix):
    structure = analyze(tokenizer, messages, tools, add_generation_prompt=generation, assistant_prefix=prefix)
    expected = encode_prompt(tokenizer, messages, tools, add_generation_prompt=generation, assistant_prefix=prefix)
    assert list(structure.prompt_ids) == expected
    # Sorted, non-empty, non-overlapping, and together covering every token.
    position = 0
    for span in structure.spans:
        assert span.start == position < span.end
        position = span.end
    assert position == len(expected)
    # Adjacent spans of the same kind are merged.
    assert all(a.kind != b.kind for a, b in zip(structure.spans, structure.spans[1:]))
    # The decoded spans, concatenated, give back the prompt text.
    text = render_prompt(tokenizer, messages, tools, add_generation_prompt=generation) + prefix
    assert "".join(span_text(tokenizer, structure, s) for s in structure.spans) == text


def test_each_message_content_gets_its_kind(tokenizer):
    structure = analyze(tokenizer, TURN_3, TOOLS)
    assert texts_of(tokenizer, structure, SpanKind.SYSTEM) == [SYSTEM + "\n\n"]
    assert texts_of(tokenizer, structure, SpanKind.TOOL_SCHEMA) == [render_tools_system_block(TOOLS)]
    assert texts_of(tokenizer, structure, SpanKind.USER) == [USER, "And in Oslo?\nThanks!"]
    # The assistant text before a call keeps its joining newline; the call is typed apart.
    assert texts_of(tokenizer, structure, SpanKind.ASSISTANT_TEXT) == ["Let me check.\n", "It is 21 degrees and clear."]
    call = render_tool_call("get_weather", {"city": "Paris"})
    assert texts_of(tokenizer, structure, SpanKind.ASSISTANT_TOOL_CALL) == [call]
    (tool_output,) = texts_of(tokenizer, structure, SpanKind.TOOL_OUTPUT)
    assert RESULT in tool_output and tool_output.startswith("<tool_response>")
    # Template markup: role headers, end-of-turn markers and the generation prompt.
    template = texts_of(tokenizer, structure, SpanKind.TEMPLATE)
    assert template[0] == "<|im_start|>system\n"
    assert "<|im_end|>\n<|im_start|>user\n" in template
    assert template[-1] == "<|im_end|>\n<|im_start|>assistant\n"
    assert kind_by_token(structure) == [structure.kind_at(i) for i in range(len(structure.prompt_ids))]


def test_no_system_two_calls_and_injected_default_system(tokenizer):
    # The template's default system prompt is markup here; the inserted tools block is TOOL_SCHEMA.
    structure = analyze(tokenizer, NO_SYSTEM, [WEATHER_TOOL])
    assert texts_of(tokenizer, structure, SpanKind.SYSTEM) == []
    assert texts_of(tokenizer, structure, SpanKind.TOOL_SCHEMA) == [render_tools_system_block([WEATHER_TOOL])]
    assert texts_of(tokenizer, structure, SpanKind.USER) == ["Weather in Rome and the time? 😀"]
    assert texts_of(tokenizer, structure, SpanKind.ASSISTANT_TEXT) == []
    call = render_tool_call("get_weather", {"city": "Paris"})
    assert texts_of(tokenizer, structure, SpanKind.ASSISTANT_TOOL_CALL) == [f"{call}\n{call}"]
    outputs = texts_of(tokenizer, structure, SpanKind.TOOL_OUTPUT)
    assert len(outputs) == 2 and "sunny" in outputs[0] and "noon" in outputs[1]
    plain = analyze(tokenizer, NO_SYSTEM)
    assert "You are a helpful AI assistant" in texts_of(tokenizer, plain, SpanKind.TEMPLATE)[0]


def test_assistant_prefix_is_typed(tokenizer):
    prefix = forced_call_prefix("get_weather", TOOLS)
    structure = analyze(tokenizer, TURN_1, TOOLS, assistant_prefix=prefix)
    assert structure.spans[-1].kind == SpanKind.ASSISTANT_TOOL_CALL
    assert span_text(tokenizer, structure, structure.spans[-1]) == prefix
    # A plain-text prefix is assistant text, after the generation prompt.
    text = analyze(tokenizer, TURN_1, assistant_prefix="Sure: ")
    assert text.spans[-1].kind == SpanKind.ASSISTANT_TEXT
    assert span_text(tokenizer, text, text.spans[-1]) == "Sure: "
    assert span_text(tokenizer, text, text.spans[-2]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(("messages", "tools", "generation", "prefix"), CASES)
def test_every_content_character_is_covered(tokenizer, messages, tools, generation, prefix):
    # Whatever is typed TEMPLATE holds only template markup: with the contents
    # removed from the prompt text, the template pieces are all that remains.
    structure = analyze(tokenizer, messages, tools, add_generation_prompt=generation, assistant_prefix=prefix)
    typed = "".join(
        span_text(tokenizer, structure, s) for s in structure.spans if s.kind != SpanKind.TEMPLATE
    )
    template = "".join(texts_of(tokenizer, structure, SpanKind.TEMPLATE))
    markup = template
    for marker in ("<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_start|>tool\n"):
        markup = markup.replace(marker, "")
    markup = markup.replace("<|im_end|>\n", "")
    markup = markup.replace("You are a helpful AI assistant named SmolLM, trained by Hugging Face", "")
    assert markup == ""
    text = render_prompt(tokenizer, messages, tools, add_generation_prompt=generation) + prefix
    assert len(typed) + len(template) == len(text)


def test_session_ids_are_stable_within_a_conversation(tokenizer):
    ids = {analyze(tokenizer, turn, TOOLS).session_id for turn in (TURN_1, TURN_2, TURN_3)}
    assert len(ids) == 1
    (session,) = ids
    assert len(session) == 16 and int(session, 16) >= 0
    # Tools do not change the id; another user question or system prompt does.
    assert analyze(tokenizer, TURN_1).session_id == session
    other_user = [TURN_1[0], {"role": "user", "content": "Weather in Oslo?"}]
    other_system = [{"role": "system", "content": "Be verbose."}, TURN_1[1]]
    assert len({session, derive_session_id(other_user), derive_session_id(other_system)}) == 3
    assert derive_session_id(NO_SYSTEM) == derive_session_id(NO_SYSTEM[:1])
    # A given id is passed through.
    assert analyze(tokenizer, TURN_2, session_id="abc").session_id == "abc"


def test_skeletons_match_the_calls_the_model_emits(tokenizer):
    opening, full = skeleton_texts(WEATHER_TOOL)
    assert opening == '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    assert full == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "", "unit": ""}}\n</tool_call>'
    assert render_tool_call("get_weather", {"city": "x"}).startswith(opening)
    euro_opening, euro_full = skeleton_texts(EURO_TOOL)
    assert render_tool_call("préparer", {"café": "x"}).startswith(euro_opening)
    assert skeleton_texts(CLOCK_TOOL) == [render_tool_call("now", {})]
    for text in (full, euro_full, *skeleton_texts(CLOCK_TOOL)):
        parsed = parse_tool_calls(text)
        assert not parsed.invalid_tool_calls and len(parsed.tool_calls) == 1
    (call,) = parse_tool_calls(full).tool_calls
    assert (call.name, call.arguments) == ("get_weather", {"city": "", "unit": ""})
    # The extras are these texts tokenized without special tokens, typed as skeletons.
    structure = analyze(tokenizer, TURN_1, TOOLS)
    expected = [opening, full, render_tool_call("now", {}), euro_opening, euro_full]
    assert [tokenizer.decode(list(ids)) for ids, _ in structure.extra] == expected
    assert {kind for _, kind in structure.extra} == {SpanKind.TOOL_CALL_SKELETON}
    assert analyze(tokenizer, TURN_1).extra == ()


class FakeStore:
    """Records add() calls; an identical (tokens, kind, session) is not new."""

    token_budget = 1_000_000

    def __init__(self):
        self.calls: list[tuple[tuple[int, ...], SpanKind, str | None]] = []

    def add(self, token_ids, kind, session_id):
        entry = (tuple(token_ids), kind, session_id)
        new = entry not in self.calls
        self.calls.append(entry)
        return new


def test_register_adds_non_template_spans_and_skeletons(tokenizer):
    store = FakeStore()
    structure = analyze(tokenizer, TURN_2, TOOLS)
    registered = [s for s in structure.spans if s.kind != SpanKind.TEMPLATE and s.end - s.start >= 2]
    assert register(store, structure) == len(registered) + len(structure.extra)
    assert store.calls[: len(registered)] == [
        (structure.prompt_ids[s.start : s.end], s.kind, structure.session_id) for s in registered
    ]
    assert [(ids, kind) for ids, kind, _ in store.calls[len(registered) :]] == list(structure.extra)
    # The next turn repeats the system, tools, first user message, call and skeletons: only the rest is new.
    before = len(store.calls)
    later = analyze(tokenizer, TURN_3, TOOLS)
    new = register(store, later)
    assert len(store.calls) - before == sum(
        1 for s in later.spans if s.kind != SpanKind.TEMPLATE and s.end - s.start >= 2
    ) + len(later.extra)
    assert new == 2  # the second assistant text and the second user message


def test_register_skips_short_spans():
    store = FakeStore()
    structure = PromptStructure(
        (1, 2, 3, 4, 5),
        (TypedSpan(0, 1, SpanKind.USER), TypedSpan(1, 3, SpanKind.TEMPLATE), TypedSpan(3, 5, SpanKind.USER)),
        "s",
        (((9,), SpanKind.TOOL_CALL_SKELETON), ((7, 8), SpanKind.TOOL_CALL_SKELETON)),
    )
    assert register(store, structure) == 2
    assert store.calls == [((4, 5), SpanKind.USER, "s"), ((7, 8), SpanKind.TOOL_CALL_SKELETON, "s")]
    assert register(store, structure) == 0


def test_slow_tokenizer_falls_back_to_one_prompt_span(tokenizer):
    class NoOffsets:
        is_fast = False
        chat_template = tokenizer.chat_template

        def apply_chat_template(self, *args, **kwargs):
            return tokenizer.apply_chat_template(*args, **kwargs)

        def __call__(self, text, **kwargs):
            assert "return_offsets_mapping" not in kwargs
            return tokenizer(text, **kwargs)

    structure = analyze(NoOffsets(), TURN_2, TOOLS)
    assert list(structure.prompt_ids) == encode_prompt(tokenizer, TURN_2, TOOLS)
    assert structure.spans == (TypedSpan(0, len(structure.prompt_ids), SpanKind.PROMPT),)
    assert len(structure.extra) == 5
    assert set(kind_by_token(structure)) == {SpanKind.PROMPT}


def test_invalid_requests_raise_like_encode_prompt(tokenizer):
    from hvd_agents.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        analyze(tokenizer, TURN_1, assistant_prefix="x", add_generation_prompt=False)
    with pytest.raises(InvalidRequestError):
        analyze(tokenizer, [{"role": "wizard", "content": "hi"}])
    with pytest.raises(InvalidRequestError):
        analyze(tokenizer, [])


def test_skeleton_json_conventions():
    # Keys with quotes and non-ASCII survive as the model would emit them.
    tool = {"name": "q", "parameters": {"properties": {'a"b': {}, "ü": {}}}}
    opening, full = skeleton_texts(tool)
    assert render_tool_call("q", {'a"b': "x"}).startswith(opening)
    assert opening.endswith(json.dumps('a"b') + ": ")
    assert full == render_tool_call("q", {'a"b': "", "ü": ""})
