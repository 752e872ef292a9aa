"""``hvd-agents bench-model``: the model drafter's arms side by side, head files in arms of their own."""

from __future__ import annotations

import pytest
import torch

import hvd_agents.bench.model_drafter as bench_model
from hvd_agents.bench.head_files import head_files, tapped
from hvd_agents.cli import main
from hvd_agents.draft_head.model import with_taps
from hvd_agents.draft_head.weights import load_head, save_head, shipped_heads
from hvd_agents.drafters.model.head import DraftHeadDrafter
from hvd_agents.engine import GenerationParams
from hvd_agents.errors import HVDError

pytestmark = pytest.mark.real_model
TAPS = (2, 15, 27)


@pytest.fixture
def fused_head_file(tmp_path):
    """The shipped head with a fusion of three layers that changes its drafts (random, not zero)."""
    head = with_taps(load_head(next(p for p in shipped_heads() if p.name.startswith("smollm2-135m"))), TAPS)
    with torch.no_grad():
        head.fuse.weight.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(3))
    return save_head(head, tmp_path / "fused.safetensors", {})


@pytest.fixture
def few_prompts(monkeypatch):
    """One short prompt per workload: the benchmark's plumbing, not its figures."""
    chat, agent = bench_model.chat_prompts()[0], bench_model.agent_prompts()[0]
    monkeypatch.setattr(bench_model, "chat_prompts", lambda: [chat])
    monkeypatch.setattr(bench_model, "agent_prompts", lambda: [agent])
    return chat, agent


def test_a_head_file_drafts_with_its_layers_tapped_and_the_engines_head_gets_its_own_back(real_engine,
                                                                                       fused_head_file) -> None:
    (head,) = head_files(real_engine, [fused_head_file]).values()
    assert head.config.taps == TAPS
    ids = real_engine.tokenizer("The three primary colours are", add_special_tokens=False).input_ids
    reference = real_engine.generate(ids, GenerationParams(max_new_tokens=12, method="ar", reuse_prefix=False))
    real_engine.add_drafter("fused-test", DraftHeadDrafter(head))
    with tapped(real_engine, head.config.taps):
        result = real_engine.generate(ids, GenerationParams(max_new_tokens=12, method="fused-test",
                                                            reuse_prefix=False))
    assert result.token_ids == reference.token_ids
    assert result.stats.per_source["head"].steps > 0  # it drafted (from rows four layers wide)
    # the engine's own head drafts from its own rows again (a fused head's rows would be refused by it)
    again = real_engine.generate(ids, GenerationParams(max_new_tokens=12, method="model", reuse_prefix=False))
    assert again.token_ids == reference.token_ids and again.stats.per_source["head"].steps > 0
    with pytest.raises(HVDError, match="named 'fused'"):
        head_files(real_engine, [fused_head_file, fused_head_file])


def test_bench_model_runs_a_head_file_in_an_arm_beside_the_shipped_head(real_engine, fused_head_file, few_prompts,
                                                                        capsys) -> None:
    tallies = bench_model.run_model_benchmark(max_new_tokens=6, rounds=1, heads=[fused_head_file])
    for workload, by_arm in tallies.items():
        assert set(by_arm) == {*bench_model.ARMS, "model:fused"}, workload
        assert all(tally.outputs == by_arm["ar"].outputs for tally in by_arm.values()), workload  # lossless
    out = capsys.readouterr().out
    assert "model:fused/ar" in out and "model:fused drafts:" in out and "model drafts:" in out
    assert main(["bench-model", "--head", str(fused_head_file.with_name("missing.safetensors"))]) == 2


def test_bench_model_samples_every_arm_when_asked(real_engine, few_prompts, capsys) -> None:
    sampling = bench_model.SamplingParams(temperature=0.8, top_p=0.9, seed=11)
    tallies = bench_model.run_model_benchmark(max_new_tokens=6, rounds=1, sampling=sampling)
    out = capsys.readouterr().out
    assert "sampled (temperature=0.8, top_p=0.9, top_k=0, seed=11" in out
    ids = bench_model.encode_prompt(real_engine.tokenizer, few_prompts[0].messages, few_prompts[0].tools)
    alone = real_engine.generate(ids, GenerationParams(max_new_tokens=6, method="ar", reuse_prefix=False,
                                                       temperature=0.8, top_p=0.9, seed=11))
    assert tallies["chat"]["ar"].outputs == [alone.token_ids]  # the arm sampled with the seed it was given
    greedy = real_engine.generate(ids, GenerationParams(max_new_tokens=6, method="ar", reuse_prefix=False))
    assert alone.token_ids != greedy.token_ids  # and it was sampled: this prompt's seeded draw is not greedy's
    assert main(["bench-model", "--temperature", "0.7", "--top-p", "1.5"]) == 2
    assert "top_p must be in (0, 1], got 1.5" in capsys.readouterr().err
