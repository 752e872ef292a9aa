"""The decode step's inputs in one Triton kernel, against PyTorch's operations, value for value.

On CUDA the static decoder builds a step's positions, KV write slots and attention inputs
(path attention's tables, or the dense mask) with :mod:`hvd_agents.runtime.static.input_kernel`,
checked against :func:`~hvd_agents.runtime.static.step_inputs.decode_inputs` at each shape before
its first use. The outputs are integers, so the comparison is exact (``torch.equal``): here under
Triton's interpreter where Triton is installed, over every row bucket, chains of 1 to ``R`` real
rows, random trees, parents that form no tree, and cached lengths around the tiles' and chunks'
boundaries and near capacity. The check itself must catch a value off by one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hvd_agents.runtime.static import StaticRunner
from hvd_agents.runtime.static.paths import PathInputs
from hvd_agents.runtime.static.step_inputs import (
    CheckedKernel,
    check_cases,
    decode_inputs,
    load_input_kernel,
    self_check,
)
from tests.tiny import make_tiny_llama

CPU = torch.device("cpu")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def _interpreted(script: str, timeout: int = 600) -> None:
    """Run ``script`` in a fresh interpreter under Triton's interpreter (chosen when a kernel module is imported)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=root)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]


def test_the_cpu_decoder_builds_its_inputs_with_pytorch() -> None:
    runner = StaticRunner(make_tiny_llama(64, seed=1, dtype=torch.float32))
    assert runner.decoder.build_inputs is decode_inputs


def test_no_kernel_off_cuda_or_when_switched_off(monkeypatch) -> None:
    assert load_input_kernel(CPU) is None
    for switch in ("HVD_AGENTS_STEP_INPUT_KERNEL", "HVD_AGENTS_FUSED_KERNELS"):
        with monkeypatch.context() as m:
            m.setenv(switch, "0")
            assert load_input_kernel(torch.device("cuda")) is None  # decided before any CUDA call


def test_the_cases_cover_chains_trees_padding_and_the_boundaries() -> None:
    cases = list(check_cases(33, capacity=8256))
    assert [c[3] for c in cases[:33]] == list(range(1, 34))  # chains of 1 to 33 real rows
    assert all(len(parents) == 32 for parents, *_ in cases)
    assert {past for _, past, _, _ in cases} >= {0, 63, 64, 65, 511, 512, 513, 8256 - 33}
    assert {length - past for _, past, length, _ in cases} >= {33}  # dense lengths exactly past + R too
    assert any(any(p >= i for i, p in enumerate(parents) if p >= 0) for parents, *_ in cases)  # no tree
    assert list(check_cases(1)) and all(c[0] == [] for c in check_cases(1))


def _mutated(change):
    """:func:`decode_inputs` with ``change(positions, write, attend, past, count)`` applied to its outputs."""
    def build(parents, past, length, count=None):
        positions, write, attend = decode_inputs(parents, past, length, count)
        positions, write = positions.clone(), write.clone()
        if isinstance(attend, PathInputs):
            attend = dataclasses.replace(attend, table=attend.table.clone(), depth=attend.depth.clone())
        else:
            attend = attend.clone()
        change(positions, write, attend, int(past), None if count is None else int(count))
        return positions, write, attend
    return build


def _table_at_the_chunk_edge(positions, write, attend, past, count) -> None:
    if past == 512 and count > 2:
        attend.table[count - 1, 1] += 1


def _mask_column_before_the_tile_edge(positions, write, attend, past, count) -> None:
    if past == 64:
        attend[-1, past - 1] = False


def _dense_length_exactly_past_plus_rows(positions, write, attend, past, count) -> None:
    if attend.shape[1] == past + attend.shape[0]:
        attend[0, -1] = True


MUTATIONS = {
    "write": (True, lambda positions, write, attend, past, count: write[-1:].add_(1)),
    "positions": (False, lambda positions, write, attend, past, count: positions[-1:].add_(1)),
    "depth": (True, lambda positions, write, attend, past, count: attend.depth[-1:].sub_(1)),
    "table": (True, _table_at_the_chunk_edge),
    "mask": (False, _mask_column_before_the_tile_edge),
    "mask at L": (False, _dense_length_exactly_past_plus_rows),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_check_catches_an_off_by_one(name) -> None:
    paths, change = MUTATIONS[name]
    assert self_check(decode_inputs, CPU, 9, paths) == 9 + 8 + 2  # PyTorch against itself
    with pytest.raises(AssertionError, match="differs from PyTorch"):
        self_check(_mutated(change), CPU, 9, paths)


def test_a_kernel_that_fails_its_check_is_replaced_by_pytorch(caplog) -> None:
    wrong = CheckedKernel(_mutated(MUTATIONS["write"][1]), CPU)
    parents, past, count = torch.tensor([-1, 0, -1, -1]), torch.tensor([70]), torch.tensor([2])
    got = wrong(parents, past, 256, count)
    assert wrong.verdicts == {(5, True): False} and "failed its check" in caplog.text
    assert torch.equal(got[1], decode_inputs(parents, past, 256, count)[1])
    calls = []

    def counted(*args):
        calls.append(args)
        return decode_inputs(*args)

    right = CheckedKernel(counted, CPU)
    right(parents, past, 256, None)
    checked = len(calls)
    right(parents, past, 256, None)
    assert right.verdicts == {(5, False): True} and len(calls) == checked + 1  # checked once, then used


@needs_triton
def test_the_kernel_gives_pytorchs_values_under_the_interpreter() -> None:
    _interpreted("""
        from tests.interpreter import patch_index; patch_index()
        import dataclasses, torch
        from hvd_agents.runtime.static import input_kernel
        from hvd_agents.runtime.static.step_inputs import self_check
        cpu = torch.device("cpu")
        # every row bucket (65 only in the per-bucket mode, dense); 2112: a 2048-token window's bitwise capacity
        for rows, trees, kinds in ((1, 2, (True, False)), (2, 4, (True, False)), (3, 8, (True, False)),
                                   (5, 16, (True, False)), (9, 16, (True, False)), (17, 24, (True, False)),
                                   (33, 48, (True, False)), (65, 4, (False,))):
            for paths in kinds:
                self_check(input_kernel.decode_inputs, cpu, rows, paths, capacity=2112, trees=trees)

        def off_by_one(parents, past, length, count=None):  # the kernel with one table entry wrong
            positions, write, paths = input_kernel.decode_inputs(parents, past, length, count)
            table = paths.table.clone()
            table[-1, 0] += 1
            return positions, write, dataclasses.replace(paths, table=table)
        try:
            self_check(off_by_one, cpu, 33, True)
        except AssertionError as exc:
            assert "table/mask differs" in str(exc)
        else:
            raise SystemExit("the check missed a wrong table entry")
        print("ok")
    """)


@needs_triton
def test_runners_with_the_kernel_give_pytorchs_logits_under_the_interpreter() -> None:
    # the kernel wired into bitwise and per-bucket runners, as on CUDA: chains, a tree, padding rows
    _interpreted("""
        from tests.interpreter import patch_index; patch_index()
        import torch
        from hvd_agents.runtime.static import Buckets, StaticRunner, input_kernel
        from tests.tiny import make_tiny_llama

        model = make_tiny_llama(64, seed=11, dtype=torch.float32)
        ids = torch.randint(0, 64, (100,), generator=torch.Generator().manual_seed(3)).tolist()
        for make in (lambda: StaticRunner(model, slots=1),
                     lambda: StaticRunner(model, slots=1, buckets=Buckets((1, 2, 5, 9), (64, 128, 256)))):
            plain, kernel = make(), make()
            kernel.decoder.build_inputs = input_kernel.decode_inputs
            outs = []
            for runner in (plain, kernel):
                kv = runner.new_kv()
                runner.forward(kv, ids[:62])
                got = [runner.forward(kv, [t]) for t in ids[62:67]]  # across the tile edge at 64
                got.append(runner.forward(kv, ids[67:71]))
                got.append(runner.forward(kv, [ids[71], 5, ids[72], 9, ids[73]], parents=[-1, -1, 1, 2]))
                kv.release()
                outs.append(got)
            assert all(torch.equal(a, b) for a, b in zip(*outs)), type(plain.buckets)
        print("ok")
    """)
