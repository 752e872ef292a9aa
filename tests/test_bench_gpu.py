"""``hvd-agents bench-gpu`` on the CPU: the same arms and checks without graphs (a short run on random weights)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from hvd_agents.bench.gpu import RANDOM_CONFIGS, random_model, run_gpu_benchmark, step_bytes, warm_steady_state
from hvd_agents.errors import InvalidRequestError
from hvd_agents.runtime.static import Buckets, StaticRunner
from tests.tiny import make_tiny_llama


def test_bench_gpu_runs_every_arm_on_the_cpu(tmp_path, capsys) -> None:
    report = run_gpu_benchmark("random:tiny", device="cpu", max_new_tokens=8, synthetic_prompts=1,
                               json_path=str(tmp_path / "gpu.json"))
    assert set(report.arms) == {"hf-generate", "engine-ar (HF runner)", "engine-ar (static)", "engine-hvd (static)",
                                "engine-hvd-cache (static)", "engine-ar (static, buckets)",
                                "engine-hvd (static, buckets)"}
    for arm in report.arms.values():
        assert arm["tokens"] == 8 and arm["same_as_engine_ar"] == 1  # greedy: every arm, the same tokens
    assert report.single_bucket_bitwise
    assert report.teacher_forced_bitwise["single"] == "16/16"
    assert report.teacher_forced_bitwise["bitwise"] == report.teacher_forced_bitwise["bitwise tree"] == "16/16"
    assert report.bitwise_mode_bitwise
    for control in ("buckets", "buckets tree"):  # the controls: reported, not required
        assert re.fullmatch(r"\d+/16", report.teacher_forced_bitwise[control])
    assert report.syncs_per_step == {"ar": None, "hvd": None}  # counted on CUDA only
    assert json.loads((tmp_path / "gpu.json").read_text())["model"] == "random:tiny"
    assert "| engine-hvd (static) |" in capsys.readouterr().out


def test_a_run_stopped_part_way_leaves_the_figures_of_the_prompts_it_finished(tmp_path, monkeypatch) -> None:
    # a run on a lent GPU can be stopped at its time limit: the JSON holds the arms of every finished prompt
    from hvd_agents.bench import gpu

    real, calls = gpu._engine_arm, []

    def arm(engine, params):
        run = real(engine, params)

        def stopping(ids):
            calls.append(ids)
            if len(calls) > 6 + 6:  # the warm-up, then the first prompt: 6 engine arms each (HF generate aside)
                raise KeyboardInterrupt("stopped")
            return run(ids)
        return stopping

    monkeypatch.setattr(gpu, "_engine_arm", arm)
    with pytest.raises(KeyboardInterrupt):
        run_gpu_benchmark("random:tiny", device="cpu", max_new_tokens=4, synthetic_prompts=3,
                          json_path=str(tmp_path / "gpu.json"))
    partial = json.loads((tmp_path / "gpu.json").read_text())
    assert partial["partial"] is True and partial["prompts_done"] == 1
    assert partial["arms"]["engine-ar (static)"]["tokens"] == 4 and partial["arms"]["hf-generate"]["tokens"] == 4


def test_a_drafting_arm_never_finds_the_prompts_earlier_output_in_its_store(tmp_path) -> None:
    # the warm-up and the other arms decode the same prompt first: a shared cross-request store would hand the cache
    # drafter the whole reply. Each run of a drafting arm starts with an empty store, so hvd-cache (whose drafts do
    # not depend on timings) takes exactly the steps of a new engine's first request
    from hvd_agents import Engine, GenerationParams

    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 6 + [5, 6]
    (tmp_path / "prompts.json").write_text(json.dumps([prompt]))
    report = run_gpu_benchmark("random:tiny", device="cpu", max_new_tokens=24, prompts_path=str(tmp_path / "prompts.json"))
    model = random_model("tiny", torch.device("cpu"), torch.float32)
    engine = Engine(model, None, eos_token_ids=(), draft_head=None, runner=StaticRunner(model))
    params = GenerationParams(max_new_tokens=24, reuse_prefix=False, stop_token_ids=(), method="hvd-cache")
    first = engine.generate(prompt, params)
    again = engine.generate(prompt, params)  # what a shared store gives: the first reply, copied
    assert report.arms["engine-hvd-cache (static)"]["steps"] == first.stats.steps > again.stats.steps


def test_random_models_have_the_named_configurations() -> None:
    model = random_model("tiny", torch.device("cpu"), torch.float32)
    assert model.config.hidden_size == RANDOM_CONFIGS["tiny"]["hidden_size"]
    assert RANDOM_CONFIGS["smollm2-135m"]["num_hidden_layers"] == 30
    with pytest.raises(InvalidRequestError, match="unknown random model 'nope'"):
        random_model("nope", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("tied", [True, False])
def test_a_decode_step_reads_one_row_of_an_untied_input_embedding(tied) -> None:
    model = make_tiny_llama(64, dtype=torch.float32)  # untied
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert (embed is head) == tied
    runner = StaticRunner(model, warm_up=False, slots=1)
    layers = [p for name, p in model.named_parameters() if "embed_tokens" not in name and "lm_head" not in name]
    d = runner.decoder
    kv = len(d.layers) * 2 * d.kv_heads * d.head_dim * 10 * 4
    read = sum(p.numel() for p in layers) * 4 + head.numel() * 4 + (0 if tied else embed.shape[1] * 4)
    assert step_bytes(model, runner, 10) == read + kv


def test_the_steady_state_warm_up_covers_every_slot_up_to_the_last_kv_length(monkeypatch) -> None:
    runner = StaticRunner(make_tiny_llama(64, dtype=torch.float32), buckets=Buckets((1, 5, 17), (64, 128, 256, 512)),
                          graphs=False, slots=2)
    seen, run = [], runner.graphs.run
    monkeypatch.setattr(runner.graphs, "run", lambda *key: seen.append(key) or run(*key))
    warm_steady_state(runner, 100, 20)  # the last step reads up to 100 + 20 + 17 positions: the 256 bucket
    assert seen == [(slot, rows, kv) for slot in (0, 1) for kv in (64, 128, 256) for rows in (1, 5, 17)]


def test_prompts_travel_as_token_ids(tmp_path) -> None:
    from hvd_agents.bench.gpu import _load_prompts, write_prompts

    path = tmp_path / "prompts.json"
    assert write_prompts(str(path)) == 12  # 4 agent and 8 chat prompts
    prompts = _load_prompts(str(path), 49152)
    assert len(prompts) == 12 and all(len(p) > 20 for p in prompts)
    with pytest.raises(InvalidRequestError, match="token ids below 100"):
        _load_prompts(str(path), 100)


def test_the_arms_can_be_chosen_and_each_keeps_the_ar_it_is_compared_with(capsys) -> None:
    from hvd_agents.bench.gpu import chosen_arms

    report = run_gpu_benchmark("random:tiny", device="cpu", max_new_tokens=4, synthetic_prompts=1, arms="hvd-cache")
    assert set(report.arms) == {"engine-ar (static)", "engine-hvd-cache (static)"}
    assert report.arms["engine-hvd-cache (static)"]["same_as_engine_ar"] == 1
    assert report.buckets_cost_profile == "not run"
    assert "| engine-hvd-cache (static) |" in capsys.readouterr().out
    assert "engine-ar (static, buckets)" in chosen_arms("hvd-buckets")
    with pytest.raises(InvalidRequestError, match="unknown arm.*nope"):
        chosen_arms("hvd,nope")
