"""hvd-agents bench-agents: recording an agent's calls, the shipped recordings, the arms and a short replay.

The recorder and the arms' pieces run on the tiny model; the shipped recordings and the
replay run on the embedded model (one call, a few tokens).
"""

from __future__ import annotations

import json

import pytest

import hvd_agents.chat.request as chat_request
from hvd_agents.bench import llama_cpp
from hvd_agents.bench.agent_arms import EngineArm, HFArm, ReplayCall, StopRule, TimedDrafter
from hvd_agents.bench.agents import replay_calls, resolve_arms, run_agents_benchmark
from hvd_agents.bench.recorded import RecordedConversation, load_conversations, prompt_digest, shipped_names
from hvd_agents.bench.recorder import record_calls
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.delta_stream import collect, stream_reply_deltas
from hvd_agents.chat.request import ChatSettings, build_chat_request
from hvd_agents.drafters.base import NoDrafter
from hvd_agents.engine import Engine
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy import CostModel

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}]


@pytest.fixture
def tiny_engine(tiny_model, byte_tokenizer) -> Engine:
    return Engine(tiny_model, byte_tokenizer, eos_token_ids=(), cost_model=CostModel.linear(0.02), draft_head=None,
                  context_window=2048)  # tool schemas take some 600 byte tokens


def _chat(engine: Engine, messages: list[dict], **kwargs) -> str:
    request = build_chat_request(engine, messages, TOOLS, settings=ChatSettings(method="hvd", max_tokens=12),
                                 session_id="s", **kwargs)
    return collect(stream_reply_deltas(request)).parsed().content


def test_recorder_keeps_each_calls_request_and_reply_and_restores_the_chat_path(tiny_engine, tmp_path) -> None:
    messages = [{"role": "system", "content": "Look keys up."}, {"role": "user", "content": "key abc?"}]
    with record_calls(tiny_engine, "tiny", title="t", command="c", steering="s") as recording:
        _chat(tiny_engine, messages, tool_choice="lookup")
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "abc"}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": '{"abc": 1}'}]
        _chat(tiny_engine, messages, tool_choice="none")
        _chat(tiny_engine, [{"role": "user", "content": "history rewritten"}])
    assert chat_request.prepare is prepare and "stream" not in vars(tiny_engine)  # the chat path as it was
    path = tmp_path / "tiny.json"
    recording.conversation().save(path)
    conv = RecordedConversation.load(path)
    assert [call.messages for call in conv.calls[:2]] == [2, 4] and conv.calls[2].messages[0]["content"] == \
        "history rewritten"
    assert conv.call_messages(1) == messages and conv.call_tools(0) == TOOLS and len(conv.tool_sets) == 1
    first, second = conv.calls[:2]
    # a forced call is decoded under the tool's grammar: nothing pre-filled, the model writes the call
    assert first.assistant_prefix == "" and "</tool_call>" not in first.stop and first.text.startswith("<tool_call>")
    assert "<tool_call>" in second.stop and second.assistant_prefix == ""
    assert all(len(call.token_ids) <= call.max_new_tokens == 12 and call.method == "hvd" for call in conv.calls)
    # a replay renders each call's prompt again, through prepare, and finds the recorded one
    for index, call in enumerate(conv.calls):
        structure = prepare(tiny_engine, conv.call_messages(index), conv.call_tools(index),
                            session_id=call.session_id, assistant_prefix=call.assistant_prefix)
        assert prompt_digest(structure.prompt_ids) == call.prompt_sha256
    assert [len(c.prompt_ids) for c in replay_calls(tiny_engine, conv, max_turns=2)] == \
        [c.prompt_tokens for c in conv.calls[:2]]


def test_stop_rule_ends_after_the_token_that_completes_a_stop_string(byte_tokenizer) -> None:
    ids = list(b"ab</tool_call>cd")
    rule = StopRule(byte_tokenizer, [256], ["</tool_call>"])
    assert rule.cut(ids, 100) == tuple(b"ab</tool_call>")
    assert rule.cut([*b"xy", 256, *b"z"], 100) == (*b"xy", 256)  # a stop id, kept
    assert rule.cut(ids, 3) == tuple(b"ab<") and not rule.done(list(b"ab</tool")) and not rule.done([])


def test_timed_drafter_counts_steps_and_accepted_lengths(tiny_engine, byte_tokenizer) -> None:
    arm = EngineArm("hvd-cache+reuse", tiny_engine, "hvd-cache", reuse=True)
    arm.start()
    assert isinstance(arm.timed, TimedDrafter) and arm.engine is not tiny_engine
    messages = [{"role": "user", "content": "abcabcabcabcabcabc abcabcabc"}]
    ids = tuple(prepare(arm.engine, messages).prompt_ids)
    call = ReplayCall("c", 0, messages, None, None, "", (), 30, ids)
    figures = arm.run(call)
    assert figures.new_tokens == 30 and figures.steps >= 1 and figures.propose_s > 0 and figures.verify_s > 0
    assert len(figures.accepted_lengths) == sum(1 for _ in figures.accepted_lengths) <= figures.steps
    assert sum(figures.accepted_lengths) == figures.accepted
    plain = EngineArm("ar", tiny_engine, "ar", reuse=False)
    plain.start()
    assert plain.run(call).token_ids == figures.token_ids  # lossless
    hf = HFArm("hf-generate", tiny_engine).run(call)
    assert hf.token_ids == figures.token_ids and hf.steps == 30 and hf.prefill_s > 0 and hf.decode_s > 0
    assert TimedDrafter(NoDrafter()).uses_hidden_states is False


def test_arms_resolve_with_notes_for_what_is_not_installed(monkeypatch) -> None:
    monkeypatch.setattr(llama_cpp, "available", lambda: False)
    names, notes = resolve_arms("hvd,ar,llama.cpp+reuse,arctic")
    assert names[:2] == ["hvd+reuse", "ar"] and "llama.cpp+reuse" not in names
    assert any(note.startswith("llama.cpp+reuse skipped") for note in notes)
    with pytest.raises(InvalidRequestError, match="unknown arm"):
        resolve_arms("nope")
    with pytest.raises(InvalidRequestError, match="unknown conversation"):
        load_conversations(["nope"])


@pytest.mark.real_model
def test_shipped_conversations_replay_the_recorded_prompts(real_engine) -> None:
    names = shipped_names()
    assert names == ["airline_langchain", "calculator_llamaindex", "coding_loop", "own_model"]
    for conv in load_conversations():
        calls = replay_calls(real_engine, conv)  # raises when a prompt is not the recorded one
        assert len(calls) == len(conv.calls) >= 2 and conv.steering and conv.tool_sets
        # steered calls, written whole under the tools' grammar
        assert any(call.text.startswith("<tool_call>") and not call.assistant_prefix for call in conv.calls)
        assert all(call.method == "hvd" and call.token_ids for call in conv.calls)


@pytest.mark.real_model
def test_bench_agents_short_replay_writes_json_and_chart(real_engine, tmp_path, capsys) -> None:
    # a short conversation recorded on the embedded model (the shipped ones have 1K+ token prompts)
    recorded = tmp_path / "short.json"
    messages = [{"role": "user", "content": "Look up key abc."}]
    with record_calls(real_engine, "short") as recording:
        _chat(real_engine, messages, tool_choice="lookup")
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "abc"}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": '{"abc": 1}'}]
        _chat(real_engine, messages, tool_choice="none")
    recording.conversation().save(recorded)
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = run_agents_benchmark(engine=real_engine, arms="hf-generate,ar,hvd+reuse", conversations=[str(recorded)],
                                  max_new_tokens=6, json_path=out_json, chart_path=out_png)
    assert [c.arm for c in result.calls[:3]] == ["hf-generate", "ar", "hvd+reuse"] and len(result.calls) == 6
    assert all(result.differing(arm) == [] for arm in result.arms)  # every arm's tokens equal ar's
    assert all(0 < c.new_tokens <= 6 and c.prefill_s > 0 and c.latency_s >= c.prefill_s for c in result.calls)
    hvd_second = result.arm_calls("hvd+reuse")[1]
    assert hvd_second.reused_tokens > 0  # the second call starts from the first one's KV
    data = json.loads(out_json.read_text())
    assert set(data["arms"]) == {"hf-generate", "ar", "hvd+reuse"} and data["arms"]["ar"]["differs_from_ar"] == []
    assert data["arms"]["hf-generate"]["hvd_speedup"] > 0 and len(data["calls"]) == 6
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "| hvd+reuse |" in out and "| hf-generate | " in out and "where hvd+reuse's time goes" in out
