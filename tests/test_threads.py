"""Threads on the CPU hot path (``runtime/cpu/threads.py``).

A CPU engine step is a native forward on its own thread team, then torch's small ops on
the logits. Those ops must not start OpenMP regions (torch's, or MKL's vector math): the
pool's workers then spin on the cores the next forward's team needs. Inside a step the
calling thread's torch and MKL counts are 1 and the native team keeps the caller's count;
nothing else (other threads, the thread after the step, an HF runner's forward) changes.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import pytest
import torch

from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.cpu import native_forward, threads
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from tests.tiny import make_tiny_llama

needs_openmp = pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(),
                                  reason="torch without OpenMP has no pool to keep off the cores")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _mkl_threads() -> int:
    """MKL's thread count for the calling thread (its local setting, else its global one)."""
    get = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so*"))[0]).MKL_Get_Max_Threads
    get.restype = ctypes.c_int
    return get()


@needs_openmp
def test_inside_a_step_torch_runs_on_the_caller_alone_and_the_team_keeps_its_size(two_threads) -> None:
    assert threads.team_threads() == 2
    with threads.native_steps():
        assert torch.get_num_threads() == 1
        assert threads.team_threads() == 2
        with threads.native_steps():  # re-entrant: the inner block changes nothing
            assert torch.get_num_threads() == 1 and threads.team_threads() == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2 and threads.team_threads() == 2


@needs_openmp
@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")
def test_inside_a_step_mkl_vector_math_runs_on_one_thread(two_threads) -> None:
    outside = _mkl_threads()
    with threads.native_steps():
        assert _mkl_threads() == 1  # torch's exp() calls MKL's vector math, which starts its own regions
    assert _mkl_threads() == outside


@needs_openmp
def test_other_threads_keep_their_torch_threads_during_a_step(two_threads) -> None:
    seen = []
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        torch.get_num_threads()  # ATen's per-thread set-up, as any thread that ran torch has done
        inside.wait(10)
        seen.append(torch.get_num_threads())
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    with threads.native_steps():
        inside.set()
        done.wait(10)
    worker.join(10)
    assert seen == [2]


def test_the_step_scope_leaves_a_torch_runner_alone(two_threads) -> None:
    class TorchForward:  # a runner whose forward is torch's own (the HF runner's kind) needs torch's threads
        pass

    with threads.step_threads(TorchForward()):
        assert torch.get_num_threads() == 2


@pytest.mark.skipif(not native_forward.available(), reason="the native forward needs AVX2 and a compiler")
@needs_openmp
def test_engine_steps_run_the_native_team_full_and_torch_on_one_thread(two_threads, byte_tokenizer) -> None:
    model = make_tiny_llama(len(byte_tokenizer), seed=5, dtype=torch.float32)
    runner = QuantRunner(NativeModel(model, quant_weights.from_model(model, "int8"), 256),
                         cost_model=CostModel.linear(0.05))
    seen: list[tuple[int, int]] = []
    forward = runner.forward

    def spy(*args, **kwargs):
        seen.append((torch.get_num_threads(), threads.team_threads()))
        return forward(*args, **kwargs)

    runner.forward = spy
    engine = Engine(model, byte_tokenizer, eos_token_ids=(), runner=runner, draft_head=None)
    prompt = byte_tokenizer("abcabcabcabcabcabc")["input_ids"]
    plain = engine.generate(prompt, GenerationParams(max_new_tokens=12, method="ar")).token_ids
    assert seen and set(seen) == {(1, 2)}  # prefill and every step
    assert torch.get_num_threads() == 2  # the consumer's thread after the request
    # the numbers do not depend on it: the same tokens with the team at one thread
    torch.set_num_threads(1)
    assert engine.generate(prompt, GenerationParams(max_new_tokens=12, method="ar")).token_ids == plain
