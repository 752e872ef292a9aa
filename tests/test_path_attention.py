"""Path attention and the static runner's bitwise mode, on the CPU.

Path attention (:mod:`hvd_agents.runtime.static.paths`) must be attention (equal to a float64
masked reference to rounding), and a row's result must be bit for bit the same position's
when it is decoded alone, whatever else shares the forward: the other rows, the draft's
length, its tree. The bitwise runner then makes speculation equal plain decoding token for
token, trees included (float32 here, so no CPU's own bfloat16 products decide it; bfloat16 in
tests/test_gpu_runner.py). The Triton kernel is checked against the reference under
Triton's interpreter where Triton is installed; on CUDA it runs in tests/test_gpu_runner.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.runtime.static import Buckets, StaticRunner
from hvd_agents.runtime.static.paths import path_inputs, tiled_attention
from hvd_agents.runtime.tree_mask import ancestors, tree_visibility
from tests.drafters_for_tests import ScriptedDrafter, TreeDrafter
from tests.tiny import make_tiny_llama

VOCAB = 64
PARENTS = [-1, 0, 0, 2, -1, 4, 3, 6]  # a tree of 8 draft tokens: 9 rows


def _inputs(parents, past, count=None, device="cpu"):
    visible = tree_visibility(ancestors(torch.tensor(parents, dtype=torch.long, device=device)))
    rows = visible.shape[0]
    return path_inputs(visible, torch.tensor([past], device=device),
                       torch.tensor([rows if count is None else count], device=device))


def _dense_reference(q, keys, values, parents, past, scaling):
    """float64 masked attention over ``past`` cached positions and the forward's tree."""
    heads, rows, hd = q.shape
    group = heads // keys.shape[0]
    visible = tree_visibility(ancestors(torch.tensor(parents, dtype=torch.long)))
    mask = torch.ones(rows, past + rows, dtype=torch.bool)
    mask[:, past:] = visible
    k = keys[:, : past + rows].repeat_interleave(group, 0).double()
    v = values[:, : past + rows].repeat_interleave(group, 0).double()
    p = (q.double() @ k.transpose(1, 2) * scaling).masked_fill(~mask, float("-inf")).softmax(-1)
    return (p @ v).transpose(0, 1).reshape(rows, heads * hd)


def _random_attention(dtype, seed=0, heads=4, kv_heads=2, hd=16, capacity=256):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(kv_heads, capacity, hd, generator=gen).to(dtype)
    values = torch.randn(kv_heads, capacity, hd, generator=gen).to(dtype)
    q = torch.randn(heads, len(PARENTS) + 1, hd, generator=gen).to(dtype)
    return q, keys, values


def _alone(q, keys, values, paths, row, past):
    """Row ``row`` of a tree forward decoded alone: its path copied to consecutive slots, one real row."""
    path = paths.table[row, : int(paths.depth[row]) + 1].tolist()
    keys, values = keys.clone(), values.clone()
    for i, j in enumerate(path):
        keys[:, past + i], values[:, past + i] = keys[:, past + j], values[:, past + j]
    q1 = torch.zeros_like(q)
    q1[:, 0] = q[:, row]
    alone = _inputs([-1] * (q.shape[1] - 1), past + len(path) - 1, count=1, device=q.device)
    return q1, keys, values, alone


def test_path_inputs_list_each_rows_path_root_first() -> None:
    p = _inputs(PARENTS, 70)
    assert p.depth.tolist() == [0, 1, 2, 2, 3, 1, 2, 4, 5]
    assert p.table[7, :5].tolist() == [0, 1, 3, 4, 7]  # 7's parent is 3 (draft 6 -> row 7), 3's is 1, 1's the root
    assert p.table[8, :6].tolist() == [0, 1, 3, 4, 7, 8]


@pytest.mark.parametrize("past", [0, 37, 70, 150])
def test_tiled_path_attention_is_attention_along_each_rows_path(past) -> None:
    q, keys, values = _random_attention(torch.float32, seed=past)
    got = tiled_attention(q, keys, values, _inputs(PARENTS, past), 0.25)
    torch.testing.assert_close(got.double(), _dense_reference(q, keys, values, PARENTS, past, 0.25),
                               rtol=0, atol=2e-6)


def test_padding_rows_get_no_attention() -> None:
    q, keys, values = _random_attention(torch.float32)
    got = tiled_attention(q, keys, values, _inputs(PARENTS, 40, count=3), 0.25)
    assert not got[3:].any() and got[:3].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tree_row_is_bitwise_the_same_position_decoded_alone(dtype) -> None:
    past = 70  # the tree crosses the tile boundary at 64 for some rows and not for others
    q, keys, values = _random_attention(dtype, seed=5)
    paths = _inputs(PARENTS, past)
    together = tiled_attention(q, keys, values, paths, 0.25)
    for row in range(len(PARENTS) + 1):
        alone = tiled_attention(*_alone(q, keys, values, paths, row, past), 0.25)
        assert torch.equal(alone[0], together[row]), row


def test_the_runner_is_bitwise_by_default_and_rejects_several_row_buckets() -> None:
    model = make_tiny_llama(VOCAB, seed=1, dtype=torch.float32)
    runner = StaticRunner(model)
    assert runner.bitwise and runner.buckets.rows == (33,) and runner.buckets.kv[-1] % 64 == 0
    assert not StaticRunner(model, buckets=Buckets((1, 5), (64, 256))).bitwise
    with pytest.raises(ValueError, match="one row bucket"):
        StaticRunner(model, buckets=Buckets((1, 5), (64, 256)), bitwise=True)


def test_without_path_kernels_cuda_falls_back_to_the_per_bucket_mode_or_refuses_bitwise(monkeypatch, caplog) -> None:
    from hvd_agents.runtime.static import paths
    from hvd_agents.runtime.static.runner import bitwise_mode

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert bitwise_mode(None, None, cpu) and not bitwise_mode(None, Buckets((1, 5), (64, 256)), cpu)
    monkeypatch.setattr(paths, "_checked", lambda device: None)  # CUDA without Triton, or kernels that failed
    assert paths.kernels_available(cpu) and not paths.kernels_available(cuda)
    assert not bitwise_mode(None, None, cuda) and "per-bucket mode" in caplog.text
    with pytest.raises(ValueError, match="needs path attention's Triton kernels on CUDA"):
        bitwise_mode(True, None, cuda)


def test_the_path_kernels_self_check_refuses_kernels_that_disagree_with_pytorch() -> None:
    from types import SimpleNamespace

    from hvd_agents.runtime.static import paths

    def like_the_kernels(q, keys, values, past, count, table, depth, scaling, tile, chunk, length=None,
                         arrivals=None):
        return paths.tiled_attention(q, keys, values, paths.PathInputs(past, count, table, depth, length), scaling)

    cpu = torch.device("cpu")
    paths.self_check(SimpleNamespace(path_attention=like_the_kernels), cpu)  # PyTorch against itself
    def padding_row_not_zeroed(q, k, v, past, count, *rest):
        return like_the_kernels(q, k, v, past, count + 1, *rest)

    def second_chunk_dropped(q, k, v, past, count, table, depth, scaling, tile, chunk, length=None, arrivals=None):
        return like_the_kernels(q, k, v, past.clamp(max=chunk - 8), count, table, depth, scaling, tile, chunk)

    def wrong_only_when_folded(q, k, v, past, count, table, depth, scaling, tile, chunk, length=None, arrivals=None):
        out = like_the_kernels(q, k, v, past, count, table, depth, scaling, tile, chunk, length)
        return out if arrivals is None else out * 1.01

    def counts_left_behind(*args):
        out = like_the_kernels(*args)
        if args[-1] is not None:
            args[-1][0] += 1  # a count never reset: the next forward's last chunk would never combine
        return out

    paths.self_check(SimpleNamespace(path_attention=like_the_kernels), cpu, folded=True)
    for kernel in (padding_row_not_zeroed, second_chunk_dropped):
        for folded in (False, True):
            with pytest.raises(AssertionError, match="differ from PyTorch"):
                paths.self_check(SimpleNamespace(path_attention=kernel), cpu, folded=folded)
    paths.self_check(SimpleNamespace(path_attention=wrong_only_when_folded), cpu)  # the rest stays usable
    with pytest.raises(AssertionError, match="differ from PyTorch.*merged by the last"):
        paths.self_check(SimpleNamespace(path_attention=wrong_only_when_folded), cpu, folded=True)
    with pytest.raises(AssertionError, match="arrival counts non-zero"):
        paths.self_check(SimpleNamespace(path_attention=counts_left_behind), cpu, folded=True)


def test_a_failed_merge_check_keeps_path_attentions_second_kernel(monkeypatch, caplog) -> None:
    # the fold's own check failing (a compiler without the atomics, a wrong merge) costs a launch, not the bitwise mode
    from types import SimpleNamespace

    from hvd_agents.runtime.static import paths

    calls = []

    def kernel(q, keys, values, past, count, table, depth, scaling, tile, chunk, length=None, arrivals=None):
        calls.append(arrivals)
        out = paths.tiled_attention(q, keys, values, paths.PathInputs(past, count, table, depth, length), scaling)
        return out if arrivals is None else out + 1

    device = torch.device("cpu")
    monkeypatch.setattr(paths, "_checked", lambda _: SimpleNamespace(path_attention=kernel))
    monkeypatch.setattr(paths, "_fold_checked", paths._fold_checked.__wrapped__)
    monkeypatch.setattr(torch.cuda, "device", lambda _: contextlib.nullcontext())
    with caplog.at_level("WARNING"):
        assert paths._fold_checked(device) is False
    assert "merges its chunks with a second kernel" in caplog.text and any(a is not None for a in calls)


def _teacher_forced(runner, ids, prefill, parents=None):
    """Logits of ``ids[prefill:]`` as one-row steps, as one forward, and (with ``parents``) inside a tree."""
    kv = runner.new_kv()
    runner.forward(kv, ids[:prefill])
    steps = torch.cat([runner.forward(kv, [t]) for t in ids[prefill:]])
    kv.rollback(prefill)
    together = runner.forward(kv, ids[prefill:])
    kv.release()
    return steps, together


@pytest.mark.parametrize("stacked", [False, True])
def test_bitwise_runner_rows_equal_one_row_steps_bit_for_bit(stacked) -> None:
    # float32: the CPU's bfloat16 matrix products differ between machines (AMX or not); the GPU tests run bfloat16
    model = make_tiny_llama(VOCAB, seed=11, dtype=torch.float32)
    ids = torch.randint(0, VOCAB, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    runner = StaticRunner(model, stack_projections=stacked)  # stacked: q/k/v and gate/up as one product each
    steps, together = _teacher_forced(runner, ids, 60)  # 30 rows that cross the tile boundary at 64
    assert all(torch.equal(steps[i], together[i]) for i in range(30))
    # a tree after ids[59] (its root): the path ids[60], ids[61], ids[62] at rows 2, 4, 5, branches beside it
    steps, _ = _teacher_forced(runner, ids[:63], 59)  # the same prefill as the tree's
    kv = runner.new_kv()
    runner.forward(kv, ids[:59])
    tree = runner.forward(kv, [ids[59], 5, ids[60], 9, ids[61], ids[62]], parents=[-1, -1, 1, 1, 3])
    kv.release()
    assert all(torch.equal(tree[row], steps[i]) for row, i in ((0, 0), (2, 1), (4, 2), (5, 3)))


def test_bitwise_runner_speculation_equals_plain_decoding() -> None:
    model = make_tiny_llama(VOCAB, seed=11, dtype=torch.float32)
    engine = Engine(model, eos_token_ids=(), draft_head=None, runner=StaticRunner(model))
    prompt = torch.randint(0, VOCAB, (70,), generator=torch.Generator().manual_seed(4)).tolist()
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=60, method="ar")).token_ids
    for seed in range(3):
        for drafter in (ScriptedDrafter(reference, VOCAB, seed), TreeDrafter(reference, VOCAB, seed)):
            engine.add_drafter("adversarial", drafter)
            got = engine.generate(prompt, GenerationParams(max_new_tokens=60, method="adversarial"))
            assert got.token_ids == reference, (seed, type(drafter).__name__)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_triton_kernel_matches_the_reference_under_the_interpreter() -> None:
    # the interpreter runs the kernel with NumPy; it is chosen when the kernel module is first imported
    script = textwrap.dedent("""
        from tests.interpreter import patch_index; patch_index()
        import torch
        from tests.test_path_attention import _alone, _inputs, _random_attention, PARENTS
        from hvd_agents.runtime.static import path_kernels
        from hvd_agents.runtime.static.paths import self_check, tiled_attention
        self_check(path_kernels, torch.device("cpu"))  # what CUDA checks before the kernels' first use
        self_check(path_kernels, torch.device("cpu"), folded=True)
        for past, hd in ((0, 16), (70, 16), (150, 16), (70, 8), (150, 24)):  # head_dim padded to a power of two
            q, keys, values = _random_attention(torch.float32, seed=past, hd=hd)
            paths = _inputs(PARENTS, past, count=7)
            got = path_kernels.path_attention(q, keys, values, *paths.tensors(), 0.25, 64, 128)
            want = tiled_attention(q, keys, values, paths, 0.25)
            torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
            assert not got[7:].any()
            for row in range(7):
                q1, k1, v1, p1 = _alone(q, keys, values, paths, row, past)
                alone = path_kernels.path_attention(q1, k1, v1, *p1.tensors(), 0.25, 64, 128)
                assert torch.equal(alone[0], got[row]), (past, row)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_one_chunk_kernel_is_the_two_kernels_bit_for_bit_under_the_interpreter() -> None:
    # a forward whose rows all fit in one chunk runs _partial alone, finishing each row as _combine would: the same
    # bits (float32 and bfloat16, padding rows included); a runner's short KV bucket (one chunk) gives the logits
    # of the same steps run through two kernels; and the comparison catches a finish that is not _combine's
    script = textwrap.dedent("""
        from tests.interpreter import patch_index; patch_index()
        import importlib.util, inspect, sys, tempfile, torch
        import hvd_agents.runtime.static.decoder as decoder
        from tests.test_path_attention import _inputs, _random_attention, PARENTS
        from tests.tiny import make_tiny_llama
        from hvd_agents.runtime.static import Buckets, StaticRunner, path_kernels, paths

        def same_bits(a, b):
            bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
            return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))

        def one_and_two(kernels, dtype, past, hd, count, chunk):
            q, keys, values = _random_attention(dtype, seed=past, hd=hd, capacity=4 * chunk)
            p = _inputs(PARENTS, past, count=count)
            two = kernels.path_attention(q, keys, values, *p.tensors(), 0.25, 64, chunk)  # chunks: the capacity's
            one = kernels.path_attention(q, keys, values, *p.tensors(), 0.25, 64, chunk, past + len(PARENTS) + 1)
            return one, two

        def folded(kernels, dtype, past, hd, count, chunk):  # the row's last chunk combines: one kernel
            q, keys, values = _random_attention(dtype, seed=past, hd=hd, capacity=4 * chunk)
            p = _inputs(PARENTS, past, count=count)
            counts = torch.zeros(keys.shape[0] * (len(PARENTS) + 1), dtype=torch.int32)  # 9 rows
            got = kernels.path_attention(q, keys, values, *p.tensors(), 0.25, 64, chunk, None, counts)
            assert not counts.any(), counts  # left at zero for the next forward
            return got

        dtypes = (torch.float32, torch.bfloat16)
        cases = [(128, dtype, 16, 9, past) for dtype in dtypes for past in (0, 37, 63, 64, 65, 119)]
        cases += [(128, dtype, 24, 7, past) for dtype in dtypes for past in (1, 100)]
        cases += [(512, torch.float32, 16, 9, 503)]  # the runner's chunk, its last one-chunk length
        for chunk, dtype, hd, count, past in cases:
            one, two = one_and_two(path_kernels, dtype, past, hd, count, chunk)
            assert same_bits(one, two), (chunk, dtype, hd, past)
            assert not one[count:].any() and one[:count].abs().sum() > 0
            assert same_bits(folded(path_kernels, dtype, past, hd, count, chunk), two), (chunk, dtype, hd, past)
        for past in (130, 250, 300):  # rows across two and three chunks, combined in one kernel
            _, two = one_and_two(path_kernels, torch.float32, past, 16, 9, 128)
            assert same_bits(folded(path_kernels, torch.float32, past, 16, 9, 128), two), past
        q, keys, values = _random_attention(torch.float32, seed=1, hd=16, capacity=512)
        p = _inputs(PARENTS, 300, count=9)
        for counts in (torch.zeros(2 * 8, dtype=torch.int32), torch.zeros(2 * 9, dtype=torch.int64)):
            try:  # too few counts, or not int32: refused, never a silent second kernel
                path_kernels.path_attention(q, keys, values, *p.tensors(), 0.25, 64, 128, None, counts)
                raise SystemExit("arrival counts accepted")
            except ValueError as exc:
                assert "arrival counts must be int32" in str(exc)

        # the check has teeth: a finish that multiplies by the reciprocal instead of dividing differs somewhere
        source = inspect.getsource(path_kernels)
        finish = "out = acc / tl.where(keep, total, 1.0)[:, None]"
        assert finish in source
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
            fh.write(source.replace(finish, "out = acc * (1.0 / tl.where(keep, total, 1.0))[:, None]"))
        spec = importlib.util.spec_from_file_location("mutated_path_kernels", fh.name)
        mutated = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mutated
        spec.loader.exec_module(mutated)
        assert not all(same_bits(*one_and_two(mutated, torch.float32, past, 16, 9, 128)) for past in (0, 37, 100))

        # the runner: a short KV bucket of one chunk against one KV length (two kernels everywhere)
        counts = torch.zeros(2 * 33, dtype=torch.int32)  # the tiny model's 2 KV heads, 33 rows
        decoder.path_attention = lambda q, k, v, p, s, arrivals: path_kernels.path_attention(
            q, k, v, *p.tensors(), s, paths.TILE, 128, p.bound, counts)
        model = make_tiny_llama(64, seed=11, dtype=torch.float32)
        ids = torch.randint(0, 64, (120,), generator=torch.Generator().manual_seed(5)).tolist()
        runs = []
        for buckets in (Buckets((33,), (128, 256)), Buckets.single(33, 256)):
            runner = StaticRunner(model, slots=1, buckets=buckets, bitwise=True)
            kv = runner.new_kv()
            runner.forward(kv, ids[:88])
            got = [runner.forward(kv, [t]) for t in ids[88:100]]  # from one chunk (past + 33 <= 128) to two
            kv.rollback(88)
            got.append(runner.forward(kv, ids[88:98]))
            kv.rollback(88)
            got.append(runner.forward(kv, [ids[88], 3, ids[89], 7, ids[90]], parents=[-1, -1, 1, 2]))
            kv.release()
            runs.append(got)
        assert all(torch.equal(a, b) for a, b in zip(*runs))
        assert all(torch.equal(runs[0][i][0], runs[0][12][i]) for i in range(10))  # rows: one-row steps
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          check=False, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
