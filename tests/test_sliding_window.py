"""Speculation on a sliding-window model: a tiny random Gemma 3 (window 8) on the HF runner.

transformers' own sliding-window cache layer keeps only the last ``window - 1`` positions,
so once the window is full it cannot roll a rejected draft back: measuring the cost
profile or verifying any draft crashed. The engine's cache holds window layers at full
length with the window applied by the mask; these tests decode far past the window and
check that the window is still applied (the logits equal transformers' own forward on its
own cache), that ``hvd`` and every drafter give exactly ``ar``'s tokens, that tree rows
equal the chain of their path, and that the cost profile is measured through rollbacks.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig

from hvd_agents import Engine, GenerationParams
from hvd_agents.policy import CostModel
from hvd_agents.runtime.kv import WindowLayer, cache_argument, new_cache
from hvd_agents.runtime.profile import measure_cost_model
from hvd_agents.runtime.runner import HFRunner
from tests.drafters_for_tests import ScriptedDrafter, TreeDrafter

VOCAB, WINDOW = 64, 8


def make_tiny_gemma3(seed: int = 0) -> Gemma3ForCausalLM:
    """A 4-layer Gemma 3 (three sliding-window layers of window 8, then a full one), float64."""
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"], bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Gemma3ForCausalLM(config).to(torch.float64)
    with torch.no_grad():  # sharpen the logits so greedy paths are varied
        model.lm_head.weight.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="module")
def gemma() -> Gemma3ForCausalLM:
    return make_tiny_gemma3()


@pytest.fixture(scope="module")
def engine(gemma) -> Engine:
    # the profile is measured in its own test below; a stated one keeps these fast
    return Engine(gemma, eos_token_ids=(), draft_head=None, cost_model=CostModel.linear(0.02))


def test_the_model_has_window_layers_held_at_full_length(gemma) -> None:
    assert "sliding_attention" in gemma.config.layer_types and "full_attention" in gemma.config.layer_types
    cache = new_cache(gemma.config)
    kinds = [isinstance(layer, WindowLayer) for layer in cache.layers]
    assert kinds == [kind == "sliding_attention" for kind in gemma.config.layer_types]
    assert cache.supports_trees and cache.supports_reuse


def test_decoding_past_the_window_with_rollbacks_matches_transformers_own_cache(gemma) -> None:
    # transformers' sliding-window cache never rolls back: it decodes one token at a time; ours verifies
    # drafts of 4 and keeps 3, far past the window; the logits of the kept positions must agree
    ids = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(1))
    arg = cache_argument(gemma)
    with torch.inference_mode():
        theirs = gemma(input_ids=ids, **{arg: DynamicCache(config=gemma.config)}, use_cache=True).logits[0]
        cache, ours = new_cache(gemma.config), []
        ours.append(gemma(input_ids=ids[:, :20], **{arg: cache}, use_cache=True).logits[0])
        for start in range(20, 57, 3):
            logits = gemma(input_ids=ids[:, start : start + 4], **{arg: cache}, use_cache=True).logits[0]
            ours.append(logits[:3])
            cache.rollback(start + 3)
    ours = torch.cat(ours)[:60]
    torch.testing.assert_close(ours, theirs[: len(ours)], rtol=0, atol=1e-10)


def test_the_window_is_applied_through_rollbacks_and_trees() -> None:
    # every layer a window layer: 4 layers of window 8 see at most 4 * 7 = 28 positions back, so a token 39
    # positions before the last cannot change its logits at all (masked keys add exact zeros), however the
    # positions came into the cache: a chain with rollbacks, or a tree's path
    config = make_tiny_gemma3().config
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(config).to(torch.float64).eval()
    runner = HFRunner(model)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    last = []
    for first in (ids[0], other_first(ids)):
        kv = runner.new_kv()
        runner.forward(kv, [first, *ids[1:20]])
        for start in range(20, 36, 4):
            runner.forward(kv, ids[start : start + 6])
            kv.rollback(start + 4)
        last.append(runner.forward(kv, ids[36:39], parents=[-1, 0])[-1])  # a chain given as a tree
    assert torch.equal(last[0], last[1])
    full = HFRunner(make_tiny_gemma3())  # with a full-attention layer the first token does count
    assert not torch.equal(full.forward(full.new_kv(), ids)[-1], full.forward(full.new_kv(), [other_first(ids), *ids[1:]])[-1])


def other_first(ids: list[int]) -> int:
    """A token other than ``ids[0]``."""
    return (ids[0] + 1) % VOCAB


def test_tree_rows_equal_the_chain_of_their_path(gemma) -> None:
    runner = HFRunner(gemma)
    context = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    tree = [5, 9, 11, 13, 17, 19, 23, 29, 31, 37, 41]
    parents = [-1, 0, 1, 2, 3, 4, 5, 0, 7, 8, 9]  # two branches of depth 7 and 5 from the first token
    kv = runner.new_kv()
    runner.forward(kv, context)
    tree_logits = runner.forward(kv, [2, *tree], parents=parents)
    for leaf_row in (7, 11):  # each branch's path, as a chain
        path, row = [], leaf_row
        while row > 0:
            path.append(row)
            row = parents[row - 1] + 1
        path.reverse()
        kv_chain = runner.new_kv()
        runner.forward(kv_chain, context)
        chain = runner.forward(kv_chain, [2, *(tree[r - 1] for r in path)])
        torch.testing.assert_close(tree_logits[[0, *path]], chain, rtol=0, atol=1e-10)
    kv.compact(len(context) + 1, [r - 1 for r in (1, 2, 3)])  # keep the first three tokens of the long branch
    after = runner.forward(kv, [7])
    kv_chain = runner.new_kv()
    expected = runner.forward(kv_chain, [*context, 2, *tree[:3], 7])[-1:]
    torch.testing.assert_close(after, expected, rtol=0, atol=1e-10)


def test_the_cost_profile_is_measured_through_rollbacks(gemma) -> None:
    profile = measure_cost_model(gemma, lengths=(0, 1, 4, 16), context=40, repeats=1)
    assert profile.verify(0) == 1.0 and profile.verify(16) >= 1.0


@pytest.mark.parametrize("method", ["pld", "hvd"])
def test_hvd_equals_ar_far_past_the_window(engine, method) -> None:
    prompt = [3, 5, 7, 3, 5, 7, 3, 5, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 5, 7]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="ar")).token_ids
    result = engine.generate(prompt, GenerationParams(max_new_tokens=40, method=method))
    assert result.token_ids == reference
    assert len(reference) == 40 and (method == "ar" or result.stats.steps < 40)  # drafts were accepted


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),
    max_new=st.integers(1, 30),
    k=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    tree=st.booleans(),
)
def test_greedy_equality_under_adversarial_drafts(engine, prompt, max_new, k, seed, tree) -> None:
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    drafter = (TreeDrafter if tree else ScriptedDrafter)(reference.token_ids, VOCAB, seed)
    engine.add_drafter("adversarial", drafter)
    params = GenerationParams(max_new_tokens=max_new, method="adversarial", num_draft_tokens=k)
    assert engine.generate(prompt, params).token_ids == reference.token_ids
