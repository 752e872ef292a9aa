"""The quantized linear kernel's integer dots at the extremes of every format.

On AVX2 the dots of unsigned weights sum several words' ``maddubs`` pairs in 16 bits before widening them
(``isa.h``'s ``i_dots_u``, as many words as each format's largest weight allows, ``Layout::GROUP``): exact only
while no sum can pass 32,767. Random weights almost never come near that bound, so these tests put every weight
at its format's largest value against inputs quantized to +127 or -127 (every product of one sign), where a sum
that wrapped would be off by a multiple of 65,536 products, and check the result against float64 arithmetic on
the dequantized weight. Signed weights (never summed in 16 bits) are put at their most negative, where ``|w|`` is
128 and a ``maddubs`` pair is closest to saturating.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hvd_agents.runtime.cpu import native_forward

pytestmark = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")

PATHS = native_forward.cpu_paths() if native_forward.available() else []
SIGNED = (native_forward.Q8_0, native_forward.Q6S)
COLS = 512  # two K-quant super-blocks; 16 blocks of 32: two groups of 8
ROWS = 40  # three tiles of 16 weight rows, the last one partial


def extreme_errors(module, fmt: int, sign: float) -> float:
    """The largest relative error of ``module.linear`` against float64 on the dequantized weight, every weight of
    ``fmt`` at its largest (signed ones: at their most negative) and every input at ``sign`` times one value (so
    quantized to +-127 exactly), on 1 to 17 input rows."""
    weight = native_forward.random_weight(module, fmt, ROWS, COLS, np.random.default_rng(fmt),
                                         fill=0x80 if fmt in SIGNED else 0xFF)
    dense = module.dequantize(weight).double()
    worst = 0.0
    for rows in (1, 2, 5, 17):
        x = torch.full((rows, COLS), sign * 0.75)
        got = module.linear(weight, x, threads=2).double()
        want = x.double() @ dense.T
        worst = max(worst, float(((got - want).abs() / want.abs().clamp_min(1e-6)).max()))
    return worst


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", native_forward.QUANTIZED, ids=lambda f: native_forward.FORMAT_NAMES[f])
def test_the_dots_are_exact_with_every_weight_and_input_at_its_largest(path, fmt) -> None:
    module = native_forward.build(path)
    for sign in (1.0, -1.0):
        assert extreme_errors(module, fmt, sign) < 1e-4, (path, native_forward.FORMAT_NAMES[fmt], sign)


def test_a_build_that_sums_too_many_words_in_16_bits_fails_the_extremes() -> None:
    # the AVX2 code with every format summing 8 words before widening: 5- and 6-bit weights then wrap
    mutated = native_forward.build("avx2", ("-DHVD_MUTATE_DOT_GROUP",))
    failing = {native_forward.FORMAT_NAMES[f] for f in native_forward.QUANTIZED if extreme_errors(mutated, f, 1.0) > 1e-4}
    wide = {native_forward.FORMAT_NAMES[f] for f in (native_forward.Q5F, native_forward.Q5K, native_forward.Q6K,
                                                     native_forward.Q5_0, native_forward.Q5_1)}
    assert failing == wide
