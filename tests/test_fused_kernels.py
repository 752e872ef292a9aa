"""The static decoder's fused Triton kernels, checked on the CPU under Triton's interpreter.

On CUDA the decoder compiles :mod:`hvd_agents.runtime.static.fused_kernels` and checks them
against PyTorch once (:func:`~hvd_agents.runtime.static.fused.load_fused_kernels`). Here the same
kernels run under the interpreter (where Triton is installed), wired into a bitwise runner as
on CUDA, path attention's kernel included: the forward must equal PyTorch's to rounding, and a
row's logits must still be bitwise those of the same position decoded alone.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hvd_agents.runtime.static.fused import load_fused_kernels


def test_no_fused_kernels_off_cuda_or_when_switched_off(monkeypatch) -> None:
    assert load_fused_kernels(torch.device("cpu")) is None
    monkeypatch.setenv("HVD_AGENTS_FUSED_KERNELS", "0")
    assert load_fused_kernels(torch.device("cuda")) is None  # decided before any CUDA call


def test_the_self_check_refuses_kernels_that_disagree_with_pytorch() -> None:
    from types import SimpleNamespace

    from hvd_agents.runtime.static import step_ops
    from hvd_agents.runtime.static.fused import self_check

    cpu = torch.device("cpu")
    self_check(step_ops, cpu)  # PyTorch against itself

    def off_by_one_slot(q, k, v, cos, sin, positions, write, keys, values, heads, kv_heads):
        return step_ops.rope_store(q, k, v, cos, sin, positions, write + 1, keys, values, heads, kv_heads)

    wrong = {"add_rms": lambda x, d, w, eps: step_ops.add_rms(x, d, w * 1.01, eps),
             "rope_store": off_by_one_slot,
             "silu_mul": lambda g, u: step_ops.silu_mul(g, u) + 1e-3}
    for name, kernel in wrong.items():
        kernels = SimpleNamespace(**{**{n: getattr(step_ops, n) for n in wrong}, name: kernel})
        with pytest.raises(AssertionError, match=name):
            self_check(kernels, cpu)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_fused_kernels_in_a_bitwise_runner_under_the_interpreter() -> None:
    script = textwrap.dedent("""
        from tests.interpreter import patch_index; patch_index()
        import torch
        import hvd_agents.runtime.static.decoder as decoder
        from hvd_agents.runtime.static import StaticRunner, fused_kernels, path_kernels, paths
        from hvd_agents.runtime.static.fused import self_check
        from tests.tiny import make_tiny_llama

        self_check(fused_kernels, torch.device("cpu"))
        decoder.path_attention = lambda q, k, v, p, s, arrivals: path_kernels.path_attention(
            q, k, v, *p.tensors(), s, paths.TILE, 128)
        model = make_tiny_llama(64, seed=11, dtype=torch.float32)
        ids = torch.randint(0, 64, (80,), generator=torch.Generator().manual_seed(2)).tolist()
        plain, fused = StaticRunner(model, slots=1), StaticRunner(model, slots=1, stack_projections=True)
        fused.decoder.ops = fused_kernels
        outs = {}
        for name, runner in (("plain", plain), ("fused", fused)):
            kv = runner.new_kv()
            runner.forward(kv, ids[:60])  # a prefill through the same kernels
            steps = torch.cat([runner.forward(kv, [t]) for t in ids[60:70]])
            kv.rollback(60)
            together = runner.forward(kv, ids[60:70])
            kv.rollback(60)
            tree = runner.forward(kv, [ids[60], 3, ids[61], 7, ids[62]], parents=[-1, -1, 1, 2])
            kv.release()
            assert all(torch.equal(steps[i], together[i]) for i in range(10)), name
            assert torch.equal(tree[0], steps[0]) and torch.equal(tree[2], steps[1]), name
            outs[name] = steps
        torch.testing.assert_close(outs["fused"], outs["plain"], rtol=0, atol=1e-4)
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          check=False, cwd=root)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]

