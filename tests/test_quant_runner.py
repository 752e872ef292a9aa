"""The native quantized CPU runner: invariance, losslessness, its KV cache, its weights.

Invariance is what keeps speculative output exactly the plain decode and a reply the
same however its prompt reached the cache: a row's result must be bitwise the same
computed alone or among any number of rows, in a chain or a tree, in a prompt whole
or in chunks. It is checked on the kernel (every weight format) and on whole forwards,
and a build of the kernel with a mutated accumulation order must fail the check.
The instruction-set paths are checked against each other in test_cpu_paths.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.errors import InvalidRequestError
from hvd_agents.runtime.cpu import gguf_blocks, gguf_iq_blocks, native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantKV, QuantRunner, tree_rows
from hvd_agents.runtime.runner import BatchCall
from hvd_agents.runtime.target import Target
from tests.drafters_for_tests import FixedDrafter, RandomQDrafter, ScriptedDrafter, TreeDrafter
from tests.kquant_model import BLOCKS, gguf_weight, kind, kquant_weights, make_kquant_llama, random_blocks
from tests.test_engine_lossless import assert_samples_follow
from tests.tiny import make_tiny_llama

pytestmark = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")

VOCAB = 96


# the GGUF type each native format converts here
_GGUF_OF = {native_forward.Q4F: "Q4_K", native_forward.Q4K: "Q4_K", native_forward.Q5F: "Q5_K",
            native_forward.Q5K: "Q5_K", native_forward.Q6S: "Q6_K", native_forward.Q6K: "Q6_K",
            native_forward.Q5_0: "Q5_0", native_forward.Q5_1: "Q5_1", native_forward.Q2K: "Q2_K"}
_WIDE = (native_forward.Q4F, native_forward.Q5F, native_forward.Q6S)


def _weights(fmt: int, rows: int, cols: int, seed: int) -> quant_weights.Weight:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if fmt == native_forward.Q8_0:
        return quant_weights.Weight(fmt, rows, cols, quant_weights.quantize_q8_0(w))
    if fmt == native_forward.Q4_1:
        return quant_weights.Weight(fmt, rows, cols, quant_weights.quantize_q4_1(w))
    if fmt in _GGUF_OF:  # random GGUF blocks as the loader converts them (or in the wide layout)
        return gguf_weight(_GGUF_OF[fmt], rows, cols, seed, wide=fmt in _WIDE)
    return quant_weights.Weight(fmt, rows, cols, w)


def _matrix(module, w: quant_weights.Weight):
    data = torch.from_numpy(w.data.reshape(-1).copy())
    return module.Matrix(w.fmt, w.rows, w.cols, data)


def invariance_failures(module, w: quant_weights.Weight, seed: int = 0) -> int:
    """How many (rows, row) pairs of ``linear`` differ from the row computed alone (0: invariant)."""
    matrix = _matrix(module, w)
    x = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((130, w.cols)).astype(np.float32))
    alone = [module.linear(matrix, x[i : i + 1])[0] for i in range(130)]
    failures = 0
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 47, 63, 64, 100, 130):
        together = module.linear(matrix, x[:m])
        failures += sum(not torch.equal(together[i], alone[i]) for i in range(m))
    return failures


FORMATS = [*native_forward.QUANTIZED, native_forward.F32]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: native_forward.FORMAT_NAMES[f])
def test_kernel_rows_are_bitwise_the_same_alone_and_in_1_to_130_rows(fmt) -> None:
    # a float32 tail past the 8-lane loop; quantized rows of several groups of 8 blocks and a partial one
    cols = 100 if fmt == native_forward.F32 else (1280 if _GGUF_OF.get(fmt, "").endswith("_K") else 800)
    w = _weights(fmt, 45, cols, seed=fmt)
    assert invariance_failures(native_forward.module(), w) == 0
    # and the products are the products: against the dequantized weight, to int8 activation precision
    module = native_forward.module()
    x = torch.randn(5, cols)
    dense = x @ module.dequantize(_matrix(module, w)).T
    got = module.linear(_matrix(module, w), x)
    assert (got - dense).abs().max() <= 0.03 * dense.abs().max()


def test_a_mutated_accumulation_order_fails_the_invariance_check() -> None:
    # the kernel built with its multi-row calls adding the groups of blocks in reverse order (one line
    # under a macro); 800 columns are 4 groups, so the order shows
    mutated = native_forward.build(native_forward.REFERENCE, ("-DHVD_MUTATE_MULTIROW_ORDER",))
    w = _weights(native_forward.Q4_1, 45, 800, seed=1)
    assert invariance_failures(native_forward.module(), w) == 0
    assert invariance_failures(mutated, w) > 0


@pytest.mark.parametrize("path", native_forward.cpu_paths() if native_forward.available() else [])
def test_16_bit_float_weights_give_the_bits_of_their_float32_values(path) -> None:
    # F16 and BF16 matrices (a GGUF file's F16 / BF16 tensors) are read as float32 where the kernel reads them:
    # every product is the one the same values held as float32 give, on 1 to 17 rows, whole and partial vectors
    from gguf import GGMLQuantizationType as T

    module = native_forward.build(path)
    rng = np.random.default_rng(11)
    for fmt, dtype in ((native_forward.F16, torch.float16), (native_forward.BF16, torch.bfloat16)):
        for rows, cols in ((37, 800), (16, 107)):
            w = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32)).to(dtype)
            half = module.Matrix(fmt, rows, cols, w.view(torch.uint8).reshape(-1).contiguous())
            full = module.Matrix(native_forward.F32, rows, cols, w.float().contiguous())
            assert half.nbytes * 2 == full.nbytes
            assert torch.equal(module.dequantize(half), w.float())
            x = torch.from_numpy(rng.standard_normal((17, cols)).astype(np.float32))
            for m in (1, 4, 17):
                assert torch.equal(module.linear(half, x[:m]).view(torch.int32), module.linear(full, x[:m]).view(torch.int32))
    # a GGUF BF16 tensor (2 bytes a value) keeps its bytes
    values = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float32)).to(torch.bfloat16)
    weight = quant_weights._converted(T.BF16, values.view(torch.uint8).numpy(), 4, 64)
    assert weight.fmt == native_forward.BF16 and np.array_equal(quant_weights.dense(weight), values.float().numpy())


def test_iq4_blocks_convert_exactly() -> None:
    # IQ4_NL (d * table[q] per 32) as Q8_0 and IQ4_XS (d * (ls - 32) * table[q] per 32 of 256) as q6s: the
    # native dequantization of the converted blocks is gguf's dequantization of the file's, bit for bit
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    module = native_forward.module()
    rng = np.random.default_rng(7)
    nl = rng.integers(0, 256, size=(8, 512 // 32, 18), dtype=np.uint8)
    nl[..., 0:2] = rng.uniform(-0.02, 0.02, size=(8, 512 // 32, 1)).astype(np.float16).view(np.uint8)
    nl = nl.reshape(8, -1)
    converted = quant_weights.Weight(native_forward.Q8_0, 8, 512, gguf_iq_blocks.iq4_nl_as_q8_0(nl))
    expected = dequantize(nl.reshape(-1), T.IQ4_NL).reshape(8, 512)
    assert np.array_equal(module.dequantize(_matrix(module, converted)).numpy(), expected)
    xs = rng.integers(0, 256, size=(8, 512 // 256, 136), dtype=np.uint8)  # every 6-bit scale, signs of both kinds
    xs[..., 0:2] = rng.uniform(-0.01, 0.01, size=(8, 512 // 256, 1)).astype(np.float16).view(np.uint8)
    xs = xs.reshape(8, -1)
    converted = quant_weights.Weight(native_forward.Q6S, 8, 512, gguf_iq_blocks.iq4_xs_as_q6s(xs))
    expected = dequantize(xs.reshape(-1), T.IQ4_XS).reshape(8, 512)
    got = module.dequantize(_matrix(module, converted)).numpy()
    assert np.array_equal(got, expected) and np.count_nonzero(expected) > 0.9 * expected.size
    assert {"IQ4_NL", "IQ4_XS"} <= set(quant_weights.NATIVE_GGUF_TYPES)
    assert gguf_blocks.native_blocks(T.IQ4_NL, nl)[0] == native_forward.Q8_0
    assert gguf_blocks.native_blocks(T.IQ4_XS, xs)[0] == native_forward.Q6S


# the grid types: bytes a block of 256 weights, and the float16 ``d``'s byte offset (IQ1_M: in the scales' top nibbles)
IQ_GRID_BLOCKS = {"IQ2_XXS": (66, 0), "IQ2_XS": (74, 0), "IQ2_S": (82, 0), "IQ3_XXS": (98, 0), "IQ3_S": (110, 0),
                  "IQ1_S": (50, 0), "IQ1_M": (56, None)}


def _random_iq_blocks(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random blocks of grid type ``name`` ``[rows, bytes]``: every byte pattern is a valid block; ``d`` any finite
    float16 (zeros, subnormals, both signs, up to 65504)."""
    size, at = IQ_GRID_BLOCKS[name]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    d = rng.integers(0, 1 << 16, size=blocks.shape[0], dtype=np.uint16)
    d[(d & 0x7C00) == 0x7C00] &= np.uint16(0x83FF)  # an infinity or NaN's exponent cleared: finite
    if at is not None:
        blocks[:, at : at + 2] = d.reshape(-1, 1).view(np.uint8)
    else:  # IQ1_M: d's 4 nibbles are the top nibbles of its 4 16-bit scale words
        words = blocks[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        words |= ((d.reshape(-1, 1) >> np.array([0, 4, 8, 12], dtype=np.uint16)) & np.uint16(0xF)) << np.uint16(12)
        blocks[:, 48:56] = words.view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("name", list(IQ_GRID_BLOCKS))
def test_iq_grid_blocks_convert_exactly(name) -> None:
    # IQ1/IQ2/IQ3 (a scale per 16 or 32 weights times grid values and signs, IQ1's grid -+ 1/8) as q6s: float32
    # scales (IQ1's over 8) and int8 weights whose products are gguf's dequantized values, bit for bit, through the
    # kernel's dequantization and the loader
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    module = native_forward.module()
    raw = _random_iq_blocks(name, 8, 1024, seed=len(name))
    expected = dequantize(raw.reshape(-1), T[name]).astype(np.float32).reshape(8, 1024)
    fmt, data = gguf_blocks.native_blocks(T[name], raw)
    assert fmt == native_forward.Q6S and data.nbytes == 8 * 1024 // 32 * 40
    got = module.dequantize(_matrix(module, quant_weights.Weight(fmt, 8, 1024, data))).numpy()
    assert np.isfinite(expected).all() and np.count_nonzero(expected) > 0.9 * expected.size
    assert np.array_equal(got.view(np.int32), expected.view(np.int32))  # bit for bit, zeros' signs too
    loaded = quant_weights._converted(T[name], raw, 8, 1024)
    assert loaded.fmt == native_forward.Q6S and np.array_equal(quant_weights.dense(loaded).view(np.int32), expected.view(np.int32))
    assert name in quant_weights.NATIVE_GGUF_TYPES
    # the kernel's products with them: as the float32 weights' products, to int8 activation precision
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((3, 1024)).astype(np.float32))
    dense = x @ torch.from_numpy(expected).T
    assert (module.linear(_matrix(module, loaded), x) - dense).abs().max() <= 0.03 * dense.abs().max()


def _random_q2_k_blocks(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q2_K blocks ``[rows, bytes]``: every byte pattern of scales and weights; ``d`` and ``dmin`` any finite
    float16 (zeros, subnormals, both signs, up to 65504)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, 84), dtype=np.uint8)
    halves = rng.integers(0, 1 << 16, size=(blocks.shape[0], 2), dtype=np.uint16)
    halves[(halves & 0x7C00) == 0x7C00] &= np.uint16(0x83FF)  # an infinity or NaN's exponent cleared: finite
    blocks[:, 80:84] = halves.view(np.uint8)
    return blocks.reshape(rows, -1)


def _tree8(p: np.ndarray) -> np.ndarray:
    """``((0+1)+(2+3))+((4+5)+(6+7))`` over the last axis of 8, in float32."""
    return ((p[..., 0] + p[..., 1]) + (p[..., 2] + p[..., 3])) + ((p[..., 4] + p[..., 5]) + (p[..., 6] + p[..., 7]))


def _q2_k_reference(raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x [M, K] @ W.T`` for Q2_K rows ``raw`` in float32 numpy, in the kernel's documented order (tile_linear.h):
    the inputs quantized per block of 32 (``d = max|x| / 127``, ``q = round(x * (127 / max|x|))``); per block,
    ``p = (d sc_0 * dx) * dot_0 + (d sc_1 * dx) * dot_1`` and ``q = (-dmin) m_0 * (dx * sum_0) + (-dmin) m_1 *
    (dx * sum_1)`` over its halves of 16; each group of 8 blocks summed as a tree, the groups added in order into
    two sums, ``y = acc + macc``. Read from the file's bytes, not from the native record."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 84)
    d = blocks[..., 80:82].copy().view(np.float16).astype(np.float32)
    dmin = blocks[..., 82:84].copy().view(np.float16).astype(np.float32)
    scale = (d * (blocks[..., :16] & np.uint8(15)).astype(np.float32)).reshape(rows, -1, 2)  # [N, blocks, half]
    minimum = (-dmin * (blocks[..., :16] >> np.uint8(4)).astype(np.float32)).reshape(rows, -1, 2)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    w = ((blocks[..., 16:80].reshape(rows, -1, 2, 1, 32) >> shifts) & np.uint8(3)).astype(np.int64)
    w = w.reshape(rows, -1, 2, 16)  # [N, blocks, half, 16]
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    dx = amax / np.float32(127)
    inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, np.float32(1)), np.float32(0))
    xq = np.rint(xb * inv.astype(np.float32)[..., None]).astype(np.int64).reshape(m, -1, 2, 16)
    dots = np.einsum("nbht,mbht->mnbh", w, xq).astype(np.float32)  # exact
    sx = dx[..., None] * xq.sum(-1).astype(np.float32)  # [M, blocks, half]: dx times the half's sum
    dxn = dx[:, None, :]
    p = (scale[None, ..., 0] * dxn) * dots[..., 0] + (scale[None, ..., 1] * dxn) * dots[..., 1]
    q = minimum[None, ..., 0] * sx[:, None, :, 0] + minimum[None, ..., 1] * sx[:, None, :, 1]
    p, q = _tree8(p.reshape(m, rows, -1, 8)), _tree8(q.reshape(m, rows, -1, 8))
    acc, macc = np.zeros((m, rows), np.float32), np.zeros((m, rows), np.float32)
    for g in range(p.shape[-1]):
        acc, macc = acc + p[..., g], macc + q[..., g]
    return acc + macc


@pytest.mark.parametrize(
    "path", [*native_forward.cpu_paths(), native_forward.EMULATED_AMX] if native_forward.available() else []
)
def test_q2_k_blocks_convert_exactly_and_compute_the_reference_bits(path) -> None:
    # Q2_K (d * sc * q - dmin * m per 16 weights, 2-bit q) as q2k: the file's bytes reordered (10.5 per 32); the
    # dequantized values are gguf's bit for bit, and every product is the float32 reference's bit for bit (no wide
    # format holds a minimum per 16 weights: the reference follows the kernel's documented order), on 1, 3, 17 and
    # 64 weight rows (partial tiles) and 1, 3, 17 and 64 input rows, every path this CPU runs and the amx path's
    # emulation (17 and 64 rows: passes on tiles)
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    module = native_forward.build(path)
    rng = np.random.default_rng(3)
    for rows, cols, seed in ((1, 512, 1), (3, 1280, 2), (17, 768, 3), (64, 512, 4)):
        raw = _random_q2_k_blocks(rows, cols, seed)
        fmt, data = gguf_blocks.native_blocks(T.Q2_K, raw)
        assert fmt == native_forward.Q2K and data.nbytes == raw.nbytes == rows * cols // 32 * 10.5
        assert native_forward.bytes_per_block(fmt) == 10.5
        matrix = _matrix(module, quant_weights.Weight(fmt, rows, cols, data))
        expected = dequantize(raw.reshape(-1), T.Q2_K).astype(np.float32).reshape(rows, cols)
        assert np.isfinite(expected).all() and np.count_nonzero(expected) > 0.9 * expected.size
        assert np.array_equal(module.dequantize(matrix).numpy().view(np.int32), expected.view(np.int32))
        x = (rng.standard_normal((64, cols)) * rng.uniform(0.1, 10)).astype(np.float32)
        x[0, :32] = 0.0  # a block of zeros: d = 0
        for m in (1, 3, 17, 64):
            got = module.linear(matrix, torch.from_numpy(x[:m])).numpy()
            assert np.array_equal(got.view(np.int32), _q2_k_reference(raw, x[:m]).view(np.int32)), (rows, m)
    # the loader reads Q2_K natively
    raw = _random_q2_k_blocks(4, 256, 9)
    loaded = quant_weights._converted(T.Q2_K, raw, 4, 256)
    assert loaded.fmt == native_forward.Q2K and "Q2_K" in quant_weights.NATIVE_GGUF_TYPES
    expected = dequantize(raw.reshape(-1), T.Q2_K).astype(np.float32).reshape(4, 256)
    assert np.array_equal(quant_weights.dense(loaded).view(np.int32), expected.view(np.int32))


@pytest.mark.parametrize("wide", [False, True], ids=["compact", "wide"])
def test_gguf_block_conversions_are_exact(wide) -> None:
    from gguf.quants import dequantize

    module = native_forward.module()
    for name in BLOCKS:  # the K-quants of Q4_K_M / Q5_K_M files (Q3_K of Q3_K_M) and the legacy 5-bit blocks
        raw = random_blocks(name, 8, 512, seed=5)
        fmt, data = gguf_blocks.native_blocks(kind(name), raw, wide=wide)
        expected = dequantize(raw.reshape(-1), kind(name)).reshape(8, 512)
        converted = quant_weights.Weight(fmt, 8, 512, data)
        assert np.array_equal(module.dequantize(_matrix(module, converted)).numpy(), expected), name
        if not wide and name != "Q3_K":  # about the file's bytes: at most 4 more a super-block (the 6-bit scales
            assert data.nbytes <= raw.nbytes + 8 * 512 // 256 * 4, name  # and minimums a byte each)
    rng = np.random.default_rng(4)
    q4_0 = rng.integers(0, 256, size=(8, 512 // 32, 18), dtype=np.uint8)
    q4_0[..., 0:2] = np.float16(0.02).reshape(1).view(np.uint8)
    q4_0 = q4_0.reshape(8, -1)
    fmt, data = gguf_blocks.native_blocks(kind("Q4_0"), q4_0, wide=wide)
    expected = dequantize(q4_0.reshape(-1), kind("Q4_0")).reshape(8, 512)
    assert np.array_equal(module.dequantize(_matrix(module, quant_weights.Weight(fmt, 8, 512, data))).numpy(), expected)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_compact_records_compute_the_wide_formats_bits(name) -> None:
    # the compact records compute each block's scale and minimum at run time (d * sc, (-dmin) * m, d * -16): the
    # same float32 products the wide formats hold, so every output is the same bits, on 1 to 64 rows
    module = native_forward.module()
    cols = 1280 if name.endswith("_K") else 800
    compact, wide = (_matrix(module, gguf_weight(name, 37, cols, seed=7, wide=w)) for w in (False, True))
    x = torch.from_numpy(np.random.default_rng(8).standard_normal((64, cols)).astype(np.float32))
    for m in (1, 5, 16, 17, 64):
        assert torch.equal(module.linear(compact, x[:m]).view(torch.int32), module.linear(wide, x[:m]).view(torch.int32))
    assert compact.nbytes < wide.nbytes


# ---------------------------------------------------------------- whole forwards on a tiny llama


def _tiny(scheme: str, seed: int = 0) -> NativeModel:
    if scheme == "kquant":  # random GGUF K-quant and 5-bit blocks in the loader's compact records
        model = make_kquant_llama(VOCAB, seed=seed)
        return NativeModel(model, kquant_weights(model, wide=False, seed=seed), 512)
    model = make_tiny_llama(VOCAB, seed=seed, dtype=torch.float32)
    return NativeModel(model, quant_weights.from_model(model, scheme), 512)


@pytest.fixture(scope="module", params=["int8", "int4", "float32", "kquant"])
def tiny_quant(request):
    return _tiny(request.param)


def test_compact_and_wide_records_give_a_k_quant_model_the_same_bits() -> None:
    # the same random blocks in the loader's compact records and in the wide float32-field formats: prompt,
    # decode steps, a draft and the KV cache bit for bit (what the formats hold differs, not one float operation)
    model = make_kquant_llama(VOCAB, seed=1)
    ids = torch.randint(0, VOCAB, (70,), generator=torch.Generator().manual_seed(5)).tolist()
    outputs = []
    for wide in (False, True):
        weights = kquant_weights(model, wide=wide, seed=3)
        runner = QuantRunner(NativeModel(model, weights, 512))
        kv = runner.new_kv()
        prompt = runner.forward(kv, ids[:50])
        steps = [runner.forward(kv, [t]) for t in ids[50:53]]
        draft = runner.forward(kv, ids[53:70])
        outputs.append((prompt, *steps, draft, kv.k[:, :, :70].clone(), kv.v[:, :, :70].clone(), weights.nbytes))
    (*compact, compact_bytes), (*wide, wide_bytes) = outputs
    assert all(torch.equal(a, b) for a, b in zip(compact, wide))
    assert compact[0].abs().max() > 0 and torch.isfinite(compact[0]).all()
    assert compact_bytes < 0.7 * wide_bytes


def test_forward_rows_alone_equal_rows_in_a_draft(tiny_quant) -> None:
    runner = QuantRunner(tiny_quant)
    ids = torch.randint(0, VOCAB, (80,), generator=torch.Generator().manual_seed(0)).tolist()
    kv = runner.new_kv()
    runner.forward(kv, ids[:16])
    alone = [runner.forward(kv, [t])[0] for t in ids[16:]]
    for m in (1, 2, 9, 33, 64):
        kv.rollback(16)
        together = runner.forward(kv, ids[16 : 16 + m])
        assert all(torch.equal(together[i], alone[i]) for i in range(m)), m


def _native_forward(native: NativeModel, kv, tokens: list[int], threads: int, parents=None) -> torch.Tensor:
    """One native forward of ``tokens`` after ``kv``'s positions on a team of ``threads`` (the cut of its work)."""
    past, n = kv.length, len(tokens)
    if parents is None:
        positions, visible = torch.arange(past, past + n), torch.empty(0, dtype=torch.bool)
    else:
        depth, visible = tree_rows(parents)
        positions = torch.tensor(depth) + past
    kv.reserve(past + n)
    logits, _ = native.native.forward(torch.tensor(tokens), positions, visible, kv.k, kv.v, past, n, False, threads)
    kv._length = past + n
    return logits


def test_attention_cut_into_jobs_of_any_shape_gives_the_same_bits(tiny_quant) -> None:
    # the team's size decides how attention is cut into jobs (rows and query heads a call, transposed or paired
    # scores, values two queries at a time); every row's logits and KV must be the same bits whatever the cut
    ids = torch.randint(0, VOCAB, (140,), generator=torch.Generator().manual_seed(3)).tolist()
    runner = QuantRunner(tiny_quant)
    results = {}
    for threads in (1, 2, 3, 5):
        kv = runner.new_kv()
        prompt = _native_forward(tiny_quant, kv, ids[:100], threads)
        step = _native_forward(tiny_quant, kv, ids[100:101], threads)
        chain = _native_forward(tiny_quant, kv, ids[101:118], threads)
        kv.rollback(101)
        tree = _native_forward(tiny_quant, kv, ids[120:129], threads, parents=[-1, 0, 0, 2, 2, -1, 5, 6])
        results[threads] = (prompt, step, chain, tree, kv.k[:, :, :101].clone(), kv.v[:, :, :101].clone())
    for threads, got in results.items():
        assert all(torch.equal(a, b) for a, b in zip(got, results[1])), threads


@pytest.mark.parametrize("path", native_forward.cpu_paths() if native_forward.available() else [])
def test_a_mutated_attention_order_fails_the_rows_alone_check(path) -> None:
    # attention built so that passes over several queries add a key's score lanes in another order (under a
    # macro): a draft's rows then differ from the same rows decoded alone
    model = make_tiny_llama(VOCAB, seed=0, dtype=torch.float32)
    weights = quant_weights.from_model(model, "float32")  # (int8 inputs of the output projection would round it away)
    mutated = native_forward.build(path, ("-DHVD_MUTATE_ATTENTION_ORDER",))  # each path's own passes
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(0)).tolist()

    def differing(native: NativeModel) -> int:
        runner = QuantRunner(native)
        kv = runner.new_kv()
        runner.forward(kv, ids[:16])
        alone = [runner.forward(kv, [t])[0] for t in ids[16:]]
        kv.rollback(16)
        together = runner.forward(kv, ids[16:])
        return sum(not torch.equal(together[i], alone[i]) for i in range(len(alone)))

    assert differing(NativeModel(model, weights, 512)) == 0
    assert differing(NativeModel(model, weights, 512, module=mutated)) > 0


def _attention_alone_differs(module, seed: int) -> list[tuple[int, int, int]]:
    """The cases of native_forward.ATTENTION_CASES whose queries' results differ computed in one call and alone."""
    rng = np.random.default_rng(seed)
    differing = []
    for queries, hd, slots in native_forward.ATTENTION_CASES:
        case = native_forward.attention_case(rng, queries, hd, slots)
        together, alone = module.attention(*case), module.attention(*case, alone=True)
        if not torch.equal(together.view(torch.int32), alone.view(torch.int32)):
            differing.append((queries, hd, slots))
    return differing


@pytest.mark.parametrize("path", native_forward.cpu_paths() if native_forward.available() else [])
def test_attention_of_real_head_sizes_is_the_same_alone_or_among_other_queries(path) -> None:
    # head sizes of real models (64, 80, 128; the tiny models' are 8): the passes over several queries (pairs of
    # keys, transposed chunks, values of several queries at once) give each query its result alone; a build adding
    # a key's score lanes in another order in those passes does not
    for seed in (0, 1):
        assert _attention_alone_differs(native_forward.build(path), seed) == []
    mutated = native_forward.build(path, ("-DHVD_MUTATE_ATTENTION_ORDER",))
    assert (24, 64, 300) in _attention_alone_differs(mutated, 0)


def test_attention_refuses_queries_that_see_no_slot() -> None:
    module = native_forward.build(native_forward.REFERENCE)
    q, kv = torch.zeros(2, 64), torch.zeros(10, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"query 1 sees \[4, 4\) of 10 slots"):
        module.attention(q, kv, kv, [0, 4], [3, 4], 0.125)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_batched_step_gives_each_request_its_logits_alone_bitwise(tiny_quant, data) -> None:
    runner = QuantRunner(tiny_quant)
    requests = data.draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20), st.booleans()), min_size=1,
                                  max_size=6))  # (cached positions, new rows, tree)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    calls, alone = [], []
    for past, n, tree in requests:
        prompt = rng.integers(0, VOCAB, past).tolist()
        tokens = rng.integers(0, VOCAB, n).tolist()
        parents = [int(rng.integers(-1, i)) for i in range(n - 1)] if tree else None
        batched_kv, own_kv = runner.new_kv(), runner.new_kv()
        runner.forward(batched_kv, prompt)
        runner.forward(own_kv, prompt)
        calls.append(BatchCall(batched_kv, tokens, parents))
        alone.append((own_kv, runner.forward(own_kv, tokens, parents=parents)))
    together = runner.forward_batch(calls)  # more than 64 rows in all run as several native forwards
    assert len(together) == len(calls)
    for call, got, (own_kv, want) in zip(calls, together, alone):
        assert torch.equal(got, want)
        assert call.kv.length == own_kv.length
        assert all(torch.equal(a[0], b[0]) for a, b in zip(call.kv.export_prefix(own_kv.length),
                                                           own_kv.export_prefix(own_kv.length)))


def test_a_batched_step_refuses_what_one_forward_cannot_take(tiny_quant) -> None:
    runner = QuantRunner(tiny_quant)
    kv = runner.new_kv()
    with pytest.raises(ValueError, match="1 to 64 tokens per request, not 65"):
        runner.forward_batch([BatchCall(kv, [1] * 65)])
    with pytest.raises(ValueError, match="needs 1 parents, not 2"):
        runner.forward_batch([BatchCall(kv, [1, 2], [-1, 0])])


def test_tree_rows_equal_the_chain_of_their_path(tiny_quant) -> None:
    runner = QuantRunner(tiny_quant)
    prompt = [5, 9, 13, 2, 7]
    kv = runner.new_kv()
    runner.forward(kv, prompt)
    root, a, b, c = 11, 20, 21, 30
    # root -> a -> c on one branch, root -> b on the other
    tree = runner.forward(kv, [root, a, b, c], parents=[-1, -1, 0])
    kv.compact(len(prompt), [0, 1, 3])  # keep the path root, a, c
    after = runner.forward(kv, [4])
    chain_kv = runner.new_kv()
    runner.forward(chain_kv, prompt)
    chain = [runner.forward(chain_kv, [t])[0] for t in (root, a, c, 4)]
    assert torch.equal(tree[0], chain[0]) and torch.equal(tree[1], chain[1]) and torch.equal(tree[3], chain[2])
    assert torch.equal(after[0], chain[3])
    other = runner.new_kv()
    runner.forward(other, prompt)
    assert torch.equal(tree[2], runner.forward(other, [root, b])[1])


def test_hidden_states_and_logits_to_keep(tiny_quant) -> None:
    runner = QuantRunner(tiny_quant)
    hidden: list = []
    kv = runner.new_kv()
    logits = runner.forward(kv, [1, 2, 3], logits_to_keep=1, hidden=hidden)
    assert logits.shape == (1, VOCAB) and hidden[0].shape == (3, tiny_quant.model.config.hidden_size)
    kv2 = runner.new_kv()
    assert torch.equal(runner.forward(kv2, [1, 2, 3])[-1], logits[0])


def test_a_prompt_whole_in_chunks_and_resumed_is_bitwise_the_same(tiny_quant) -> None:
    # 300 tokens: whole (two native calls of PREFILL_ROWS and the rest), in chunks of several sizes, and resumed
    # from an exported prefix; every position's KV and the last logits must be the same bits
    runner = QuantRunner(tiny_quant)
    ids = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    whole_kv = runner.new_kv()
    whole = runner.forward(whole_kv, ids, logits_to_keep=3)
    assert whole.shape[0] == 3
    for size in (1, 7, 64, 65, 100, 299):
        kv = runner.new_kv()
        for i in range(0, 300, size):
            last = runner.forward(kv, ids[i : i + size])
        assert torch.equal(last[-1], whole[-1]), size
        assert torch.equal(kv.k[:, :, :300], whole_kv.k[:, :, :300]) and torch.equal(kv.v[:, :, :300],
                                                                                     whole_kv.v[:, :, :300]), size
    resumed = runner.new_kv()
    resumed.import_prefix(whole_kv.export_prefix(123), 123)
    assert torch.equal(runner.forward(resumed, ids[123:])[-3:], whole)
    hidden: list = []
    runner.forward(runner.new_kv(), ids, logits_to_keep=1, hidden=hidden)
    assert hidden[0].shape == (300, tiny_quant.model.config.hidden_size)


def test_float32_weights_match_the_models_own_forward() -> None:
    native = _tiny("float32", seed=2)
    runner = QuantRunner(native)
    ids = [3, 17, 42, 5, 9, 3, 17]
    with torch.no_grad():
        expected = native.model(torch.tensor([ids])).logits[0]
    got = runner.forward(runner.new_kv(), ids)
    torch.testing.assert_close(got, expected, atol=5e-3, rtol=1e-3)  # the KV cache is float16


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    max_new=st.integers(1, 40),
    k=st.integers(0, 12),
    seed=st.integers(0, 10_000),
    tree=st.booleans(),
)
def test_greedy_equality_on_the_quantized_runner(tiny_quant, prompt, max_new, k, seed, tree) -> None:
    engine = Engine(Target.of(tiny_quant.model, eos_token_ids=(), native=tiny_quant))
    assert isinstance(engine.runner, QuantRunner)
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    drafter = (TreeDrafter(reference.token_ids, VOCAB, seed) if tree and k
               else ScriptedDrafter(reference.token_ids, VOCAB, seed))
    engine.add_drafter("scripted", drafter)
    result = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="scripted",
                                                      num_draft_tokens=k, reuse_prefix=False))
    assert result.token_ids == reference.token_ids
    for method in ("pld", "hvd"):
        assert engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method=method)).token_ids \
            == reference.token_ids


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
    max_new=st.integers(1, 40),
    k=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    tree=st.booleans(),
    warp=st.sampled_from([(1.0, 0, 1.0), (0.7, 0, 0.9), (0.8, 5, 0.95)]),
)
def test_seeded_sampling_with_deterministic_drafts_gives_ar_s_tokens(tiny_quant, prompt, max_new, k, seed, tree,
                                                                      warp) -> None:
    # on the CPU a deterministic draft is walked drawing one row's noise per emitted token, in order, as
    # ar draws it, from logits that are the same bits whatever the step's width: with the same seed,
    # every deterministic drafter's sampled tokens are ar's
    engine = Engine(Target.of(tiny_quant.model, eos_token_ids=(), native=tiny_quant))
    temperature, top_k, top_p = warp
    params = {"max_new_tokens": max_new, "temperature": temperature, "top_k": top_k, "top_p": top_p,
              "seed": seed, "reuse_prefix": False}
    reference = engine.generate(prompt, GenerationParams(method="ar", **params))
    drafter = (TreeDrafter(reference.token_ids, VOCAB, seed) if tree
               else ScriptedDrafter(reference.token_ids, VOCAB, seed))
    engine.add_drafter("scripted", drafter)
    result = engine.generate(prompt, GenerationParams(method="scripted", num_draft_tokens=k, **params))
    assert result.token_ids == reference.token_ids
    assert result.stats.steps <= reference.stats.steps
    for method in ("pld", "hvd"):  # no draft head for this model: hvd's drafts are the cache drafter's
        assert engine.generate(prompt, GenerationParams(method=method, **params)).token_ids == reference.token_ids


@pytest.mark.parametrize("kind", ["fixed", "q", "tree"])
def test_sampling_on_the_quantized_runner_follows_its_distribution(kind) -> None:
    from hvd_agents.engine.sampling import target_probs

    vocab = 8
    model = make_tiny_llama(vocab, seed=3, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)
    native = NativeModel(model, quant_weights.from_model(model, "int8"), 512)
    engine = Engine(Target.of(model, eos_token_ids=(), native=native))
    engine.add_drafter("fixed", FixedDrafter([2, 2, 5]))
    engine.add_drafter("q", RandomQDrafter(vocab, seed=5))
    engine.add_drafter("tree", FixedDrafter([2, 5, 2, 3], parents=[-1, -1, 0, 1]))
    prompt = [1, 4, 2, 7, 1, 4]
    params = GenerationParams(max_new_tokens=3 if kind == "tree" else 2, temperature=1.0, method=kind,
                              num_draft_tokens=3, seed=0)
    runner = engine.runner
    kv = runner.new_kv()
    first = target_probs(runner.forward(kv, prompt)[-1:], params.sampling)[0]
    expected = {}
    for t1 in range(vocab):
        kv.rollback(len(prompt))
        second = target_probs(runner.forward(kv, [t1]), params.sampling)[0]
        for t2 in range(vocab):
            expected[(t1, t2)] = float(first[t1] * second[t2])
    assert_samples_follow(engine, prompt, params, expected, n=1500)


# ---------------------------------------------------------------- the KV cache


def test_kv_rollback_compact_export_import_and_errors() -> None:
    kv = QuantKV(2, 1, 8, capacity=4)
    kv.reserve(10)
    assert kv.capacity >= 10
    kv.k[:, :, :10] = torch.arange(10, dtype=torch.float16)[None, None, :, None]
    kv._length = 10
    kv.compact(4, [0, 2, 5])
    assert kv.length == 7 and kv.k[0, 0, 4:7, 0].tolist() == [4.0, 6.0, 9.0]
    kv.rollback(5)
    assert kv.length == 5
    with pytest.raises(ValueError, match="truncate"):
        kv.rollback(6)
    with pytest.raises(ValueError, match="cannot keep"):
        kv.compact(2, [1, 0])
    layers = kv.export_prefix(5)
    assert layers[0][0].shape == (1, 1, 5, 8)
    other = QuantKV(2, 1, 8)
    other.import_prefix(layers, 5)
    assert other.length == 5 and torch.equal(other.k[:, :, :5], kv.k[:, :, :5])
    with pytest.raises(ValueError, match="empty cache"):
        other.import_prefix(layers, 5)
    with pytest.raises(ValueError, match="fewer"):
        kv.export_prefix(6)


def test_bad_inputs_are_refused_with_their_cause() -> None:
    native = _tiny("int8")
    runner = QuantRunner(native)
    with pytest.raises(ValueError, match="parents"):
        runner.forward(runner.new_kv(), [1, 2, 3], parents=[-1])
    with pytest.raises(RuntimeError, match="vocabulary"):
        runner.forward(runner.new_kv(), [VOCAB + 5])
    with pytest.raises(ValueError, match="context window"):
        runner.forward(runner.new_kv(), list(range(10)) * 52)
    with pytest.raises(ValueError, match="int8, int4 or float32"):
        quant_weights.from_model(native.model, "int3")
    with pytest.raises(ValueError, match="another model"):
        Target.of(make_tiny_llama(VOCAB, dtype=torch.float32), native=native)
    with pytest.raises(ValueError, match="another model"):
        Target(make_tiny_llama(VOCAB, dtype=torch.float32), runner, native=native)
    with pytest.raises(InvalidRequestError, match="cpu_weights='int2'"):
        from hvd_agents.runtime.loading import load_model

        load_model(None, cpu_weights="int2")


@pytest.mark.real_model
def test_the_embedded_model_runs_its_gguf_blocks(real_engine) -> None:
    runner = real_engine.runner
    assert isinstance(runner, QuantRunner)
    native = real_engine.target.native
    assert runner.native is native
    assert native.info.scheme == "gguf" and native.info.formats == {"Q4_1": 210, "Q8_0": 1}
    ids = real_engine.tokenizer("The capital of France is Paris. The capital of Italy is")["input_ids"]
    with torch.no_grad():  # the model's own forward (its first call loads the float32 weights)
        expected = real_engine.model(torch.tensor([ids])).logits[0, -1]
    # the blocks are the file's: dequantized, they are the float32 model's weights exactly
    module = native_forward.module()
    layer = real_engine.model.model.layers[5]
    for name, weight in (("attn_q", layer.self_attn.q_proj.weight), ("attn_k", layer.self_attn.k_proj.weight),
                         ("ffn_down", layer.mlp.down_proj.weight)):
        assert torch.equal(module.dequantize(native.matrices[5][name]), weight.detach())
    got = runner.forward(runner.new_kv(), ids, logits_to_keep=1)[0]
    assert got.argmax() == expected.argmax()
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.99


@pytest.mark.real_model
def test_recorded_agent_prompts_are_bitwise_the_same_whole_chunked_and_resumed(real_engine) -> None:
    # the examples' recorded calls (one conversation; HVD_REPLAY_ALL=1: all four, 16 calls): each prompt's KV
    # and last logits computed whole, in chunks of 64 and of 333, and resumed from the previous call's cached
    # prefix (what prefix reuse does) are the same bits, so every way of reaching the prompt decodes the same
    from hvd_agents.bench.agents import replay_calls
    from hvd_agents.bench.recorded import load_conversations, shipped_names

    names = shipped_names() if os.environ.get("HVD_REPLAY_ALL") else shipped_names()[:1]
    runner = real_engine.runner
    checked = 0
    for conversation in load_conversations(names):
        previous = None
        for call in replay_calls(real_engine, conversation, max_turns=4):
            ids = list(call.prompt_ids)
            whole_kv = runner.new_kv()
            whole = runner.forward(whole_kv, ids, logits_to_keep=1)
            ways = {}
            for size in (64, 333):
                kv = runner.new_kv()
                for i in range(0, len(ids), size):
                    last = runner.forward(kv, ids[i : i + size], logits_to_keep=1)
                ways[f"chunks of {size}"] = (kv, last)
            if previous is not None:
                prev_kv, prev_ids = previous
                common = next((i for i, (a, b) in enumerate(zip(prev_ids, ids)) if a != b), min(len(prev_ids), len(ids)))
                common = min(common, len(ids) - 1)
                kv = runner.new_kv()
                kv.import_prefix(prev_kv.export_prefix(common), common)
                ways[f"resumed after {common}"] = (kv, runner.forward(kv, ids[common:], logits_to_keep=1))
            n = len(ids)
            for way, (kv, last) in ways.items():
                assert torch.equal(last, whole), (conversation.name, call.index, way)
                assert torch.equal(kv.k[:, :, :n], whole_kv.k[:, :, :n]) and torch.equal(kv.v[:, :, :n],
                                                                                         whole_kv.v[:, :, :n])
            previous = (whole_kv, ids)
            checked += 1
    assert checked == 4 * len(names)


def test_the_layer_table_of_bench_kernels(capsys) -> None:
    from hvd_agents.bench.layer_kernels import SIZES, run_layer_benchmark

    run_layer_benchmark(rows=64, cols=256, repeats=1)
    lines = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    total = sum(SIZES)
    assert lines["native q4_1"].endswith(f"0/{total}") and lines["native q8_0"].endswith(f"0/{total}")
    assert "torch float32 F.linear" in lines and "torch int8 (_weight_int8pack_mm)" in lines
