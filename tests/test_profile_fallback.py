"""A cost profile that cannot be measured never fails a load or a request.

The profile only tunes how much ``hvd`` drafts; measuring it runs the target (forwards,
rollbacks) on first use, where a model the runner cannot roll back, or any other failure,
used to reach the user as an exception. Now the default linear profile is used, with a
warning that names the cause and the default, and nothing is cached.
"""

from __future__ import annotations

import logging
import time

import pytest

from hvd_agents import Engine, GenerationParams
from hvd_agents.policy.cost import FALLBACK_VERIFY_COST, CostModel
from hvd_agents.runtime import profile
from tests.tiny import make_tiny_llama


def fail(*args, **kwargs):
    raise RuntimeError("injected failure while measuring")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))
    return tmp_path


def test_a_failed_measurement_falls_back_to_the_stated_default(cache_dir, monkeypatch, caplog) -> None:
    monkeypatch.setattr(profile, "measure_cost_model", fail)
    engine = Engine(make_tiny_llama(64, seed=3), eos_token_ids=(), draft_head=None)
    prompt = [3, 5, 7, 3, 5, 7, 3, 5, 7, 1, 2]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=24, method="ar")).token_ids
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.profile"):
        result = engine.generate(prompt, GenerationParams(max_new_tokens=24, method="hvd"))
    assert result.token_ids == reference
    assert engine.cost_model() == CostModel.fallback() == CostModel.linear(FALLBACK_VERIFY_COST)
    assert "injected failure while measuring" in caplog.text and f"c={FALLBACK_VERIFY_COST}" in caplog.text
    assert not list(cache_dir.rglob("*.json"))  # the default is not cached: the next process measures again


def test_a_runner_measurement_or_a_key_that_fails_falls_back(cache_dir, caplog, monkeypatch) -> None:
    model = make_tiny_llama(64, seed=3)
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.profile"):
        assert profile.cached_cost_model(model, key="runner", measure=fail) == CostModel.fallback()
        monkeypatch.setattr(profile, "profile_key", fail)
        assert profile.cached_cost_model(model) == CostModel.fallback()
    assert caplog.text.count("cannot measure the verification cost profile") == 2


def test_a_profile_measured_while_other_load_took_the_cores_is_measured_again_and_not_cached(
        cache_dir, caplog, monkeypatch) -> None:
    model = make_tiny_llama(64, seed=3)
    measured = CostModel(((0, 1.0), (8, 1.5)), source="measured")
    calls = []

    def idle_while_timing():  # the measuring process waited: its cores ran something else
        calls.append(1)
        time.sleep(0.05)
        return measured

    def busy_while_timing():  # one core, busy throughout
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass
        return measured

    monkeypatch.setattr(profile, "team_threads", lambda: 1)
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.profile"):
        got = profile.cached_cost_model(model, key="busy", measure=idle_while_timing, min_cpu_share=0.8)
    assert got == CostModel.fallback() and len(calls) == profile.PROFILE_ATTEMPTS
    assert "other load took the rest" in caplog.text and not list(cache_dir.rglob("*.json"))
    assert profile.cached_cost_model(model, key="idle", measure=idle_while_timing) == measured  # no share asked
    assert profile.cached_cost_model(model, key="busy", measure=busy_while_timing, min_cpu_share=0.8) == measured
    assert len(list(cache_dir.rglob("*.json"))) == 2
