"""``hvd-agents bench-batch`` on the embedded model, a short burst: both arms answer every request the same."""

from __future__ import annotations

import json

import pytest

from hvd_agents.bench.batch import burst_prompts, run_batch_benchmark
from hvd_agents.errors import InvalidRequestError


@pytest.mark.real_model
def test_a_short_burst_gives_identical_replies_on_both_engines(tmp_path, capsys) -> None:
    report = run_batch_benchmark(requests=3, max_tokens=6, json_path=str(tmp_path / "batch.json"))
    assert report["identical"] == 3
    assert report["serial"]["output_tokens"] == report["batched"]["output_tokens"] > 0
    assert report["cancel_s"] >= 0 and report["step_ms_main_thread"] > 0 and report["step_ms_worker_thread"] > 0
    assert json.loads((tmp_path / "batch.json").read_text())["requests"] == 3
    assert "batched / serial aggregate throughput" in capsys.readouterr().out


def test_burst_prompts_are_distinct_and_bounded() -> None:
    prompts = burst_prompts(16)
    assert len({json.dumps(p, sort_keys=True) for p in prompts}) == 16
    with pytest.raises(InvalidRequestError, match="--requests is at most 20"):
        burst_prompts(21)
