"""Trace replay on hand-built traces with the byte-level test tokenizer (no model)."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from hvd_agents.chat.prompt_templates import load_template
from hvd_agents.chat.render import to_template_messages
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.features import CacheDraftFeatures
from hvd_agents.trace.loader import TraceFile, load_trace
from hvd_agents.trace.replay import ReplayConfig, conversation_turns, replay_trace, reply_tokens
from hvd_agents.trace.stats import TARGET_KIND
from hvd_agents.trace.strategies import POLICIES, resolve_policy_names
from tests.helpers import IM_END_ID, make_byte_tokenizer
from tests.trace_data import REPEATED, conversations, copy_conversation, write_jsonl

ALL = ("ar", "pld", "suffix-local", "suffix", "suffix-threshold", "oracle")


@pytest.fixture(scope="module")
def tok():
    return make_byte_tokenizer()


@pytest.fixture()
def trace(tmp_path) -> TraceFile:
    return load_trace(write_jsonl(tmp_path / "t.jsonl", conversations()))


def run(tok, trace, policies=ALL, **kwargs):
    steps = []
    result = replay_trace(tok, trace, ReplayConfig(tuple(policies), **kwargs), step_sink=steps.append, progress=False)
    return result, steps


def test_reply_tokens_are_the_rendered_reply_then_im_end(tok) -> None:
    messages = copy_conversation("f1")["messages"]
    tools = copy_conversation("f1")["tools"]
    for index in (2, 4):
        ids = reply_tokens(tok, messages, tools, index)
        assert ids[-1] == IM_END_ID
        lowered = to_template_messages(messages[: index + 1], tools)[-1]["content"]
        assert tok.decode(ids[:-1]) == lowered
    assert tok.decode(reply_tokens(tok, messages, tools, 2)[:-1]).startswith('<tool_call>\n{"name": "read_file"')


def test_ar_has_one_step_per_token_and_speedup_one(tok, trace) -> None:
    result, _ = run(tok, trace, ("ar",))
    fig = result.stats["ar"].figures(0.02)
    assert fig["steps"] == fig["output_tokens"] > 0
    assert fig["est_speedup"] == 1.0 and fig["drafted_tokens"] == 0
    assert fig["requests"] == result.turns == 3 + 4 + 3


def test_exact_repeat_is_copied_in_chunks_of_k_plus_one(tok, trace) -> None:
    k = 16
    _, steps = run(tok, trace, ("suffix-local", "suffix"), k=k)
    target = reply_tokens(tok, copy_conversation("f1")["messages"], None, 8)
    assert tok.decode(target[:-1]) == REPEATED
    for policy in ("suffix-local", "suffix"):
        last = [s for s in steps if s.policy == policy and s.conversation == "f1" and s.message_index == 8]
        assert sum(s.accepted + 1 for s in last) == len(target)
        # every step accepts min(k, remaining - 1): the earlier identical reply is the draft
        assert len(last) == math.ceil(len(target) / (k + 1))
        assert all(s.source.startswith("suffix:") for s in last)


def test_oracle_bounds_every_policy_and_wastes_nothing(tok, trace) -> None:
    result, _ = run(tok, trace)
    figures = {name: stats.figures(0.02) for name, stats in result.stats.items()}
    assert figures["oracle"]["wasted_tokens"] == 0
    assert figures["oracle"]["steps"] == figures["suffix"]["steps"]
    for name in ALL:
        assert figures["oracle"]["est_speedup"] >= figures[name]["est_speedup"], name
    assert figures["suffix"]["est_speedup"] > figures["ar"]["est_speedup"]


def test_tree_oracle_wastes_nothing_and_bounds_the_single_draft_oracle(tok, trace) -> None:
    result, steps = run(tok, trace, ("suffix", "hvd", "oracle", "oracle-tree"))
    figures = {name: stats.figures(0.02) for name, stats in result.stats.items()}
    assert figures["oracle-tree"]["wasted_tokens"] == 0
    assert figures["oracle-tree"]["est_speedup"] >= figures["oracle"]["est_speedup"]
    assert figures["oracle-tree"]["steps"] <= figures["oracle"]["steps"]
    # off the proposal's path: nothing for a policy that verifies (a cut of) the proposal itself
    assert figures["oracle"]["off_path_tokens"] == figures["suffix"]["off_path_tokens"] == 0
    for name in ("hvd", "oracle-tree"):
        mine = [s for s in steps if s.policy == name and s.cache_drafted]
        assert figures[name]["off_path_tokens"] == sum(max(s.accepted - s.cache_accepted, 0) for s in mine)


def test_cross_request_store_beats_local_on_a_repeated_conversation(tok, trace) -> None:
    _, steps = run(tok, trace, ("suffix-local", "suffix"))
    per = defaultdict(int)
    for s in steps:
        if s.conversation == "w2":
            per[s.policy] += 1
    assert per["suffix"] < per["suffix-local"]
    first_turn = [s for s in steps if s.policy == "suffix" and s.conversation == "w2" and s.turn == 0]
    assert any(isinstance(s.features, CacheDraftFeatures) and s.features.from_store == 1.0 for s in first_turn)


def test_tool_output_copied_into_the_answer_is_drafted_from_it(tok, trace) -> None:
    result, steps = run(tok, trace, ("pld", "suffix"))
    answer = [s for s in steps if s.conversation == "f1" and s.message_index == 4]
    for policy in ("pld", "suffix"):
        mine = [s for s in answer if s.policy == policy]
        assert sum(s.accepted for s in mine) > 0.6 * sum(s.accepted + 1 for s in mine), policy
    assert result.stats["suffix"].accepted_by_kind["tool_output"] > 0


def test_step_records_sum_to_the_table_totals(tok, trace) -> None:
    result, steps = run(tok, trace)
    for name, stats in result.stats.items():
        mine = [s for s in steps if s.policy == name]
        assert len(mine) == stats.steps
        assert sum(s.drafted for s in mine) == stats.drafted_tokens
        assert sum(s.accepted for s in mine) == stats.accepted_tokens
        assert sum(s.accepted + 1 for s in mine) == stats.output_tokens
        assert sum(1 for s in mine if s.drafted) == stats.drafted_steps
        assert all(0 <= s.accepted <= s.drafted <= 16 for s in mine)
        cost = stats.steps + 0.02 * stats.drafted_tokens
        assert stats.figures(0.02)["est_speedup"] == pytest.approx(stats.output_tokens / cost)


def test_threshold_rule(tok, trace) -> None:
    never, _ = run(tok, trace, ("suffix-threshold", "ar"), threshold=10_000)
    assert never.stats["suffix-threshold"].steps == never.stats["ar"].steps
    always, _ = run(tok, trace, ("suffix-threshold", "suffix"), threshold=0)
    assert always.stats["suffix-threshold"].steps == always.stats["suffix"].steps
    _, steps = run(tok, trace, ("suffix-threshold",), k=8)
    drafted = [s for s in steps if s.drafted]
    assert drafted and all(s.features.match_len >= 8 for s in drafted)


def test_highlight_keeps_provenance_of_every_reply_token(tok, trace) -> None:
    result, _ = run(tok, trace, ("ar", "suffix"))
    assert result.highlight_id == "w1" and result.highlight_policy == "suffix"
    turns = conversation_turns(tok, trace.conversations[0])
    assert [t.tokens for t in result.highlight_turns] == [list(t.target) for t in turns]
    for mark in result.highlight_turns:
        assert len(mark.kinds) == len(mark.tokens) and mark.kinds[-1] == TARGET_KIND


def test_prompt_transforms_keep_the_targets(tok, trace) -> None:
    plain, _ = run(tok, trace, ("ar", "suffix"))
    tuned, _ = run(tok, trace, ("ar", "suffix"), canonical_tools=True, system_template=load_template("agent-system"))
    assert tuned.stats["ar"].output_tokens == plain.stats["ar"].output_tokens
    assert tuned.turns == plain.turns


def test_policy_names() -> None:
    names, notes = resolve_policy_names("pld, hvd-cache,suffix,ar")
    assert names == ["pld", "suffix", "ar"]
    assert notes == []
    with pytest.raises(InvalidRequestError, match="unknown policy 'nope'.*suffix-threshold"):
        resolve_policy_names("pld,nope")
    with pytest.raises(InvalidRequestError):
        resolve_policy_names(" , ")
    all_names, _ = resolve_policy_names(None)
    assert set(all_names) <= set(POLICIES) and "oracle" in all_names


def test_bad_k_is_rejected(tok, trace) -> None:
    with pytest.raises(InvalidRequestError, match="k must be"):
        run(tok, trace, ("ar",), k=0)
