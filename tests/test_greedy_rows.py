"""A greedy step's reads of its logits: each row's argmax and the target's signal at one row.

The native CPU runner reads them on its own kernels (``native/logit_rows.h``); its choices must be
``torch.argmax``'s exactly (the first of tied maxima; a row with a NaN picks it), since they are the tokens greedy
decoding emits, on every path this CPU runs and the same bits on each. The signal (log-probability, entropy) is a
policy feature: PyTorch's to float rounding, and finite where a grammar masked tokens to -inf.
"""

from __future__ import annotations

import math

import pytest
import torch

from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.greedy_rows import NativeGreedyRows
from hvd_agents.runtime.greedy_rows import TORCH_GREEDY_ROWS, log_probs_and_entropy

PATHS = native_forward.cpu_paths() if native_forward.available() else []
native = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")


def awkward_rows(vocab: int, seed: int) -> torch.Tensor:
    """Rows whose argmax is easy to get wrong: ties (first, last, across 8-lane words), a max in the tail,
    -inf runs, signed zeros, every value equal."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, vocab, generator=g)
    big = float(x.max()) + 1.0
    x[0, [vocab - 1, vocab // 2]] = big  # tie: the first index wins
    x[1, vocab - 1] = big  # the max in the last (tail) element
    x[2] = 0.0
    x[2, vocab // 3 :: 5] = -0.0  # signed zeros tie with zeros
    x[3, ::2] = float("-inf")  # a grammar's mask
    x[4] = float("-inf")  # every token masked
    x[5, [3 % vocab, 11 % vocab]] = big  # ties within and across words
    x[6] = x[6].round()  # many ties
    x[7, 0] = float("inf")
    x[7, vocab - 1] = float("inf")
    return x


@native
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 31, 33, 100, 8192, 49152])
def test_the_native_choices_are_torch_argmax(path, vocab) -> None:
    rows = NativeGreedyRows(native_forward.build(path))
    for seed in range(3):
        x = awkward_rows(vocab, seed)
        assert rows.choices(x) == x.argmax(dim=-1).tolist(), (path, vocab, seed)
        assert rows.choices(x[2:5]) == x[2:5].argmax(dim=-1).tolist()  # a view starting mid-tensor


@native
@pytest.mark.parametrize("path", PATHS)
def test_a_row_with_a_nan_picks_it_as_torch_does(path) -> None:
    rows = NativeGreedyRows(native_forward.build(path))
    x = torch.randn(3, 50)
    x[1, 17] = float("nan")
    x[1, 40] = 100.0
    assert rows.choices(x) == x.argmax(dim=-1).tolist()
    assert rows.choices(x)[1] == 17


@native
@pytest.mark.parametrize("path", PATHS)
def test_the_native_signal_is_torch_s_to_rounding_and_finite_under_a_mask(path) -> None:
    rows = NativeGreedyRows(native_forward.build(path))
    g = torch.Generator().manual_seed(5)
    for vocab in (1, 9, 100, 49152):
        x = torch.randn(3, vocab, generator=g) * 4
        x[2, 1::3] = float("-inf")
        for row in range(3):
            for token in {0, vocab - 1, int(x[row].argmax())}:
                got = rows.signal(x, row, token)
                want = TORCH_GREEDY_ROWS.signal(x, row, token)
                assert got[0] == pytest.approx(want[0], abs=1e-4), (vocab, row, token)
                assert got[1] == pytest.approx(want[1], abs=1e-4), (vocab, row, token)
                assert math.isfinite(got[1])


@native
def test_every_path_reads_the_same_bits() -> None:
    x = awkward_rows(49152, 7)
    x[3, 0] = 1.0  # a live token under the mask
    reads = {path: (NativeGreedyRows(native_forward.build(path)).choices(x),
                    [NativeGreedyRows(native_forward.build(path)).signal(x, r, 0) for r in (0, 3, 8)])
             for path in PATHS}
    assert len({repr(v) for v in reads.values()}) == 1, reads


def test_the_entropy_under_a_mask_is_that_of_the_live_tokens() -> None:
    live = torch.tensor([1.0, 2.0, 0.5])
    masked = torch.tensor([1.0, float("-inf"), 2.0, float("-inf"), 0.5])
    logp, entropy = log_probs_and_entropy(masked)
    want_logp, want = log_probs_and_entropy(live)
    assert float(entropy) == pytest.approx(float(want), rel=1e-6)
    assert float(logp[2]) == pytest.approx(float(want_logp[1]), rel=1e-6)
    assert logp[1] == float("-inf")


def test_the_engine_reads_greedy_rows_from_its_runner() -> None:
    from hvd_agents.engine.verify import verify_on_host

    class Counting:
        def __init__(self) -> None:
            self.calls = 0

        def choices(self, logits):
            self.calls += 1
            return TORCH_GREEDY_ROWS.choices(logits)

        def signal(self, logits, row, token):
            self.calls += 1
            return TORCH_GREEDY_ROWS.signal(logits, row, token)

    counting = Counting()
    logits = torch.randn(3, 20)
    draft = logits.argmax(dim=-1).tolist()[:2]
    assert verify_on_host(logits, draft, rows=counting) == verify_on_host(logits, draft)
    assert counting.calls == 2


@native
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("vocab", [1, 4, 9, 33, 8192])
def test_the_native_top_probabilities_are_torch_s(path, vocab) -> None:
    module = native_forward.build(path)
    g = torch.Generator().manual_seed(vocab)
    for trial in range(20):
        x = torch.randn(vocab, generator=g) * (1 + trial)
        if trial % 3 == 1:
            x[1::4] = float("-inf")  # a mask; the kept values still include the max at 0 when vocab is 1
        for k in range(1, min(8, vocab) + 1):
            indices, probs = module.top_probs(x, k)
            want = torch.topk(torch.softmax(x, dim=-1), k)
            if trial % 3 != 1:  # no ties: the same indices in the same order
                assert indices == want.indices.tolist(), (path, vocab, trial, k)
            assert probs == pytest.approx(want.values.tolist(), abs=1e-6)
            assert [float(x[i]) for i in indices] == sorted((float(x[i]) for i in indices), reverse=True)


@native
def test_the_native_top_takes_the_lower_index_among_ties_and_leaves_nans_to_torch() -> None:
    from hvd_agents.runtime.cpu.greedy_rows import native_top_probs

    x = torch.zeros(40)
    x[[30, 5, 17]] = 2.0
    x[39] = 1.0
    indices, probs = native_top_probs(x, 4)
    assert indices == [5, 17, 30, 39]
    assert probs[0] == probs[1] == probs[2] > probs[3]
    assert sum(probs) < 1.0
    nan = torch.randn(20)
    nan[3] = float("nan")
    assert native_forward.module().top_probs(nan, 2) == ([], [])
    got = native_top_probs(nan, 2)  # PyTorch's reading of it
    want = torch.topk(torch.softmax(nan, dim=-1), 2)
    assert got[0] == want.indices.tolist()


@native
def test_every_path_reads_the_same_top_bits() -> None:
    x = torch.randn(8192, generator=torch.Generator().manual_seed(3)) * 3
    reads = {path: native_forward.build(path).top_probs(x, 4) for path in PATHS}
    assert len({repr(v) for v in reads.values()}) == 1, reads
