"""The native forward's instruction-set paths: every path this CPU runs gives the AVX2 path's bits.

Each path is the same source built with other flags (``runtime/cpu/native/isa.h``); the tests
compare every path this CPU can run against ``avx2`` on the kernel (every weight format, 1 to
64 rows), on whole forwards of tiny models (prompts whole and chunked, drafts, trees) and, with
the embedded model, on logits and engine outputs; attention alone on random queries, keys and values
of real head sizes (the tiny models' heads are 8 wide). A build whose groups of blocks, or a key's
score lanes, are added in another order must fail the comparison, so the check can see a change of
accumulation order.
On a CPU with AVX2 only, the comparisons run ``avx2`` against itself and the mutation against it.

The ``amx`` path's tiles are checked on every CPU through its test build (``amx-emulated``: the tile
instructions on a software model of them), and on a CPU with AMX through the real path as well: every
format on 1 to 130 rows, whole forwards, the tile instructions against their definition, and two
mutations of the tile passes (their groups added in reverse; a half block's dots without the K split)
that the comparison must catch.

The self-check compares in a child process: its answer is the comparison's, and a build that faults there
(``-DHVD_MUTATE_CRASH``: an illegal instruction in calls of 8 rows or more) is refused, its verdict recorded,
with this process unharmed.
"""

from __future__ import annotations

import itertools
import json
import logging

import numpy as np
import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.target import Target
from tests.kquant_model import kquant_weights, make_kquant_llama
from tests.tiny import make_tiny_llama

pytestmark = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")

VOCAB = 96
PATHS = native_forward.cpu_paths() if native_forward.available() else []
# the amx path's builds under test: the real one where this CPU and OS run it, and its emulation everywhere
TILE_BUILDS = [*(p for p in PATHS if p == "amx"), native_forward.EMULATED_AMX] if PATHS else []


@pytest.mark.parametrize("path", [*PATHS, *TILE_BUILDS[-1:]])
def test_every_path_computes_the_reference_bits_on_the_kernel(path) -> None:
    assert native_forward.compare_paths(native_forward.build(native_forward.REFERENCE),
                                        native_forward.build(path)) == []


def test_a_path_with_another_accumulation_order_fails_the_comparison() -> None:
    # the best path this CPU runs, built adding its groups of 8 blocks in reverse (one line under a macro)
    path = PATHS[-1]
    mutated = native_forward.build(path, ("-DHVD_MUTATE_GROUP_ORDER",))
    differences = native_forward.compare_paths(native_forward.build(native_forward.REFERENCE), mutated)
    assert differences and any("800" in d for d in differences)  # 25 blocks of 32: four groups, the order shows
    assert not any("96" in d for d in differences)  # one group: nothing to reorder, the same bits
    # and on every format: the K-quants' super-blocks and the 5-bit records as much as the others
    assert {d.split()[0] for d in differences} == {native_forward.FORMAT_NAMES[f] for f in native_forward.QUANTIZED}


@pytest.mark.parametrize("path", PATHS)
def test_a_path_whose_attention_adds_a_score_otherwise_fails_the_comparison(path) -> None:
    # attention built adding a key's score lanes in another order where a pass holds several queries: the
    # comparison (which the self-check runs before a path is used) names the attention cases it changes
    mutated = native_forward.build(path, ("-DHVD_MUTATE_ATTENTION_ORDER",))
    differences = native_forward.attention_differences(native_forward.build(native_forward.REFERENCE), mutated,
                                                     np.random.default_rng(0))
    assert any("attention of 24 queries, head_dim 64" in d for d in differences), differences
    assert not any("attention of 1 queries" in d for d in differences)  # one query a pass: nothing reordered


def _tile_rows(module) -> list[int]:
    """The compared row counts with a pass on tiles in ``module`` (an amx build)."""
    return [m for m in native_forward.COMPARED_ROWS if m >= module.TILE_MIN_ROWS]


def _rows_and_formats(differences: list[str]) -> tuple[set[int], set[str]]:
    """The row counts and the formats the differences of :func:`native_forward.compare_paths` name."""
    linear = [d for d in differences if not d.startswith("attention")]
    return {int(d.split(", ")[1].split()[0]) for d in linear}, {d.split()[0] for d in linear}


@pytest.mark.parametrize("path", TILE_BUILDS)
def test_the_amx_path_gives_the_reference_bits_for_every_format_on_1_to_130_rows(path) -> None:
    # every quantized format, a weight of several groups of blocks and a partial tile of weight rows, every row count
    # from 1 to 130: passes on the vector code (under TILE_MIN_ROWS rows), on tiles of 8 to 16 rows, and calls of
    # several passes whose last one is partial
    reference, amx = native_forward.build(native_forward.REFERENCE), native_forward.build(path)
    assert amx.ISA == path and 1 < amx.TILE_MIN_ROWS <= 16
    rng = np.random.default_rng(5)
    for fmt in native_forward.QUANTIZED:
        cols = 1280 if native_forward.RECORDS[fmt][0] == 8 else 800
        state = rng.bit_generator.state
        wa = native_forward.random_weight(reference, fmt, 37, cols, rng)
        rng.bit_generator.state = state
        wb = native_forward.random_weight(amx, fmt, 37, cols, rng)
        x = torch.from_numpy((rng.standard_normal((130, cols)) * rng.uniform(0.1, 10)).astype(np.float32))
        for m in range(1, 131):
            ya, yb = reference.linear(wa, x[:m]), amx.linear(wb, x[:m])
            assert torch.equal(ya.view(torch.int32), yb.view(torch.int32)), (native_forward.FORMAT_NAMES[fmt], m)


@pytest.mark.parametrize("path", TILE_BUILDS)
def test_an_amx_path_whose_tile_passes_add_their_groups_otherwise_fails_the_comparison(path) -> None:
    # the float phase after a pass on tiles adding the groups of 8 blocks in reverse (one line under a macro): the
    # comparison names every format, on the weights of several groups and exactly the row counts with a pass on
    # tiles; a decode step and few-row calls (vector code) keep the bits, as do weights of one group
    mutated = native_forward.build(path, ("-DHVD_MUTATE_AMX_GROUP_ORDER",))
    differences = native_forward.compare_paths(native_forward.build(native_forward.REFERENCE), mutated)
    rows, formats = _rows_and_formats(differences)
    assert rows == set(_tile_rows(mutated)), differences
    assert formats == {native_forward.FORMAT_NAMES[f] for f in native_forward.QUANTIZED}
    assert not any(" 16x256," in d or " 5x96," in d or d.startswith("attention") for d in differences)


@pytest.mark.parametrize("path", TILE_BUILDS)
def test_an_amx_path_without_the_half_block_split_fails_the_comparison(path) -> None:
    # the tiles taking a half-block format's dots as one product over the whole block (K 32, not two of 16): the
    # comparison names exactly the formats with a scale per 16 weights, on the row counts with a pass on tiles
    mutated = native_forward.build(path, ("-DHVD_MUTATE_AMX_K_SPLIT",))
    differences = native_forward.compare_paths(native_forward.build(native_forward.REFERENCE), mutated)
    rows, formats = _rows_and_formats(differences)
    assert formats == {"q6s", "q6k", "q2k"} and rows == set(_tile_rows(mutated)), differences


@pytest.mark.parametrize("path", TILE_BUILDS)
def test_tile_products_are_the_instructions_definition(path) -> None:
    # c[m, n] += sum over k of a[m, k] b[k / 4, 4 n + k % 4], bytes signed or unsigned as the instruction says
    # (tdpbssd, tdpbsud, tdpbusd, tdpbuud), in int32 with wraparound: on an AMX CPU the hardware's results, in the
    # test build the model's, against the same definition
    module = native_forward.build(path)
    rng = np.random.default_rng(9)
    for m, k, n in ((16, 64, 16), (16, 32, 16), (9, 16, 16), (1, 4, 1), (13, 40, 5)):
        for a_signed, b_signed in itertools.product((True, False), repeat=2):
            a = rng.integers(0, 256, (m, k), dtype=np.uint8)
            b = rng.integers(0, 256, (k // 4, 4 * n), dtype=np.uint8)
            c = rng.integers(-(2**31), 2**31, (m, n), dtype=np.int64).astype(np.int32)
            c[0, 0] = 2**31 - 1  # a positive product past the largest int32 wraps to negative
            got = module.tile_product(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b), a_signed, b_signed)
            av = (a.view(np.int8) if a_signed else a).astype(np.int64)
            bv = (b.view(np.int8) if b_signed else b).astype(np.int64).reshape(k // 4, n, 4).transpose(0, 2, 1)
            exact = c.astype(np.int64) + av @ bv.reshape(k, n)
            expected = ((exact + 2**31) % 2**32 - 2**31).astype(np.int32)
            assert np.array_equal(got.numpy(), expected), (m, k, n, a_signed, b_signed)


def test_the_amx_test_build_runs_the_self_check(monkeypatch, tmp_path) -> None:
    # the check a path passes before it runs on a machine, run on the amx path's test build (its verdict recorded
    # beside the build, as for a real path); it is never offered to run a model
    native_forward.build(native_forward.REFERENCE), native_forward.build(native_forward.EMULATED_AMX)  # loaded before
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))  # no recorded verdicts
    assert native_forward.self_check(native_forward.EMULATED_AMX) == ""
    assert list(tmp_path.glob("native/*/selfcheck-*.json"))
    assert native_forward.EMULATED_AMX not in native_forward.cpu_paths()


def test_the_self_checks_child_answers_what_this_process_compares() -> None:
    # the self-check compares in a child process that loads the same two libraries: the same list as compare_paths
    # here, for a path that agrees (none) and for a mutated build that does not (every difference, in order)
    reference, best = native_forward.build(native_forward.REFERENCE), native_forward.build(PATHS[-1])
    assert native_forward.compare_in_child(reference, best) == native_forward.compare_paths(reference, best) == []
    mutated = native_forward.build(PATHS[-1], ("-DHVD_MUTATE_GROUP_ORDER",))
    differences = native_forward.compare_in_child(reference, mutated)
    assert differences and differences == native_forward.compare_paths(reference, mutated)


def test_a_path_that_crashes_its_self_check_is_refused_and_this_process_goes_on(monkeypatch, tmp_path) -> None:
    # a build whose linear faults on 8 rows or more (__builtin_trap: SIGILL, as an instruction the CPU refuses would):
    # the child dies, the path is refused naming the signal, and the refusal is recorded like any verdict
    flags = ("-DHVD_MUTATE_CRASH",)
    native_forward.build(native_forward.REFERENCE), native_forward.build(PATHS[-1], flags)  # built and loaded before
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))  # no recorded verdicts
    why = native_forward.self_check(PATHS[-1], flags)
    assert why == "its self-check crashed (SIGILL, illegal instruction) in a child process"
    records = list(tmp_path.glob(f"native/{native_forward.path_key(PATHS[-1], flags)}/selfcheck-*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text()) == {"path": PATHS[-1], "why": why}
    # asked again (another process, the same build): the recorded verdict, no child
    monkeypatch.setattr(native_forward, "compare_in_child", lambda a, b: pytest.fail("compared again"))
    assert native_forward.self_check(PATHS[-1], flags) == why


def test_a_self_check_child_that_exits_hangs_or_cannot_start_is_read_as_such(monkeypatch) -> None:
    # the parent's reading of its child, on stand-in children (no builds run): a non-zero status once started is a
    # refusal with the child's last words, as is an answer too slow; a child that never started says nothing of the
    # builds (raised, not recorded); an exception in the comparison is raised with its text
    reference = native_forward.build(native_forward.REFERENCE)
    mark = native_forward._MARK

    def child(code: str) -> None:
        monkeypatch.setattr(native_forward, "_CHILD", code)

    child(f"import sys; print({mark!r}, flush=True); sys.exit('it went wrong')")
    exited = r"^its self-check exited with status 1 in a child process: it went wrong$"
    with pytest.raises(native_forward.SelfCheckFault, match=exited):
        native_forward.compare_in_child(reference, reference)
    child("import time; time.sleep(30)")
    slow = r"^its self-check timed out after 0\.5 s in a child process$"
    with pytest.raises(native_forward.SelfCheckFault, match=slow):
        native_forward.compare_in_child(reference, reference, timeout=0.5)
    child("raise ImportError('no hvd_agents here')")
    with pytest.raises(RuntimeError, match="could not start .status 1: ImportError: no hvd_agents here"):
        native_forward.compare_in_child(reference, reference)
    child(f"print({mark + json.dumps({'error': 'ValueError: odd'})!r})")
    with pytest.raises(RuntimeError, match="the self-check's comparison raised ValueError: odd"):
        native_forward.compare_in_child(reference, reference)


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
    for path in [*PATHS, *TILE_BUILDS[-1:]]:  # and the amx path's emulation: prompt and draft passes on tiles
        runner = _on_path(model, weights, path)
        kv = runner.new_kv()
        whole = runner.forward(kv, ids[:280])  # a prompt longer than one native call
        draft = runner.forward(kv, ids[280:])  # a draft of 10 rows
        kv.rollback(280)
        tree = runner.forward(kv, ids[280:285], parents=[-1, 0, 0, 2])
        outputs[path] = (whole, draft, tree, kv.k[:, :, :285].clone())
    reference = outputs[native_forward.REFERENCE]
    for path, got in outputs.items():
        assert all(torch.equal(a, b) for a, b in zip(got, reference)), path


@pytest.mark.parametrize("path", TILE_BUILDS)
def test_a_forward_on_tiles_is_what_a_mutated_tile_pass_changes(path) -> None:
    # the tiles without the half-block split change a forward of 16 rows (its Q6_K and Q3_K matrices are q6k) and not
    # a decode step: the forwards above did run their many-row passes on tiles
    model = make_kquant_llama(VOCAB, seed=4)
    weights = kquant_weights(model, wide=False, seed=4)
    mutated = native_forward.build(path, ("-DHVD_MUTATE_AMX_K_SPLIT",))
    reference = _on_path(model, weights, native_forward.REFERENCE)
    changed = QuantRunner(NativeModel(model, weights, 512, path, module=mutated))
    ids = list(range(3, 19))
    assert torch.equal(reference.forward(reference.new_kv(), ids[:1]), changed.forward(changed.new_kv(), ids[:1]))
    assert not torch.equal(reference.forward(reference.new_kv(), ids), changed.forward(changed.new_kv(), ids))


@pytest.mark.skipif("avx512-vnni" not in PATHS or "amx" in PATHS, reason="for a CPU with AVX-512 VNNI and no AMX")
def test_the_real_amx_build_compiles_and_refuses_to_load_without_tiles() -> None:
    # the production amx build (the tile instructions themselves) compiles here, and says why it cannot run
    with pytest.raises(ImportError, match="the amx path cannot run on this machine: it has no AMX tiles"):
        native_forward.build("amx")


def test_a_forced_path_is_refused_with_its_cause(monkeypatch) -> None:
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.setenv(native_forward.ENV, "sse2")
    with pytest.raises(ValueError, match="HVD_AGENTS_CPU_ISA='sse2' is not a CPU path"):
        native_forward.available()
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.setenv(native_forward.ENV, "avx512-vnni")
    monkeypatch.setattr(native_forward, "cpu_paths", lambda: ["avx2"])
    with pytest.raises(ValueError, match="this CPU cannot run it"):
        native_forward.available()
    # amx where the CPU has no tiles, or the OS does not grant them: the reason the reference build reads
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.setenv(native_forward.ENV, "amx")
    monkeypatch.setattr(native_forward, "cpu_paths", lambda: ["avx2", "avx512-vnni"])
    monkeypatch.setattr(native_forward, "cpu_refusal", lambda path: "it has no AMX tiles (AMX-TILE and AMX-INT8)")
    with pytest.raises(ValueError, match=r"=amx: this CPU cannot run it \(it has no AMX tiles .*; it runs avx2"):
        native_forward.available()
    # the amx path's test build is never run for a model
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.setenv(native_forward.ENV, native_forward.EMULATED_AMX)
    with pytest.raises(ValueError, match="a test build"):
        native_forward.available()


def test_auto_prefers_amx_among_the_paths_that_pass_their_check(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))
    monkeypatch.delenv(native_forward.ENV, raising=False)
    monkeypatch.setattr(native_forward, "cpu_paths", lambda: list(native_forward.PATHS))
    monkeypatch.setattr(native_forward, "build", lambda path, extra=(): path)
    monkeypatch.setattr(native_forward, "path_key", lambda path, extra=(): f"key-{path}")
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.setattr(native_forward, "compare_in_child", lambda a, b: [])
    assert native_forward.available() and native_forward.path() == "amx"
    # amx failing its check (another cache: no verdicts): the next best path, and the reason logged
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path / "other"))
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.setattr(native_forward, "compare_in_child", lambda a, b: ["q4k 37x1280, 16 rows"] if b == "amx" else [])
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.cpu.native_forward"):
        assert native_forward.available() and native_forward.path() == "avx512-vnni"
    assert "amx not used: its results differ from avx2's (q4k 37x1280, 16 rows)" in caplog.text


def test_a_path_that_fails_its_self_check_is_not_used(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))  # a fresh machine: no recorded verdicts
    monkeypatch.setattr(native_forward, "_state", {})
    monkeypatch.delenv(native_forward.ENV, raising=False)
    monkeypatch.setattr(native_forward, "cpu_paths", lambda: ["avx2", "avx512-vnni"])
    monkeypatch.setattr(native_forward, "build", lambda path, extra=(): path)
    monkeypatch.setattr(native_forward, "compare_in_child", lambda a, b: ["q4_1 37x800, 16 rows"])
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.cpu.native_forward"):
        assert native_forward.available() and native_forward.path() == "avx2"
    assert "avx512-vnni not used: its results differ from avx2's (q4_1 37x800, 16 rows)" in caplog.text
    # the verdict is recorded beside the build: the next process does not compare again
    monkeypatch.setattr(native_forward, "compare_in_child", lambda a, b: pytest.fail("compared again"))
    assert native_forward.self_check("avx512-vnni").startswith("its results differ")
    monkeypatch.setenv(native_forward.ENV, "avx512-vnni")
    monkeypatch.setattr(native_forward, "_state", {})
    with pytest.raises(ValueError, match="failed its self-check"):
        native_forward.available()


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
    reference = results[native_forward.REFERENCE]
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
    assert real_engine.runner.native.path == native_forward.path()  # the engine's own path is untouched
