"""The benchmark harnesses' runners (hvd_agents.bench.live), on the tiny model."""

from __future__ import annotations

from hvd_agents.bench.live import _cache_runner, _Item
from hvd_agents.bench.prompts import AgentPrompt
from hvd_agents.chat.template import encode_prompt
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.policy import CostModel


def test_cache_runner_adds_up_its_runs_steps_by_draft_source(byte_tokenizer, tiny_model) -> None:
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
