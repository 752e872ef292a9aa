"""Losslessness of the engine on a tiny random Llama (float64, no download).

Greedy: for random prompts and ANY drafts, speculative output == plain greedy
output token for token. Sampling: the distribution of the first two tokens matches
the target's exact distribution (chi-square goodness of fit).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.drafters import HybridDrafter, SuffixDrafter
from hvd_agents.policy import CostModel, PayoffPredictor, PayoffWeights
from hvd_agents.policy.features import FEATURE_NAMES, NUM_FEATURES
from tests.drafters_for_tests import FixedDrafter, OracleDrafter, RandomQDrafter, ScriptedDrafter, TreeDrafter
from tests.tiny import make_tiny_llama

VOCAB = 64


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(make_tiny_llama(VOCAB), eos_token_ids=())


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_engine_ar_equals_hf_generate(engine: Engine) -> None:
    prompt = [3, 17, 42, 5, 9, 3, 17]
    ours = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="ar")).token_ids
    assert list(ours) == hf_greedy(engine.model, prompt, 40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    max_new=st.integers(1, 40),
    k=st.integers(0, 12),
    seed=st.integers(0, 10_000),
)
def test_greedy_equality_under_adversarial_drafts(engine: Engine, prompt, max_new, k, seed) -> None:
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    drafter = ScriptedDrafter(reference.token_ids, VOCAB, seed)
    engine.add_drafter("scripted", drafter)
    params = GenerationParams(max_new_tokens=max_new, method="scripted", num_draft_tokens=k)
    result = engine.generate(prompt, params)
    assert result.token_ids == reference.token_ids
    assert len(result.token_ids) == max_new  # no EOS here: exactly max_new_tokens
    assert result.finish_reason == "length"
    assert result.stats.new_tokens == max_new
    assert drafter.stopped, "drafter.stop must be called at the end of every request"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    max_new=st.integers(1, 40),
    k=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    hidden=st.booleans(),
)
def test_greedy_equality_under_tree_drafts(engine: Engine, prompt, max_new, k, seed, hidden) -> None:
    # random trees with the right continuation planted in some branch: the KV cache keeps only
    # the accepted path's positions, so every later step depends on that being right
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    drafter = TreeDrafter(reference.token_ids, VOCAB, seed, uses_hidden_states=hidden)
    engine.add_drafter("tree", drafter)
    params = GenerationParams(max_new_tokens=max_new, method="tree", num_draft_tokens=k, reuse_prefix=False)
    result = engine.generate(prompt, params)
    assert result.token_ids == reference.token_ids
    if hidden and drafter.last_hidden is not None:  # the buffer holds the accepted path's states only
        context = torch.tensor([list(drafter.last_context[:-1])])
        with torch.no_grad():
            expected = engine.model(context, output_hidden_states=True).hidden_states[-1][0]
        torch.testing.assert_close(drafter.last_hidden, expected, rtol=1e-9, atol=1e-9)


def test_tree_drafts_are_verified_as_trees(engine: Engine) -> None:
    prompt = [3, 17, 42, 5, 9]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=30, method="ar")).token_ids
    drafter = TreeDrafter(reference, VOCAB, seed=1)
    engine.add_drafter("tree", drafter)
    result = engine.generate(prompt, GenerationParams(max_new_tokens=30, method="tree", num_draft_tokens=8))
    assert result.token_ids == reference
    assert drafter.trees > 0 and result.stats.steps < 30  # planted branches were accepted


class WholeHybrid(HybridDrafter):
    """``hvd`` taking every cache proposal whole, as where planning costs more than verifying it (a GPU)."""

    def _whole_pays(self, cost: CostModel, k: int) -> bool:
        return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=30),
    max_new=st.integers(1, 30),
    k=st.integers(1, 16),
    seed=st.integers(0, 10_000),
    hazard_logit=st.floats(-6.0, 6.0),
    verify_cost=st.sampled_from([0.0, 0.02, 0.3, 2.0]),
    whole=st.booleans(),
)
def test_hvd_greedy_equality_with_adversarial_model_drafts(
    engine: Engine, prompt, max_new, k, seed, hazard_logit, verify_cost, whole
) -> None:
    # the hybrid picks between real cache drafts and adversarial "model" drafts under any
    # predictor (constant hazard from always-reject to always-accept) and any cost model, planning its cache
    # proposals or (where planning would cost more than verifying them whole) taking them as they are
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    weights = np.zeros(NUM_FEATURES)
    weights[FEATURE_NAMES.index("bias")] = hazard_logit
    kind = WholeHybrid if whole else HybridDrafter
    hybrid = kind(SuffixDrafter(engine.cache_store), PayoffPredictor(PayoffWeights(weights)),
                  CostModel.linear(verify_cost), model=ScriptedDrafter(reference.token_ids, VOCAB, seed))
    engine.add_drafter("hvd-adversarial", hybrid)
    params = GenerationParams(max_new_tokens=max_new, method="hvd-adversarial", num_draft_tokens=k)
    assert engine.generate(prompt, params).token_ids == reference.token_ids


@pytest.mark.parametrize("method", ["pld", "hvd-cache", "hvd"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=40),
    max_new=st.integers(1, 30),
    k=st.integers(1, 16),
)
def test_cache_drafters_greedy_equality(engine: Engine, method, prompt, max_new, k) -> None:
    # a small token range makes repeats (and so drafts) common; the engine's store keeps
    # earlier examples' outputs, so hvd-cache also drafts across requests here
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    result = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method=method, num_draft_tokens=k))
    assert result.token_ids == reference.token_ids


def test_stop_token_in_accepted_draft_ends_request(engine: Engine) -> None:
    prompt = [1, 2, 3, 4]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=30, method="ar")).token_ids
    stop_token = reference[5]
    first = reference.index(stop_token)
    engine.add_drafter("oracle", OracleDrafter(reference))
    for method in ("ar", "oracle", "pld"):
        params = GenerationParams(max_new_tokens=30, method=method, stop_token_ids=(stop_token,))
        result = engine.generate(prompt, params)
        assert result.token_ids == reference[: first + 1], method  # the stop token is included, nothing after
        assert result.finish_reason == "stop"


def test_stats_count_steps_and_sources(engine: Engine) -> None:
    prompt = [7, 8, 9, 10, 11]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=20, method="ar"))
    assert reference.stats.steps == 20 and reference.stats.drafted_tokens == 0
    assert reference.stats.tokens_per_step == 1.0
    engine.add_drafter("perfect", OracleDrafter(reference.token_ids))
    params = GenerationParams(max_new_tokens=20, method="perfect", num_draft_tokens=4, record_steps=True)
    result = engine.generate(prompt, params)
    assert result.token_ids == reference.token_ids
    assert result.stats.steps == 4  # 5 tokens per step: 4 accepted + 1 bonus
    assert result.stats.accepted_tokens == result.stats.drafted_tokens == 16
    assert result.stats.per_source["oracle"].accepted == 16
    assert [r.accepted for r in result.stats.step_records] == [4, 4, 4, 4]


def test_seeds_reproduce(engine: Engine) -> None:
    params = GenerationParams(max_new_tokens=25, temperature=1.0, seed=123, method="pld")
    a = engine.generate([5, 6, 7, 5, 6], params).token_ids
    b = engine.generate([5, 6, 7, 5, 6], params).token_ids
    c = engine.generate([5, 6, 7, 5, 6], GenerationParams(max_new_tokens=25, temperature=1.0, seed=124)).token_ids
    assert a == b
    assert a != c


# ---------------------------------------------------------------- sampling


SMALL_VOCAB = 8


def exact_two_token_distribution(model, prompt: list[int], params: GenerationParams) -> dict[tuple[int, int], float]:
    """P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1), computed from the target directly."""
    from hvd_agents.engine.sampling import target_probs

    with torch.no_grad():
        first = target_probs(model(torch.tensor([prompt])).logits[0, -1:], params.sampling)[0]
        dist = {}
        for t1 in range(SMALL_VOCAB):
            logits = model(torch.tensor([prompt + [t1]])).logits[0, -1:]
            second = target_probs(logits, params.sampling)[0]
            for t2 in range(SMALL_VOCAB):
                dist[(t1, t2)] = float(first[t1] * second[t2])
    return dist


def assert_samples_follow(engine: Engine, prompt: list[int], params: GenerationParams, expected: dict,
                          n: int = 2000, tokens: int = 2) -> None:
    """Generate ``n`` seeded samples and chi-square their first ``tokens`` tokens against ``expected``."""
    observed: Counter = Counter()
    for i in range(n):
        run = GenerationParams(**{**params.__dict__, "seed": 1000 + i})
        observed[tuple(engine.generate(prompt, run).token_ids[:tokens])] += 1
    stat, df = chi_square(observed, expected, n)
    assert stat < chi_square_critical(df), f"chi2={stat:.1f} with df={df}"


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty); z=3.09 is a 0.001 test."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(observed: Counter, expected: dict, n: int) -> tuple[float, int]:
    """Pearson statistic, merging cells with expected count < 5 into one."""
    stat, df, rest_obs, rest_exp = 0.0, -1, 0, 0.0
    for cell, prob in expected.items():
        exp = prob * n
        if exp < 5:
            rest_obs += observed.get(cell, 0)
            rest_exp += exp
            continue
        stat += (observed.get(cell, 0) - exp) ** 2 / exp
        df += 1
    if rest_exp > 0:
        stat += (rest_obs - rest_exp) ** 2 / rest_exp
        df += 1
    return stat, df


@pytest.mark.parametrize(
    "drafter_kind, temperature, top_k, top_p",
    [
        ("ar", 1.0, 0, 1.0),
        ("fixed", 1.0, 0, 1.0),  # deterministic (cache-style) drafts, often wrong
        ("q", 1.0, 0, 1.0),  # drafts sampled from a q that differs from p
        ("fixed", 0.7, 5, 0.9),  # warped target: temperature, top-k and top-p together
        ("q", 0.7, 5, 0.9),
        ("hvd-q", 1.0, 0, 1.0),  # the hybrid: cache drafts and q-carrying model drafts mixed
        ("hvd-q", 0.7, 5, 0.9),
        ("tree", 1.0, 0, 1.0),  # deterministic tree drafts: alternatives at the first and second token
        ("tree", 0.7, 5, 0.9),
    ],
)
def test_speculative_sampling_matches_target_distribution(drafter_kind, temperature, top_k, top_p) -> None:
    model = make_tiny_llama(SMALL_VOCAB, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)  # flatten: many cells with real mass
    engine = Engine(model, eos_token_ids=())
    engine.add_drafter("fixed", FixedDrafter([2, 2, 5]))
    engine.add_drafter("q", RandomQDrafter(SMALL_VOCAB, seed=5))
    # two alternatives for the first token: with 3 new tokens the first step verifies both, and the
    # second token comes from the row of whichever was accepted (its position and mask must be right)
    engine.add_drafter("tree", FixedDrafter([2, 5, 2, 3], parents=[-1, -1, 0, 1]))
    engine.add_drafter("hvd-q", HybridDrafter(SuffixDrafter(engine.cache_store), cost=CostModel.linear(0.1),
                                              model=RandomQDrafter(SMALL_VOCAB, seed=6)))
    prompt = [1, 4, 2, 7, 1, 4]  # "1 4" repeats: the cache drafter proposes [2, 7, ...]
    params = GenerationParams(max_new_tokens=3 if drafter_kind == "tree" else 2, temperature=temperature,
                              top_k=top_k, top_p=top_p, method=drafter_kind, num_draft_tokens=3, seed=0)
    assert_samples_follow(engine, prompt, params, exact_two_token_distribution(model, prompt, params))
