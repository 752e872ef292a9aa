"""``hvd-agents bench-gpu`` on the CPU: the same arms and checks without graphs (a short run on random weights)."""

from __future__ import annotations

import json

import pytest
import torch

from hvd_agents.bench.gpu import RANDOM_CONFIGS, random_model, run_gpu_benchmark
from hvd_agents.errors import InvalidRequestError


def test_bench_gpu_runs_every_arm_on_the_cpu(tmp_path, capsys) -> None:
    report = run_gpu_benchmark("random:tiny", device="cpu", max_new_tokens=8, synthetic_prompts=1,
                               json_path=str(tmp_path / "gpu.json"))
    assert set(report.arms) == {"hf-generate", "engine-ar (HF runner)", "engine-ar (static)", "engine-hvd (static)"}
    for arm in report.arms.values():
        assert arm["tokens"] == 8 and arm["same_as_engine_ar"] == 1  # greedy: every arm, the same tokens
    assert report.single_bucket_bitwise
    assert report.syncs_per_step == {"ar": None, "hvd": None}  # counted on CUDA only
    assert json.loads((tmp_path / "gpu.json").read_text())["model"] == "random:tiny"
    assert "| engine-hvd (static) |" in capsys.readouterr().out


def test_random_models_have_the_named_configurations() -> None:
    model = random_model("tiny", torch.device("cpu"), torch.float32)
    assert model.config.hidden_size == RANDOM_CONFIGS["tiny"]["hidden_size"]
    assert RANDOM_CONFIGS["smollm2-135m"]["num_hidden_layers"] == 30
    with pytest.raises(InvalidRequestError, match="unknown random model 'nope'"):
        random_model("nope", torch.device("cpu"), torch.float32)
