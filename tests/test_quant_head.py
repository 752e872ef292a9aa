"""A draft head on the native int8 kernel (``DraftHead.quantize_for_cpu``): lossless, and the same drafts on any
number of threads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.draft_head import DraftHead, DraftHeadConfig, HeadCache
from hvd_agents.draft_head.model import init_weights, target_signature
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.quant_linear import QuantLinear
from tests.tiny import make_tiny_llama

pytestmark = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")
VOCAB = 64


@pytest.fixture(scope="module")
def target():
    return make_tiny_llama(VOCAB, seed=11, dtype=torch.float32)


def quantized_head(target, threads: int = 1) -> DraftHead:
    config = DraftHeadConfig(target.config.hidden_size, 4, 64, 48, VOCAB, target=target_signature(target))
    head = init_weights(DraftHead(config), seed=3)
    head.draft_vocab = torch.arange(VOCAB - 48, VOCAB)
    head.attach(target)
    assert head.quantize_for_cpu(threads) == 5
    return head


def drafted_logits(head: DraftHead, steps: int = 6) -> list[torch.Tensor]:
    """The head's logits as it ingests a context and then drafts ``steps`` tokens at the feature level."""
    d = head.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    cache = HeadCache()
    features = torch.randn(9, d, generator=generator)
    predicted, logits = head.step(features, torch.arange(9) + 20, list(range(9)), cache)
    out = [logits]
    feature = predicted[-1:]
    for i in range(steps):
        token = int(head.draft_vocab[int(logits.argmax())])
        feature, logits = head.step(feature, torch.tensor([token]), [9 + i], cache)
        out.append(logits)
    return out


def test_the_head_drafts_the_same_on_one_thread_and_on_the_team(target) -> None:
    one, team = quantized_head(target, threads=1), quantized_head(target, threads=2)
    for a, b in zip(drafted_logits(one), drafted_logits(team)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))  # bitwise
    team.quantize_for_cpu(0)  # the caller's team size
    for a, b in zip(drafted_logits(one), drafted_logits(team)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("window", [None, 5])
def test_the_fused_step_is_the_layer_by_layer_step(target, window) -> None:
    # a drafted index in one native call computes what the layers compute one PyTorch operation at a time: the
    # same keys and values kept, the same logits to float rounding, so the same drafts
    fused, layered = quantized_head(target), quantized_head(target)
    layered.quantize_for_cpu(1, fused=False)
    fused.attention_window = layered.attention_window = window
    caches = HeadCache(), HeadCache()
    for head, cache in zip((fused, layered), caches):
        head.step(torch.randn(9, head.config.hidden_size, generator=torch.Generator().manual_seed(1)),
                  torch.arange(9) + 20, list(range(9)), cache)
    feature = torch.randn(1, fused.config.hidden_size, generator=torch.Generator().manual_seed(2))
    for i in range(8):
        (pf, lf), (pl, ll) = (head.step(feature, torch.tensor([30 + i]), [9 + i], cache)
                              for head, cache in zip((fused, layered), caches))
        torch.testing.assert_close(lf, ll, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pf, pl, rtol=1e-4, atol=1e-5)
        assert int(lf.argmax()) == int(ll.argmax())
        feature = pf
    more = torch.randn(3, fused.config.hidden_size, generator=torch.Generator().manual_seed(3))
    (pf, lf), (pl, ll) = (head.step(more, torch.tensor([40, 41, 42]), [17, 18, 19], cache)
                          for head, cache in zip((fused, layered), caches))  # several indices in one step
    torch.testing.assert_close(lf, ll, rtol=1e-4, atol=1e-5)
    (kf, vf), (kl, vl) = ((c.keys[:, : len(c)], c.values[:, : len(c)]) for c in caches)
    assert caches[0].positions == caches[1].positions == list(range(20))
    torch.testing.assert_close(kf, kl, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(vf, vl, rtol=1e-4, atol=1e-5)


def test_the_fused_steps_keys_do_not_depend_on_how_indices_were_grouped(target) -> None:
    # one step of 12 indices, or steps of 5, 1, 4 and 2: the same keys, values and last logits, bit for bit (what
    # lets a drafter that kept its state draft what a fresh one drafts from the same verified context)
    head = quantized_head(target)
    features = torch.randn(12, head.config.hidden_size, generator=torch.Generator().manual_seed(4))
    tokens = torch.arange(12) + 20
    whole, parts = HeadCache(), HeadCache()
    _, expected = head.step(features, tokens, list(range(12)), whole)
    start = 0
    for size in (5, 1, 4, 2):
        _, got = head.step(features[start : start + size], tokens[start : start + size],
                           list(range(start, start + size)), parts)
        start += size
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert torch.equal(parts.keys[:, :12], whole.keys[:, :12]) and torch.equal(parts.values[:, :12], whole.values[:, :12])


def test_quantized_layers_are_close_to_the_float_ones_and_train_on_them(target) -> None:
    head = quantized_head(target)
    assert isinstance(head.fc, QuantLinear) and head.lm_matrix is not None
    x = torch.randn(3, 2 * head.config.hidden_size)
    with torch.inference_mode():
        quantized = head.fc(x)
        exact = x @ head.fc.weight.T
    assert torch.allclose(quantized, exact, rtol=0.05, atol=0.05 * float(exact.abs().max()))
    with torch.enable_grad():  # training reads the float weights
        assert torch.equal(head.fc(x), torch.nn.functional.linear(x, head.fc.weight))
    assert set(head.state_dict()) == set(init_weights(DraftHead(head.config)).state_dict())


def test_many_rows_run_on_the_kernel_a_call_at_a_time(target, monkeypatch) -> None:
    # a catch-up over a long context goes through the kernel too, in calls of at most MAX_ROWS rows; a row's
    # result does not depend on the rows beside it, so it is the row's own product, bit for bit
    from hvd_agents.runtime.cpu import quant_linear

    assert quant_linear.MAX_ROWS == native_forward.module().MAX_ROWS
    head = quantized_head(target)
    x = torch.randn(11, 2 * head.config.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        alone = torch.cat([head.fc(row[None]) for row in x])
        monkeypatch.setattr(quant_linear, "MAX_ROWS", 4)  # 11 rows: calls of 4, 4 and 3
        together = head.fc(x)
    assert torch.equal(together.view(torch.int32), alone.view(torch.int32))
    assert not torch.equal(together, torch.nn.functional.linear(x, head.fc.weight))  # not the float layer


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    max_new=st.integers(1, 30),
    k=st.integers(0, 8),
    method=st.sampled_from(["model", "hvd"]),
)
def test_greedy_equality_with_a_quantized_head(target, prompt, max_new, k, method) -> None:
    engine = Engine(target, eos_token_ids=(), draft_head=quantized_head(target), prefix_cache_bytes=1 << 22)
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar", reuse_prefix=False))
    result = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method=method, num_draft_tokens=k))
    assert result.token_ids == reference.token_ids
