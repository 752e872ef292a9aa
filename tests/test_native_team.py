"""The native forward's own thread team (``runtime/cpu/native/team.h``).

It replaces OpenMP in the quantized forward, so its work-sharing and barriers carry the
forward's correctness: whatever the number of threads, whichever Python threads call at
once, and in a forked child, a forward's logits must be bitwise those of a lone call.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from tests.tiny import make_tiny_llama

pytestmark = pytest.mark.skipif(not native_forward.available(), reason="the native forward needs AVX2 and a compiler")

VOCAB = 97


@pytest.fixture(scope="module")
def runner() -> QuantRunner:
    model = make_tiny_llama(VOCAB, seed=3, dtype=torch.float32)
    return QuantRunner(NativeModel(model, quant_weights.from_model(model, "int4"), 512))


def _decode(runner: QuantRunner, seed: int, steps: int = 12) -> list[torch.Tensor]:
    """A prompt of 20 tokens, then ``steps`` forwards of 1 to 5 tokens: every forward's logits."""
    g = torch.Generator().manual_seed(seed)
    kv = runner.new_kv()
    out = [runner.forward(kv, torch.randint(0, VOCAB, (20,), generator=g).tolist())]
    for i in range(steps):
        out.append(runner.forward(kv, torch.randint(0, VOCAB, (1 + i % 5,), generator=g).tolist()))
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_logits_do_not_depend_on_the_number_of_threads(runner) -> None:
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 5, 2):  # the team is resized, grown and shrunk, between calls
            torch.set_num_threads(n)
            results.append(_decode(runner, seed=1))
    finally:
        torch.set_num_threads(before)
    assert all(_same(results[0], r) for r in results[1:])


def test_forwards_from_several_threads_at_once_equal_lone_ones(runner) -> None:
    expected = [_decode(runner, seed) for seed in range(4)]
    got: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        try:
            start.wait()
            got[seed] = _decode(runner, seed)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(_same(expected[seed], got[seed]) for seed in range(4))


def _child(runner: QuantRunner, expected: list[torch.Tensor], result) -> None:
    result.put(_same(expected, _decode(runner, seed=7)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork() on this platform")
def test_a_forked_child_runs_forwards_on_a_team_of_its_own(runner) -> None:
    expected = _decode(runner, seed=7)  # the parent's team has threads; the child has none of them
    assert _in_child("fork", _child, (runner, expected), "the forked child hung in its first forward") is True


def _in_child(method: str, target, args: tuple, hang: str) -> bool:
    """What ``target(*args, result)`` puts in its queue, run in a child started by ``method``; fails the test with
    ``hang`` when the child does not finish within two minutes."""
    ctx = multiprocessing.get_context(method)
    result = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, result))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail(hang)
    assert child.exitcode == 0
    return result.get(timeout=5)


def _alternate_team_sizes(result) -> None:
    """Regions of four threads (more than the cores of a small machine, so a worker is often descheduled), each
    followed by a region of the caller alone (a draft head's products on one thread between the target's forwards
    on the team)."""
    from hvd_agents.runtime.cpu import quant_linear

    native = native_forward.module()
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    matrix = quant_linear.quantized_matrix(weight)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    lone = native.linear(matrix, x, threads=1)
    for _ in range(3000):
        assert torch.equal(native.linear(matrix, x, threads=4), lone)
        native.linear(matrix, x, threads=1)
    result.put(True)


def test_regions_of_one_thread_between_the_teams_do_not_strand_a_worker() -> None:
    # a worker still spinning on a region's last barrier must not miss its flip when the caller then runs a region
    # alone: its barriers used to flip the team's sense too, and a worker that had not yet seen the first flip
    # then waited for the sense it had just been flipped away from, while the next region waited for that worker
    assert _in_child("spawn", _alternate_team_sizes, (), "a region of four threads after one of one hung") is True
