"""The CPU kernels the loader installs: packed linear layers and copy-free grouped-query attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from hvd_agents import Engine, GenerationParams
from hvd_agents.cpu_kernels import ATTENTION_NAME, PackedLinear, can_pack, is_packed, prepare_for_cpu
from hvd_agents.policy.cost import profile_key
from tests.drafters_for_tests import FixedDrafter
from tests.tiny import make_tiny_llama

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


def _pair(seed: int = 3):
    """The same tiny float32 GQA Llama twice: dense, and prepared for the CPU."""
    dense = make_tiny_llama(96, seed=seed, dtype=torch.float32)
    packed = make_tiny_llama(96, seed=seed, dtype=torch.float32)
    assert prepare_for_cpu(packed) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    return dense, packed


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_computes_the_linear_layer(rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    linear = nn.Linear(24, 40, bias=bias)
    x = torch.randn(2, rows, 24)
    expected = linear(x)
    got = PackedLinear(linear)(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert PackedLinear(linear).weight is None
    assert PackedLinear(linear, keep_dense=True).weight is linear.weight


def test_packed_linear_refuses_other_dtypes() -> None:
    with pytest.raises(ValueError, match="float32 CPU weights"):
        PackedLinear(nn.Linear(4, 4).double())
    with pytest.raises(ValueError, match="float32 CPU inputs"):
        PackedLinear(nn.Linear(4, 4))(torch.zeros(1, 4, dtype=torch.float64))


def test_prepared_model_matches_dense_through_a_cache() -> None:
    """Prefill, a multi-token verification chunk (masked GQA) and single steps, against the dense model."""
    dense, packed = _pair()
    assert packed.config._attn_implementation == ATTENTION_NAME
    assert is_packed(packed) and not is_packed(dense)
    assert packed.get_output_embeddings().weight is not None  # draft heads read its rows
    ids = torch.randint(0, 96, (1, 60), generator=torch.Generator().manual_seed(0))
    caches = {name: DynamicCache(config=m.config) for name, m in (("dense", dense), ("packed", packed))}
    with torch.inference_mode():
        for chunk in (slice(0, 40), slice(40, 49), slice(49, 50), slice(50, 60)):
            want = dense(ids[:, chunk], past_key_values=caches["dense"], use_cache=True).logits
            got = packed(ids[:, chunk], past_key_values=caches["packed"], use_cache=True).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_float64_models_are_left_as_they_are() -> None:
    model = make_tiny_llama(96, seed=1)  # float64
    assert not can_pack(model)
    assert prepare_for_cpu(model) == 0
    assert not is_packed(model) and model.config._attn_implementation != ATTENTION_NAME


def test_cost_profiles_of_packed_and_dense_models_are_kept_apart() -> None:
    dense, packed = _pair()
    assert profile_key(dense) != profile_key(packed)


def test_engine_greedy_equality_on_a_prepared_model(byte_tokenizer) -> None:
    """Every token of a drafted run equals the same engine's one-token-per-step run."""
    _, packed = _pair(seed=11)
    engine = Engine(packed, byte_tokenizer, eos_token_ids=(), draft_head=None)
    prompt = list(range(5, 45))
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="ar")).token_ids
    for name, draft in (("wrong", [1, 2, 3, 4, 5, 6]), ("right", list(reference[:6]))):
        engine.add_drafter(name, FixedDrafter(draft))
        got = engine.generate(prompt, GenerationParams(max_new_tokens=40, method=name, num_draft_tokens=6))
        assert got.token_ids == reference
    pld = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="pld", num_draft_tokens=8))
    assert pld.token_ids == reference
