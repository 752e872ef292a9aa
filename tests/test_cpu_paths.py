"""The native forward's instruction-set paths: every path this CPU runs gives the AVX2 path's bits.

Each path is the same source built with other flags (``runtime/native/isa.h``); the tests
compare every path this CPU can run against ``avx2`` on the kernel (every weight format, 1 to
64 rows), on whole forwards of tiny models (prompts whole and chunked, drafts, trees) and, with
the embedded model, on logits and engine outputs; attention alone on random queries, keys and values
of real head sizes (the tiny models' heads are 8 wide). A build whose groups of blocks, or a key's
score lanes, are added in another order must fail the comparison, so the check can see a change of
accumulation order.
On a CPU with AVX2 only, the comparisons run ``avx2`` against itself and the mutation against it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.runtime import quant_native, quant_weights
from hvd_agents.runtime.quant_runner import NativeModel, QuantRunner
from hvd_agents.runtime.target import Target
from tests.kquant_model import kquant_weights, make_kquant_llama
from tests.tiny import make_tiny_llama

pytestmark = pytest.mark.skipif(not quant_native.available(), reason="the native kernel needs x86-64 with AVX2")

VOCAB = 96
PATHS = quant_native.cpu_paths() if quant_native.available() else []


@pytest.mark.parametrize("path", PATHS)
def test_every_path_computes_the_reference_bits_on_the_kernel(path) -> None:
    assert quant_native.compare_paths(quant_native.build(quant_native.REFERENCE), quant_native.build(path)) == []


def test_a_path_with_another_accumulation_order_fails_the_comparison() -> None:
    # the best path this CPU runs, built adding its groups of 8 blocks in reverse (one line under a macro)
    path = PATHS[-1]
    mutated = quant_native.build(path, ("-DHVD_MUTATE_GROUP_ORDER",))
    differences = quant_native.compare_paths(quant_native.build(quant_native.REFERENCE), mutated)
    assert differences and any("800" in d for d in differences)  # 25 blocks of 32: four groups, the order shows
    assert not any("96" in d for d in differences)  # one group: nothing to reorder, the same bits
    # and on every format: the K-quants' super-blocks and the 5-bit records as much as the others
    assert {d.split()[0] for d in differences} == {quant_native.FORMAT_NAMES[f] for f in quant_native.QUANTIZED}


@pytest.mark.parametrize("path", PATHS)
def test_a_path_whose_attention_adds_a_score_otherwise_fails_the_comparison(path) -> None:
    # attention built adding a key's score lanes in another order where a pass holds several queries: the
    # comparison (which the self-check runs before a path is used) names the attention cases it changes
    mutated = quant_native.build(path, ("-DHVD_MUTATE_ATTENTION_ORDER",))
    differences = quant_native.attention_differences(quant_native.build(quant_native.REFERENCE), mutated,
                                                     np.random.default_rng(0))
    assert any("attention of 24 queries, head_dim 64" in d for d in differences), differences
    assert not any("attention of 1 queries" in d for d in differences)  # one query a pass: nothing reordered


def _on_path(model: torch.nn.Module, weights, path: str) -> QuantRunner:
    return QuantRunner(NativeModel(model, weights, 512, path))


@pytest.mark.parametrize("scheme", ["int8", "int4", "kquant"])
def test_whole_forwards_are_bitwise_the_same_on_every_path(scheme) -> None:
    if scheme == "kquant":  # random GGUF K-quant and 5-bit blocks in the loader's records
        model = make_kquant_llama(VOCAB, seed=4)
        weights = kquant_weights(model, wide=False, seed=4)
    else:
        model = make_tiny_llama(VOCAB, seed=4, dtype=torch.float32)
        weights = quant_weights.from_model(model, scheme)
    ids = torch.randint(0, VOCAB, (290,), generator=torch.Generator().manual_seed(2)).tolist()
    outputs = {}
    for path in PATHS:
        runner = _on_path(model, weights, path)
        kv = runner.new_kv()
        whole = runner.forward(kv, ids[:280])  # a prompt longer than one native call
        draft = runner.forward(kv, ids[280:])  # a draft of 10 rows
        kv.rollback(280)
        tree = runner.forward(kv, ids[280:285], parents=[-1, 0, 0, 2])
        outputs[path] = (whole, draft, tree, kv.k[:, :, :285].clone())
    reference = outputs[quant_native.REFERENCE]
    for path, got in outputs.items():
        assert all(torch.equal(a, b) for a, b in zip(got, reference)), path


def test_a_forced_path_is_refused_with_its_cause(monkeypatch) -> None:
    monkeypatch.setattr(quant_native, "_state", {})
    monkeypatch.setenv(quant_native.ENV, "sse2")
    with pytest.raises(ValueError, match="HVD_AGENTS_CPU_ISA='sse2' is not a CPU path"):
        quant_native.available()
    monkeypatch.setattr(quant_native, "_state", {})
    monkeypatch.setenv(quant_native.ENV, "avx512-vnni")
    monkeypatch.setattr(quant_native, "cpu_paths", lambda: ["avx2"])
    with pytest.raises(ValueError, match="this CPU cannot run it"):
        quant_native.available()


def test_a_path_that_fails_its_self_check_is_not_used(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))  # a fresh machine: no recorded verdicts
    monkeypatch.setattr(quant_native, "_state", {})
    monkeypatch.delenv(quant_native.ENV, raising=False)
    monkeypatch.setattr(quant_native, "cpu_paths", lambda: ["avx2", "avx512-vnni"])
    monkeypatch.setattr(quant_native, "build", lambda path, extra=(): path)
    monkeypatch.setattr(quant_native, "compare_paths", lambda a, b: ["q4_1 37x800, 16 rows"])
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.quant_native"):
        assert quant_native.available() and quant_native.path() == "avx2"
    assert "avx512-vnni not used: its results differ from avx2's (q4_1 37x800, 16 rows)" in caplog.text
    # the verdict is recorded beside the build: the next process does not compare again
    monkeypatch.setattr(quant_native, "compare_paths", lambda a, b: pytest.fail("compared again"))
    assert quant_native.self_check("avx512-vnni").startswith("its results differ")
    monkeypatch.setenv(quant_native.ENV, "avx512-vnni")
    monkeypatch.setattr(quant_native, "_state", {})
    with pytest.raises(ValueError, match="failed its self-check"):
        quant_native.available()


@pytest.mark.real_model
def test_the_embedded_model_gives_the_same_bits_and_tokens_on_every_path(real_engine) -> None:
    model = real_engine.model
    native = real_engine.target.native
    ids = real_engine.tokenizer("The capital of France is Paris. " * 40)["input_ids"]  # a prompt of 2 native calls
    weights = native.reload()
    results = {}
    for path in PATHS:
        on_path = NativeModel(model, weights, native.context_window, path)
        engine = Engine(Target.of(model, real_engine.tokenizer, cost_model=real_engine.runner.profile(),
                                  native=on_path))
        runner = engine.runner
        assert runner.native.path == path
        logits = runner.forward(runner.new_kv(), ids, logits_to_keep=4)
        tokens = engine.generate(ids, GenerationParams(method="hvd", max_new_tokens=24)).token_ids
        results[path] = (logits, tokens)
    reference = results[quant_native.REFERENCE]
    for path, (logits, tokens) in results.items():
        assert torch.equal(logits, reference[0]) and tokens == reference[1], path


@pytest.mark.real_model
def test_bench_paths_prints_every_path_and_their_bits(real_engine, capsys) -> None:
    from hvd_agents.bench.cpu_paths import run_path_benchmark

    figures = run_path_benchmark(loaded=real_engine.target, rounds=1, repeats=1, context=32, drafts=(1, 4), prefills=(40,))
    assert list(figures) == PATHS
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] and line.split()[0] in PATHS]
    assert [row[0] for row in rows] == PATHS and all(row[-1] == "yes" for row in rows)
    assert all(float(v) > 0 for row in rows for v in row[1:-1])
    assert real_engine.runner.native.path == quant_native.path()  # the engine's own path is untouched
