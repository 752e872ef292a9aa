"""The benchmark harnesses' runners (hvd_agents.bench.live), on the tiny model."""

from __future__ import annotations

import time

import pytest

from hvd_agents.bench.live import Split, Tally, _cache_runner, _engine_runner, _hf_runner, _Item, _timed, table_rows
from hvd_agents.bench.prompts import AgentPrompt
from hvd_agents.chat.render import encode_prompt
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.policy import CostModel
from tests.clocks import TickingClock


def test_cache_runner_adds_up_its_runs_steps_by_draft_source(monkeypatch, byte_tokenizer, tiny_model) -> None:
    # the policy's gates weigh its timed work against timed steps, so under load a second run may take other steps
    # to the same tokens: a clock that ticks by the reading makes the two runs' decisions the same
    monkeypatch.setattr(time, "perf_counter", TickingClock().perf_counter)
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), cost_model=CostModel.linear(0.02), draft_head=None)
    prompt = AgentPrompt("repeat", [{"role": "user", "content": "abcabcabcabcabc abcabcabc"}])
    item = _Item(prompt, encode_prompt(byte_tokenizer, prompt.messages, prompt.tools))
    params = GenerationParams(max_new_tokens=40, reuse_prefix=False, method="hvd")
    sources = {}
    run = _cache_runner(engine, params, sources=sources)
    out = run(item)
    assert set(sources) <= {"none", "suffix"} and "none" in sources  # kinds, not per-provenance names
    steps = sum(per.steps for per in sources.values())
    accepted = sum(per.accepted for per in sources.values())
    assert steps + accepted >= len(out) == 40 >= steps  # each step emits its accepted tokens and one more
    assert all(per.accepted <= per.drafted for per in sources.values())
    assert run(item) == out  # a fresh store per run: the same run again
    assert sum(per.steps for per in sources.values()) == 2 * steps


def test_bench_reports_decode_tok_s_apart_from_end_to_end() -> None:
    # a prompt-heavy run: 3 s of prefill and 1 s of decode for 100 tokens. Decode tok/s is 100, not the
    # 25 tok/s of the whole calls (what the table printed as "tok/s" before it split the two)
    tallies = {"hf-generate": Tally(100, 10.0, [(1,)]), "engine-ar": Tally(100, 4.0, [(1,)])}
    splits = {"hf-generate": Split(99, 1.0, 9.0), "engine-ar": Split(100, 3.0, 1.0)}
    rows = {row["name"]: row for row in table_rows(tallies, splits)}
    ar = rows["engine-ar"]
    assert ar["decode_tokens_per_s"] == 100.0 and ar["tokens_per_s"] == 25.0
    assert ar["prefill_s"] == 3.0 and ar["decode_s"] == 1.0 and ar["same"] == 1
    assert ar["decode_vs_hf"] == pytest.approx(100.0 / 11.0) and ar["end_to_end_vs_hf"] == pytest.approx(2.5)


def test_runners_split_prefill_from_decode_as_the_engine_stats_do(byte_tokenizer, tiny_model) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), cost_model=CostModel.linear(0.02), draft_head=None)
    prompt = AgentPrompt("long", [{"role": "user", "content": "a long prompt, prefilled before decoding " * 6}])
    item = _Item(prompt, encode_prompt(byte_tokenizer, prompt.messages, prompt.tools))
    params = GenerationParams(max_new_tokens=12, reuse_prefix=False, method="ar")
    splits: dict = {}
    tally = Tally()
    _timed(_engine_runner(engine, params, splits), item, tally)
    stats = engine.generate(item.ids, params).stats
    split = splits["agent"]
    assert split.tokens == tally.tokens == stats.new_tokens == 12
    assert split.prefill_s > 0 and split.decode_s > 0 and tally.seconds >= split.prefill_s + split.decode_s
    assert split.decode_tokens_per_s > tally.tokens_per_s  # the whole call's rate includes the prefill
    hf_splits: dict = {}
    out = _hf_runner(engine, 12, hf_splits)(item)
    assert hf_splits["agent"].tokens == len(out) - 1 == 11 and hf_splits["agent"].prefill_s > 0
