"""The CPU kernels the loader installs: row-streaming or packed linear layers and copy-free GQA attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from hvd_agents import Engine, GenerationParams
from hvd_agents.errors import InvalidRequestError
from hvd_agents.runtime.cpu import row_linear as native_linear
from hvd_agents.runtime.cpu.kernels import (
    ATTENTION_NAME,
    LINEAR_ENV,
    PackedLinear,
    can_pack,
    is_packed,
    linear_kernel,
    match_linear_kernel,
    prepare_for_cpu,
    resolve_linear_kernel,
)
from hvd_agents.runtime.cpu.row_linear import RowLinear
from hvd_agents.runtime.kv import cache_argument
from hvd_agents.runtime.profile import profile_key
from tests.drafters_for_tests import FixedDrafter
from tests.tiny import make_tiny_llama

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
# Where the CPU has AVX2 the row kernel must build: a build failure there fails these tests.
needs_avx2 = pytest.mark.skipif(not native_linear.cpu_supports_kernel(), reason="the row kernel needs x86-64 with AVX2")
KERNELS = [pytest.param("packed", marks=needs_onednn), pytest.param("row", marks=needs_avx2)]


def _pair(seed: int = 3, kernel: str = "packed"):
    """The same tiny float32 GQA Llama twice: dense, and prepared for the CPU with ``kernel``."""
    dense = make_tiny_llama(96, seed=seed, dtype=torch.float32)
    prepared = make_tiny_llama(96, seed=seed, dtype=torch.float32)
    assert prepare_for_cpu(prepared, kernel) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    assert linear_kernel(prepared) == kernel
    return dense, prepared


@needs_avx2
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 32, 33, 70])
@pytest.mark.parametrize("in_features", [24, 29, 576])
@pytest.mark.parametrize("bias", [False, True])
def test_row_linear_computes_the_linear_layer(rows: int, in_features: int, bias: bool) -> None:
    """Every tile shape (one pass up to 8 rows; beyond, rows mod 4 and output rows mod 3), a K that is not a multiple of 8, and the prefill path."""
    torch.manual_seed(rows * in_features)
    linear = nn.Linear(in_features, 41, bias=bias)
    x = torch.randn(1, rows, in_features)
    got = RowLinear(linear)(x)
    assert got.shape == (1, rows, 41)
    torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)


@needs_avx2
def test_row_linear_gives_a_row_the_same_bits_alone_or_among_others() -> None:
    """What makes a verified token's logits those of a one-token step, bit for bit."""
    torch.manual_seed(0)
    layer = RowLinear(nn.Linear(200, 67))
    x = torch.randn(native_linear.MAX_ROWS, 200)
    together = layer(x)
    for i in range(x.shape[0]):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])
    for rows in range(2, x.shape[0]):  # every tile shape: one pass up to 8 rows, 4-row tiles beyond
        assert torch.equal(layer(x[:rows]), together[:rows])
    assert torch.equal(layer(x[5:12]), together[5:12])


@needs_avx2
def test_row_linear_splits_work_across_threads_without_changing_a_bit() -> None:
    torch.manual_seed(1)
    layer = RowLinear(nn.Linear(576, 193))
    x = torch.randn(5, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = layer(x)
        torch.set_num_threads(max(2, threads))
        shared = layer(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, shared)


@pytest.mark.parametrize("layer", [pytest.param(RowLinear, marks=needs_avx2, id="row"),
                                   pytest.param(PackedLinear, marks=needs_onednn, id="packed")])
def test_cpu_linear_layers_refuse_other_dtypes(layer) -> None:
    with pytest.raises(ValueError, match=f"{layer.__name__} takes float32 CPU weights"):
        layer(nn.Linear(4, 4).double())
    with pytest.raises(ValueError, match=f"{layer.__name__} takes float32 CPU inputs"):
        layer(nn.Linear(8, 4))(torch.zeros(1, 8, dtype=torch.float64))


@needs_avx2
def test_row_linear_refuses_mismatched_shapes() -> None:
    with pytest.raises(RuntimeError, match="last dimension"):
        torch.ops.hvd.row_linear(torch.zeros(2, 7), torch.zeros(4, 8), None)


def test_kernel_names_are_checked(monkeypatch) -> None:
    from hvd_agents.runtime.loading import load_model

    with pytest.raises(InvalidRequestError, match="cpu_linear='fast'"):
        load_model("embedded", cpu_linear="fast")
    with pytest.raises(ValueError, match="cpu_linear='fast'"):
        prepare_for_cpu(make_tiny_llama(96, dtype=torch.float32), "fast")
    monkeypatch.setenv(LINEAR_ENV, "turbo")
    with pytest.raises(ValueError, match=f"{LINEAR_ENV}='turbo'"):
        resolve_linear_kernel("auto")
    monkeypatch.setenv(LINEAR_ENV, "dense")
    assert resolve_linear_kernel("auto") == "dense"
    assert resolve_linear_kernel("packed") == "packed" or not torch.backends.mkldnn.is_available()


def test_without_the_native_kernel_auto_falls_back_and_row_says_why(monkeypatch) -> None:
    monkeypatch.delenv(LINEAR_ENV, raising=False)
    monkeypatch.setattr(native_linear, "_state", {"ok": False, "why": "no compiler here"})
    assert resolve_linear_kernel("auto") == ("packed" if torch.backends.mkldnn.is_available() else "dense")
    with pytest.raises(ValueError, match="no compiler here"):
        resolve_linear_kernel("row")
    model = make_tiny_llama(96, dtype=torch.float32)
    prepare_for_cpu(model)
    assert linear_kernel(model) != "row"


@needs_onednn
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


@pytest.mark.parametrize("kernel", KERNELS)
def test_prepared_model_matches_dense_through_a_cache(kernel: str) -> None:
    """Prefill, a multi-token verification chunk (masked GQA) and single steps, against the dense model."""
    dense, packed = _pair(kernel=kernel)
    assert packed.config._attn_implementation == ATTENTION_NAME
    assert is_packed(packed) and not is_packed(dense)
    assert packed.get_output_embeddings().weight is not None  # draft heads read its rows
    ids = torch.randint(0, 96, (1, 60), generator=torch.Generator().manual_seed(0))
    caches = {name: DynamicCache(config=m.config) for name, m in (("dense", dense), ("packed", packed))}
    arg = cache_argument(dense)
    with torch.inference_mode():
        for chunk in (slice(0, 40), slice(40, 49), slice(49, 50), slice(50, 60)):
            want = dense(ids[:, chunk], **{arg: caches["dense"]}, use_cache=True).logits
            got = packed(ids[:, chunk], **{arg: caches["packed"]}, use_cache=True).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_float64_models_are_left_as_they_are() -> None:
    model = make_tiny_llama(96, seed=1)  # float64
    assert not can_pack(model)
    assert prepare_for_cpu(model) == 0
    assert not is_packed(model) and model.config._attn_implementation != ATTENTION_NAME


@needs_onednn
@needs_avx2
def test_cost_profiles_of_each_kernel_are_kept_apart() -> None:
    dense, packed = _pair()
    _, row = _pair(kernel="row")
    assert len({profile_key(dense), profile_key(packed), profile_key(row)}) == 3


@pytest.mark.parametrize("kernel", KERNELS)
def test_engine_greedy_equality_on_a_prepared_model(byte_tokenizer, kernel: str) -> None:
    """Every token of a drafted run equals the same engine's one-token-per-step run."""
    _, packed = _pair(seed=11, kernel=kernel)
    engine = Engine(packed, byte_tokenizer, eos_token_ids=(), draft_head=None)
    prompt = list(range(5, 45))
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="ar")).token_ids
    for name, draft in (("wrong", [1, 2, 3, 4, 5, 6]), ("right", list(reference[:6]))):
        engine.add_drafter(name, FixedDrafter(draft))
        got = engine.generate(prompt, GenerationParams(max_new_tokens=40, method=name, num_draft_tokens=6))
        assert got.token_ids == reference
    pld = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="pld", num_draft_tokens=8))
    assert pld.token_ids == reference


@needs_avx2
def test_a_drafter_takes_the_row_kernel_only_from_a_row_target() -> None:
    torch.manual_seed(2)
    head = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 8))
    x = torch.randn(3, 16)
    want = head(x)
    _, packed = _pair(kernel="packed") if torch.backends.mkldnn.is_available() else (None, None)
    if packed is not None:
        assert match_linear_kernel(head, packed) == 0 and linear_kernel(head) == "dense"
    _, row = _pair(kernel="row")
    assert match_linear_kernel(head, row) == 2 and linear_kernel(head) == "row"
    torch.testing.assert_close(head(x), want, rtol=1e-5, atol=1e-5)
    assert match_linear_kernel(nn.Linear(4, 4).double(), row) == 0


@needs_avx2
def test_a_draft_head_on_the_row_kernel_projects_its_logits_on_it_too(monkeypatch) -> None:
    """Drafting reads the head's draft-vocabulary logits from the row kernel; training keeps PyTorch's product."""
    from hvd_agents.draft_head import DraftHead, DraftHeadConfig
    from hvd_agents.draft_head.model import init_weights, target_signature

    _, row = _pair(kernel="row")
    config = DraftHeadConfig(row.config.hidden_size, 4, 64, 48, row.config.vocab_size, target=target_signature(row))
    head = init_weights(DraftHead(config)).attach(row)
    feature = torch.randn(3, config.hidden_size)
    with torch.inference_mode():
        dense = head.logits(feature)
    assert match_linear_kernel(head, row) > 0
    calls = []
    kernel = native_linear.row_linear
    monkeypatch.setattr("hvd_agents.draft_head.model.row_linear", lambda *args: calls.append(args) or kernel(*args))
    with torch.inference_mode():
        got = head.logits(feature)
    assert len(calls) == 1 and calls[0][1] is head.lm_rows
    torch.testing.assert_close(got, dense, rtol=1e-5, atol=1e-5)
    trained = feature.clone().requires_grad_(True)  # with gradients (training) the kernel, which has none, is not used
    head.logits(trained).sum().backward()
    assert len(calls) == 1 and trained.grad is not None
