"""The paper's rule and the merge baselines as drafters: what they draft, and losslessness in the engine.

Hand-written token arrays with intent comments for what each rule drafts; hypothesis for
greedy == plain greedy under adversarial model drafts (noise, overlong, out-of-vocabulary ids,
trees); the chi-square test of the engine suite for sampling.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.drafters import (
    CacheStore,
    ChainDrafter,
    Draft,
    DraftContext,
    DraftOutcome,
    GraftDrafter,
    PaperDrafter,
    SuffixDrafter,
    available_methods,
)
from hvd_agents.policy.paper import PAPER_FEATURES, PaperMLP
from tests.drafters_for_tests import FixedDrafter, RandomQDrafter, ScriptedDrafter, TreeDrafter
from tests.test_engine_lossless import SMALL_VOCAB, assert_samples_follow, exact_two_token_distribution
from tests.tiny import make_tiny_llama

VOCAB = 64
PROMPT = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]  # "1 2 3" repeats: the cache drafter proposes [4, 5, 9, 9, 1, ...]


def constant_mlp(value: float) -> PaperMLP:
    """An MLP that predicts ``value`` accepted tokens for every draft."""
    mlp = PaperMLP.init(len(PAPER_FEATURES), np.random.default_rng(0), hidden=4)
    mlp.w3 = np.zeros(4)
    mlp.b3 = np.array(value)
    return mlp


def started(drafter, prompt=PROMPT) -> DraftContext:
    drafter.start("r", prompt)
    return DraftContext("r", list(prompt), len(prompt))


def test_paper_rule_verifies_the_whole_cache_draft_only_above_the_threshold() -> None:
    high = PaperDrafter(SuffixDrafter(None), constant_mlp(7.0), model=FixedDrafter([8, 8]))
    ctx = started(high)
    draft = high.propose(ctx, 4)
    assert draft.token_ids == (4, 5, 9, 9)  # predicted 7 > 6: the cache draft, whole
    probe = high.probe("r")
    assert probe.arm == "cache" and probe.predicted == pytest.approx(7.0) and probe.cache_tokens == (4, 5, 9, 9)
    high.observe(DraftOutcome("r", draft, 4, (4, 5, 9, 9, 1)))
    assert high.probe("r") is None  # consumed by observe

    low = PaperDrafter(SuffixDrafter(None), constant_mlp(6.0), model=FixedDrafter([8, 8]))
    assert low.propose(started(low), 4).token_ids == (8, 8)  # 6 is not above 6: the model drafter
    assert low.probe("r").arm == "model"
    alone = PaperDrafter(SuffixDrafter(None), constant_mlp(0.0))
    assert alone.propose(started(alone), 4).token_ids == ()  # no model drafter: a plain step
    assert alone.probe("r").arm == "none" and alone.probe("r").cache_tokens == (4, 5, 9, 9)


def test_chain_appends_the_cache_continuation_of_the_model_draft() -> None:
    # the model drafts [4, 5]; what followed "... 4 5" in the context was "9 9 1 2"
    chain = ChainDrafter(SuffixDrafter(None), FixedDrafter([4, 5]))
    draft = chain.propose(started(chain), 6)
    assert draft.token_ids == (4, 5, 9, 9, 1, 2) and draft.probs is None
    assert chain.probe("r").arm == "merged"
    # a model draft with no cache continuation is verified alone
    lone = ChainDrafter(SuffixDrafter(None), FixedDrafter([7, 7]))
    assert lone.propose(started(lone), 6).token_ids == (7, 7) and lone.probe("r").arm == "model"
    # no model drafter: the cache draft
    bare = ChainDrafter(SuffixDrafter(None))
    assert bare.propose(started(bare), 3).token_ids == (4, 5, 9) and bare.probe("r").arm == "cache"


def test_graft_needs_the_cache_draft_to_agree_with_the_model_prefix() -> None:
    agree = GraftDrafter(SuffixDrafter(None), FixedDrafter([4, 5]))
    assert agree.propose(started(agree), 6).token_ids == (4, 5, 9, 9, 1, 2)  # the cache draft grafted on
    assert agree.probe("r").arm == "merged"
    differ = GraftDrafter(SuffixDrafter(None), FixedDrafter([4, 6]))
    assert differ.propose(started(differ), 6).token_ids == (4, 6)  # disagreement: the model prefix alone
    assert differ.probe("r").arm == "model"


def test_the_cache_drafter_learns_only_from_its_own_drafts() -> None:
    chain = ChainDrafter(SuffixDrafter(None), FixedDrafter([4, 5]))
    ctx = started(chain)
    draft = chain.propose(ctx, 6)
    chain.observe(DraftOutcome("r", draft, 6, (4, 5, 9, 9, 1, 2, 3)))
    state_drafts = chain.cache.propose(DraftContext("r", [*ctx.token_ids, 4, 5, 9, 9, 1, 2, 3], len(PROMPT)), 2)
    assert state_drafts.features.history.drafts == 0  # the merged draft was not the cache drafter's


def test_lifecycle_misuse_raises() -> None:
    drafter = GraftDrafter(SuffixDrafter(None))
    with pytest.raises(ValueError, match="hvd-graft: propose for request 'x'"):
        drafter.propose(DraftContext("x", [1], 1), 2)
    drafter.stop("x")  # stopping twice is safe


def test_methods_are_registered() -> None:
    assert {"hvd-paper", "hvd-chain", "hvd-graft"} <= set(available_methods())


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(make_tiny_llama(VOCAB), eos_token_ids=())


def _adversarial(kind: str, engine: Engine, reference, seed: int, prediction: float):
    model = (TreeDrafter(reference, VOCAB, seed) if seed % 3 == 0 else ScriptedDrafter(reference, VOCAB, seed))
    cache = SuffixDrafter(engine.cache_store)
    if kind == "paper":
        return PaperDrafter(cache, constant_mlp(prediction), model=model, threshold=2.0)
    if kind == "chain":
        return ChainDrafter(cache, model, model_tokens=1 + seed % 4)
    return GraftDrafter(cache, model, model_tokens=1 + seed % 4)


@pytest.mark.parametrize("kind", ["paper", "chain", "graft"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=30),
    max_new=st.integers(1, 30),
    k=st.integers(1, 16),
    seed=st.integers(0, 10_000),
    prediction=st.sampled_from([0.0, 3.0]),
)
def test_greedy_equality_with_adversarial_model_drafts(engine: Engine, kind, prompt, max_new, k, seed,
                                                       prediction) -> None:
    # model drafts that are noise, overlong, out of the vocabulary, or trees with the right path planted
    # somewhere, merged with real cache drafts: the output is still plain greedy decoding's
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    engine.add_drafter(f"adv-{kind}", _adversarial(kind, engine, reference.token_ids, seed, prediction))
    params = GenerationParams(max_new_tokens=max_new, method=f"adv-{kind}", num_draft_tokens=k)
    assert engine.generate(prompt, params).token_ids == reference.token_ids


@pytest.mark.parametrize("method", ["hvd-paper", "hvd-chain", "hvd-graft"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 7), min_size=1, max_size=40), max_new=st.integers(1, 30), k=st.integers(1, 16))
def test_registered_methods_greedy_equality(engine: Engine, method, prompt, max_new, k) -> None:
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    result = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method=method, num_draft_tokens=k))
    assert result.token_ids == reference.token_ids


@pytest.mark.parametrize("kind", ["chain", "graft"])
def test_sampling_keeps_the_target_distribution(kind) -> None:
    model = make_tiny_llama(SMALL_VOCAB, seed=3)
    import torch

    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)
    engine = Engine(model, eos_token_ids=())
    drafter_class = ChainDrafter if kind == "chain" else GraftDrafter
    engine.add_drafter(kind, drafter_class(SuffixDrafter(engine.cache_store), RandomQDrafter(SMALL_VOCAB, seed=6)))
    prompt = [1, 4, 2, 7, 1, 4]
    params = GenerationParams(max_new_tokens=2, temperature=1.0, method=kind, num_draft_tokens=3, seed=0)
    assert_samples_follow(engine, prompt, params, exact_two_token_distribution(model, prompt, params))


def test_a_merged_draft_is_deterministic_and_follows_its_parts() -> None:
    store = CacheStore(1000)
    chain = ChainDrafter(SuffixDrafter(store), FixedDrafter([4]), model_tokens=1)
    draft = chain.propose(started(chain), 3)
    assert isinstance(draft, Draft) and draft.probs is None and draft.source == "chain:model+cache"
