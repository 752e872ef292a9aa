"""The static runner on a GPU: captured steps, one synchronisation per step, bitwise single-bucket mode.

Marked ``gpu``; skipped where CUDA is absent (CI, the CPU machines). The models are random-weight,
built on the device (the embedded GGUF does not travel): a tiny float32 Llama for equality with the
model's own forward, and SmolLM2-135M's configuration in bfloat16 for the captured decode step.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.bench.gpu import (
    random_model,
    run_gpu_benchmark,
    teacher_forced_rows_equal,
    teacher_forced_tree_equal,
    warm_steady_state,
)
from hvd_agents.runtime.runner_choice import runner_for
from hvd_agents.runtime.static import Buckets, StaticRunner
from tests.drafters_for_tests import OracleDrafter, ScriptedDrafter, TreeDrafter
from tests.tiny import make_tiny_llama

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

@pytest.fixture(scope="module")
def smollm2():
    return random_model("smollm2-135m", torch.device("cuda"), torch.bfloat16)


def test_cuda_picks_the_static_runner_and_its_greedy_output_is_the_models(monkeypatch) -> None:
    model = make_tiny_llama(64, seed=3, dtype=torch.float32).cuda()
    assert isinstance(runner_for(model), StaticRunner)
    monkeypatch.setenv("HVD_AGENTS_RUNNER", "hf")
    hf_engine = Engine(model, eos_token_ids=(), draft_head=None)
    monkeypatch.delenv("HVD_AGENTS_RUNNER")
    engine = Engine(model, eos_token_ids=(), draft_head=None)
    assert isinstance(engine.runner, StaticRunner) and engine.runner.graphs.enabled
    prompt = [3, 17, 42, 5, 9, 3, 17]
    reference = hf_engine.generate(prompt, GenerationParams(max_new_tokens=48, method="ar")).token_ids
    assert engine.generate(prompt, GenerationParams(max_new_tokens=48, method="ar")).token_ids == reference
    for seed in range(3):
        for drafter in (ScriptedDrafter(reference, 64, seed), TreeDrafter(reference, 64, seed)):
            engine.add_drafter("adversarial", drafter)
            got = engine.generate(prompt, GenerationParams(max_new_tokens=48, method="adversarial"))
            assert got.token_ids == reference
    assert engine.runner.graphs.captured > 0


@pytest.mark.parametrize("bitwise", [True, False])
def test_graph_replay_equals_the_eager_forward(smollm2, bitwise) -> None:
    # each shape is replayed at later positions on other tokens, so a graph that baked in its capture-time
    # inputs (the cached length, the tokens, the parents) differs from the eager forward
    captured = StaticRunner(smollm2, warm_up=False, bitwise=bitwise)
    eager = StaticRunner(smollm2, graphs=False, bitwise=bitwise)
    ids = torch.randint(0, 49152, (600,), generator=torch.Generator().manual_seed(0)).tolist()
    a, b = captured.new_kv(), eager.new_kv()
    for runner, kv in ((captured, a), (eager, b)):
        runner.forward(kv, ids[:300], logits_to_keep=1)
    tree, other_tree = [-1, 0, 0, 1, 1, 2, 2, -1], [-1, -1, 0, 1, 2, 3, 4, 5]
    calls = [(1, None), (4, None), (9, tree), (9, None)] * 3 + [(9, other_tree), (1, None), (4, None)]
    shapes = set()
    for i, (n, parents) in enumerate(calls):
        tokens, hidden = ids[310 + 17 * i : 310 + 17 * i + n], ([], [])
        rows = captured.buckets.rows_for(n)
        shapes.add((rows, captured.buckets.kv_for(a.length + rows)))
        x = captured.forward(a, tokens, parents=parents, hidden=hidden[0])
        y = eager.forward(b, tokens, parents=parents, hidden=hidden[1])
        assert torch.equal(x, y), (i, n, parents)
        assert torch.equal(hidden[0][0], hidden[1][0]), (i, n, parents)
        for kv in (a, b):  # keep the first row: the next call runs one position later
            kv.rollback(kv.length - n + 1)
    # every later call replayed a graph captured before: one shape in the bitwise mode, three buckets otherwise
    assert captured.graphs.captured == len(shapes) == (1 if bitwise else 3)


def _syncs_of(fn) -> int:
    """Synchronising CUDA calls made by ``fn()`` (PyTorch's sync debug mode, warning level)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


@pytest.mark.parametrize("method", ["ar", "pld", "hvd"])
def test_a_steady_state_step_synchronises_once(smollm2, method) -> None:
    engine = Engine(smollm2, eos_token_ids=(), draft_head=None, cost_model=None)
    engine.cost_model()  # measured (or read) before counting
    prompt = torch.randint(0, 49152, (300,), generator=torch.Generator().manual_seed(1)).tolist() * 2
    graphs = engine.runner.graphs
    # a capture synchronises: every shape the counted runs reach is captured first, in whichever slot they get
    warm_steady_state(engine.runner, len(prompt), 64)

    def run(n: int):
        params = GenerationParams(max_new_tokens=n, method=method, reuse_prefix=False)
        engine.generate(prompt, params)
        captured, out = graphs.captured, {}
        out["syncs"] = _syncs_of(lambda: out.setdefault("r", engine.generate(prompt, params)))
        assert graphs.captured == captured  # the count holds replays only
        return out["syncs"], out["r"].stats.steps

    short_syncs, short_steps = run(16)
    long_syncs, long_steps = run(64)
    assert long_steps > short_steps
    print(f"{method}: {short_syncs} syncs in {short_steps} steps, {long_syncs} in {long_steps}")
    # never more than one per step (and one per request), and the step's one read is seen on most steps
    assert short_syncs <= short_steps + 1 and long_syncs <= long_steps + 1
    assert long_syncs - short_syncs >= 0.9 * (long_steps - short_steps)


def test_single_bucket_mode_gives_every_row_the_logits_of_a_one_row_step_in_bfloat16(smollm2) -> None:
    # teacher-forced: 16 one-row steps vs one 16-row forward over the same random tokens, every row compared
    ids = torch.randint(0, 49152, (616,), generator=torch.Generator().manual_seed(3)).tolist()
    prompt, tokens = ids[:600], ids[600:]
    single = StaticRunner(smollm2, buckets=Buckets.single(17, 1024), warm_up=False, slots=1)
    assert teacher_forced_rows_equal(single, prompt, tokens) == len(tokens)
    # the control: the per-bucket mode runs one-row steps and the 16-row forward in other shapes and kernels
    buckets = teacher_forced_rows_equal(StaticRunner(smollm2, bitwise=False, warm_up=False, slots=1), prompt, tokens)
    print(f"per-bucket mode: {buckets}/{len(tokens)} rows bitwise equal to one-row steps")


@pytest.mark.parametrize("past", [200, 600, 2000])  # 200: the one-chunk KV bucket, path attention as one kernel
def test_the_bitwise_runner_gives_every_row_the_logits_of_a_one_row_step_chains_and_trees(smollm2, past) -> None:
    ids = torch.randint(0, 49152, (past + 16,), generator=torch.Generator().manual_seed(past)).tolist()
    prompt, tokens = ids[:past], ids[past:]
    runner = StaticRunner(smollm2, slots=1)  # the default: bitwise, graphs captured
    assert runner.bitwise and runner.graphs.enabled
    assert teacher_forced_rows_equal(runner, prompt, tokens) == len(tokens)
    assert teacher_forced_tree_equal(runner, prompt, tokens) == len(tokens)
    assert runner.graphs.captured >= 1


def test_the_path_kernel_is_attention_and_a_tree_row_is_its_position_alone_on_cuda() -> None:
    from hvd_agents.runtime.static import path_kernels
    from hvd_agents.runtime.static.paths import kernels_available, self_check, tiled_attention

    self_check(path_kernels, torch.device("cuda"))  # what the runner checks before choosing the bitwise mode
    self_check(path_kernels, torch.device("cuda"), folded=True)  # and before merging chunks in one kernel
    assert kernels_available(torch.device("cuda"))
    from tests.test_path_attention import PARENTS, _alone, _dense_reference, _inputs, _random_attention

    for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
        for past in (0, 70, 700, 3000):
            q, keys, values = (t.cuda() for t in _random_attention(dtype, seed=past, heads=9, kv_heads=3, hd=64,
                                                                    capacity=4096))
            paths = _inputs(PARENTS, past, device="cuda")
            got = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 512)
            want = _dense_reference(q.cpu(), keys.cpu(), values.cpu(), PARENTS, past, 0.125)
            assert (got.double().cpu() - want).norm() / want.norm() < tol, (dtype, past)
            if dtype == torch.float32:
                cpu = tiled_attention(q.cpu(), keys.cpu(), values.cpu(), _inputs(PARENTS, past), 0.125)
                torch.testing.assert_close(got.cpu(), cpu, rtol=0, atol=1e-5)
            for row in range(len(PARENTS) + 1):
                q1, k1, v1, alone = _alone(q, keys, values, paths, row, past)
                single = path_kernels.path_attention(q1, k1, v1, *alone.tensors(), 0.125, 64, 512)
                assert torch.equal(single[0], got[row]), (dtype, past, row)


def test_the_folded_path_kernel_is_the_two_kernels_bit_for_bit_on_cuda_replay_after_replay() -> None:
    # the row's last chunk to finish combines the chunks (arrival counts, one kernel): the two kernels' bits, the
    # counts back at zero after each call, and the same bits in a captured graph replayed many times (a program
    # that combined before another's chunk was visible would differ now and then)
    from hvd_agents.runtime.static import path_kernels
    from tests.test_path_attention import PARENTS, _inputs, _random_attention

    counts = torch.zeros(3 * (len(PARENTS) + 1), dtype=torch.int32, device="cuda")  # 3 KV heads, 9 rows
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        for past in (503, 600, 1030, 3000):
            q, keys, values = (t.cuda() for t in _random_attention(dtype, seed=past, heads=9, kv_heads=3, hd=64,
                                                                    capacity=4096))
            for count in (9, 5):
                paths = _inputs(PARENTS, past, count=count, device="cuda")
                two = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 512)
                one = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 512, None, counts)
                assert torch.equal(one.view(bits), two.view(bits)), (dtype, past, count)
                assert not counts.any(), (dtype, past, count)
    paths = _inputs(PARENTS, 3000, count=9, device="cuda")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 128, None, counts)  # compiled
        with torch.cuda.graph(graph, stream=stream):
            out = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 128, None, counts)
    torch.cuda.current_stream().wait_stream(stream)
    want = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 128)  # 24 chunks, two kernels
    for _ in range(200):
        graph.replay()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert not counts.any()


def test_the_one_chunk_path_kernel_is_the_two_kernels_bit_for_bit_on_cuda(smollm2) -> None:
    from hvd_agents.runtime.static import path_kernels
    from tests.test_path_attention import PARENTS, _inputs, _random_attention

    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        for past in (0, 63, 64, 65, 300, 503):  # 503 + 9 rows: the last one-chunk length
            q, keys, values = (t.cuda() for t in _random_attention(dtype, seed=past, heads=9, kv_heads=3, hd=64,
                                                                    capacity=4096))
            for count in (9, 5):
                paths = _inputs(PARENTS, past, count=count, device="cuda")
                two = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 512)
                one = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.125, 64, 512, past + 9)
                assert torch.equal(one.view(bits), two.view(bits)), (dtype, past, count)
    # the default runner's one-chunk KV bucket against one KV length (two kernels at every context)
    ids = torch.randint(0, 49152, (216,), generator=torch.Generator().manual_seed(7)).tolist()
    short = StaticRunner(smollm2, slots=1)
    assert short.buckets.kv[0] == 512 and short.buckets.kv_for(200 + 33) == 512
    long = StaticRunner(smollm2, slots=1, buckets=Buckets.single(33, short.buckets.kv[-1]), bitwise=True)
    outs = []
    for runner in (short, long):
        kv = runner.new_kv()
        runner.forward(kv, ids[:200], logits_to_keep=1)
        outs.append(torch.cat([runner.forward(kv, [t]) for t in ids[200:]]))
        kv.release()
    assert torch.equal(outs[0], outs[1])


def test_the_step_input_kernel_gives_pytorchs_values_on_cuda_and_the_runners_use_it(smollm2) -> None:
    from hvd_agents.runtime.static import input_kernel
    from hvd_agents.runtime.static.step_inputs import CheckedKernel, self_check

    cuda = torch.device("cuda")
    for rows in (1, 2, 3, 5, 9, 17, 33, 65):  # every row bucket; near a 16K window's capacity too
        for paths in (True, False):
            self_check(input_kernel.decode_inputs, cuda, rows, paths, capacity=16448, trees=64, seed=1)
    for bitwise in (True, False):
        runner = StaticRunner(smollm2, bitwise=bitwise, slots=1)  # warm-up checks each shape before capturing it
        build = runner.decoder.build_inputs
        assert isinstance(build, CheckedKernel) and build.verdicts and all(build.verdicts.values()), build.verdicts


def test_the_bitwise_runner_speculation_is_plain_decoding_in_bfloat16(smollm2) -> None:
    engine = Engine(smollm2, eos_token_ids=(), draft_head=None)
    assert engine.runner.bitwise
    prompt = torch.randint(0, 49152, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=96, method="ar")).token_ids
    for seed in range(2):
        for drafter in (ScriptedDrafter(reference, 49152, seed), TreeDrafter(reference, 49152, seed)):
            engine.add_drafter("adversarial", drafter)
            got = engine.generate(prompt, GenerationParams(max_new_tokens=96, method="adversarial"))
            assert got.token_ids == reference, (seed, type(drafter).__name__)


def test_single_bucket_mode_is_bitwise_plain_decoding_in_bfloat16(smollm2) -> None:
    # greedy streams of random weights repeat a token or two (the teacher-forced test above compares every row);
    # this one checks the engine's speculation path end to end
    engine = Engine(smollm2, eos_token_ids=(), draft_head=None,
                    runner=StaticRunner(smollm2, buckets=Buckets.single(17, 2048)))
    prompt = torch.randint(0, 49152, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=128, method="ar")).token_ids
    engine.add_drafter("oracle", OracleDrafter(reference))
    planted = engine.generate(prompt, GenerationParams(max_new_tokens=128, method="oracle", num_draft_tokens=16))
    assert planted.token_ids == reference and planted.stats.steps < 128 // 4
    for seed in range(3):
        engine.add_drafter("scripted", ScriptedDrafter(reference, 49152, seed))
        got = engine.generate(prompt, GenerationParams(max_new_tokens=128, method="scripted", num_draft_tokens=16))
        assert got.token_ids == reference


def test_cost_profile_is_timed_with_cuda_events(smollm2) -> None:
    runner = StaticRunner(smollm2, warm_up=False)
    cost = runner.profile()
    assert "cuda" in cost.source and cost.verify(0) == 1.0
    assert cost.verify(3) == cost.verify(4)  # one bucket: a step function


def test_the_gpu_benchmark_reports_one_sync_per_step_and_bitwise_single_bucket_mode(tmp_path) -> None:
    report = run_gpu_benchmark("random:smollm2-135m", device="cuda", max_new_tokens=32, synthetic_prompts=2,
                               json_path=str(tmp_path / "gpu.json"))
    assert set(report.syncs_per_step) == {"ar", "hvd"}
    assert all(0.9 <= v <= 1.0 for v in report.syncs_per_step.values()), report.syncs_per_step
    assert report.single_bucket_bitwise and report.graphs_captured > 0
    assert report.teacher_forced_bitwise["single"] == "16/16"
    assert report.teacher_forced_bitwise["bitwise"] == report.teacher_forced_bitwise["bitwise tree"] == "16/16"
    assert report.bitwise_mode_bitwise
    assert (tmp_path / "gpu.json").is_file()
