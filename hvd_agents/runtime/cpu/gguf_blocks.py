"""GGUF blocks as the native formats' records, exactly: every weight's value is the file's.

:func:`native_blocks` converts rows of a GGUF tensor's blocks to rows of records of a native format
(:mod:`hvd_agents.runtime.cpu.native_forward`, ``native/tile_formats.h``), holding about the file's bytes:

* Q4_1 and Q8_0 unchanged; Q4_0 as Q4_1 (its offset ``-8 d`` as the block's minimum, exact).
* Q4_K as ``q4k``, Q5_K as ``q5k``: per super-block of 256 weights the file's ``d`` and ``-dmin`` (float16),
  each block's 6-bit scale and minimum (a byte each), then per block the nibbles (and Q5_K's plane of 5th
  bits): 18.5 and 22.5 bytes per 32 weights (the file: 18 and 22).
* Q6_K as ``q6k``: ``d``, the 16 int8 scales, per block the low nibbles and two planes of high bits, the
  weights ``q - 32``: 26.25 bytes per 32 (the file's). Q3_K as ``q6k`` too: its weights -4..3 as ``q - 32``,
  its scales ``sc - 32``.
* Q2_K as ``q2k``: the file's ``d`` and ``-dmin`` (float16), its 16 bytes of a 4-bit scale and a 4-bit minimum
  per 16 weights, then per block the 2-bit weights in 2 words (bits ``2 s`` of byte ``i`` of word ``c``: weight
  ``16 c + 4 s + i``): 10.5 bytes per 32 weights, the file's. The kernel computes a half block's scale
  ``d * sc`` and minimum ``(-dmin) * m`` (exact: 11 x 4 bits) and takes the minimum's product with each half
  block's exact integer sum of the activations.
* Q5_0 and Q5_1 as ``q5_0`` and ``q5_1``: the file's ``d`` (and ``m``), the nibbles, a plane of 5th bits (22
  and 24 bytes per 32, the file's).
* The IQ types (IQ4, and the grid types IQ1, IQ2, IQ3) as :mod:`.gguf_iq_blocks` converts them.

The kernel computes a K-quant block's float32 scale as ``d * sc`` and its minimum as ``(-dmin) * m``, and Q5_0's
minimum as ``d * -16``: the same float32 products the *wide* formats (``q4f``, ``q5f``, ``q6s``: float32 fields
per 32 weights, 24 to 40 bytes) hold, computed once at load. So a product is bitwise the same in either
layout; ``wide=True`` gives the wide layout, which the tests compare with. No wide format holds a minimum per 16
weights: Q2_K is ``q2k`` either way, and the tests compare its products with a float32 reference that follows the
kernel's documented order.
"""

from __future__ import annotations

import numpy as np

from hvd_agents.runtime.cpu.gguf_iq_blocks import IQ_GRID_TYPES, iq4_nl_as_q8_0, iq4_xs_as_q6s
from hvd_agents.runtime.cpu.native_forward import Q2K, Q4_1, Q4F, Q4K, Q5_0, Q5_1, Q5F, Q5K, Q6K, Q6S, Q8_0

_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)


def native_blocks(kind, raw: np.ndarray, wide: bool = False) -> tuple[int, np.ndarray] | None:
    """The native format of GGUF type ``kind`` and rows ``raw`` ``[rows, bytes]`` as rows of its records.

    Args:
        kind: a ``gguf.GGMLQuantizationType``.
        raw: rows of the file's blocks (rows convert independently).
        wide: Q4_K, Q5_K, Q6_K, Q3_K, Q5_0 and Q5_1 in the wide formats (float32 fields per 32 weights); the
            IQ types and Q2_K are one format either way.

    Returns:
        ``(format, records)``, or None for a type no native format holds (float tensors).
    """
    from gguf import GGMLQuantizationType as T

    raw = raw.reshape(raw.shape[0], -1)
    if kind in (T.Q4_1, T.Q8_0):
        return (Q4_1 if kind == T.Q4_1 else Q8_0), raw.copy()
    converters = {
        T.Q4_0: (Q4_1, q4_0_as_q4_1, Q4_1, q4_0_as_q4_1),
        T.Q4_K: (Q4K, q4_k_as_q4k, Q4F, q4_k_as_q4f),
        T.Q5_K: (Q5K, q5_k_as_q5k, Q5F, q5_k_as_q5f),
        T.Q6_K: (Q6K, q6_k_as_q6k, Q6S, q6_k_as_q6s),
        T.Q3_K: (Q6K, q3_k_as_q6k, Q6S, q3_k_as_q6s),
        T.Q2_K: (Q2K, q2_k_as_q2k, Q2K, q2_k_as_q2k),
        T.Q5_0: (Q5_0, q5_0_as_q5_0, Q5F, lambda r: q5_legacy_as_q5f(r, with_min=False)),
        T.Q5_1: (Q5_1, q5_1_as_q5_1, Q5F, lambda r: q5_legacy_as_q5f(r, with_min=True)),
        T.IQ4_NL: (Q8_0, iq4_nl_as_q8_0, Q8_0, iq4_nl_as_q8_0),
        T.IQ4_XS: (Q6S, iq4_xs_as_q6s, Q6S, iq4_xs_as_q6s),
        **{getattr(T, name): (Q6S, convert, Q6S, convert) for name, convert in IQ_GRID_TYPES.items()},
    }
    if kind not in converters:
        return None
    fmt, convert, wide_fmt, wide_convert = converters[kind]
    return (wide_fmt, wide_convert(raw)) if wide else (fmt, convert(raw))


# ---------------------------------------------------------------- the fields of the files' blocks


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """A float16 field's two bytes ``[n, 2]``."""
    return blocks[:, start : start + 2]


def _negated_half(blocks: np.ndarray, start: int) -> np.ndarray:
    """A float16 field negated (its sign bit flipped: exact), as two bytes ``[n, 2]``."""
    return (blocks[:, start : start + 2].copy().view(np.uint16) ^ np.uint16(0x8000)).view(np.uint8)


def _k_nibbles(qs: np.ndarray, n: int) -> np.ndarray:
    """Q4_K/Q5_K's low nibbles (32 bytes per pair of blocks: the low nibbles one block, the high ones the next)
    as ``[n, 8, 32]`` weights."""
    low = qs.reshape(n, -1, 1, 32) >> _NIBBLE_SHIFTS
    return (low & np.uint8(0x0F)).reshape(n, -1, 32)


def _q6_k_weights(blocks: np.ndarray) -> np.ndarray:
    """Q6_K's weights ``q`` (0..63; the value is ``q - 32``) as ``[n, 8, 32]``."""
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    low = ql.reshape(n, -1, 1, 64) >> _NIBBLE_SHIFTS
    low = (low & np.uint8(0x0F)).reshape(n, -1, 32)
    high = qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (high & np.uint8(0x03)).reshape(n, -1, 32)
    return low | (high << np.uint8(4))


def _q3_k_fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q3_K's ``d`` (float32 ``[n, 1]``), scales ``sc - 32`` (``[n, 16]``, -32..31) and weights (-4..3, ``[n, 256]``).

    A block holds the high bits of its 256 weights (32 bytes), their low two bits (64 bytes, four weights a
    byte), 16 six-bit scales packed in 12 bytes, and ``d`` (float16). Weights run in two halves of 128; in a
    half, shift ``j`` of the 32 low-bit bytes gives 32 weights (16 a scale), whose high bit is bit ``4 * half + j``
    of the 32 high-bit bytes (set: +0, clear: -4), as llama.cpp reads them.
    """
    n = blocks.shape[0]
    hmask, qs = blocks[:, :32], blocks[:, 32:96]
    aux = blocks[:, 96:108].copy().view("<u4")  # [n, 3]
    a0, a1, tmp = aux[:, 0], aux[:, 1], aux[:, 2]
    k1, k2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    packed = np.stack([(a0 & k2) | (((tmp >> 0) & k1) << 4), (a1 & k2) | (((tmp >> 2) & k1) << 4),
                       ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4), ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4)],
                      axis=1).astype("<u4")
    sc = packed.view(np.uint8).reshape(n, 16).astype(np.int8) - np.int8(32)  # [n, 16], in scale order
    d = blocks[:, 108:110].copy().view(np.float16).astype(np.float32)  # [n, 1]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    low = (qs.reshape(n, 2, 1, 32) >> shifts) & np.uint8(3)  # [n, half, j, 32]
    bits = (np.arange(2, dtype=np.uint8).reshape(1, 2, 1, 1) * 4 + np.arange(4, dtype=np.uint8).reshape(1, 1, 4, 1))
    high = (hmask.reshape(n, 1, 1, 32) >> bits) & np.uint8(1)
    q = (low.astype(np.int8) - np.int8(4) * (np.int8(1) - high.astype(np.int8))).reshape(n, 256)
    return d, sc, q


# ---------------------------------------------------------------- the compact records


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Blocks of 32 weights ``[..., 32]`` (their low 4 bits) as 16 bytes: weight t low, weight t + 16 high."""
    q = q & np.uint8(0x0F)
    return q[..., :16] | (q[..., 16:] << np.uint8(4))


def _plane5(high: np.ndarray) -> np.ndarray:
    """The 5th bits ``[..., 32]`` (0 or 1) of blocks as 4 bytes: bit k of byte i is weight 4k + i's."""
    h = high.reshape(*high.shape[:-1], 8, 4)
    shifts = np.arange(8, dtype=np.uint8).reshape(8, 1)
    return np.bitwise_or.reduce(h << shifts, axis=-2).astype(np.uint8)


def _planes6(high: np.ndarray) -> np.ndarray:
    """The two high bits ``[..., 32]`` (0..3) of blocks as 8 bytes: in 4-byte plane k // 4, bits 2 (k % 4) and
    2 (k % 4) + 1 of byte i are weight 4k + i's."""
    h = high.reshape(*high.shape[:-1], 2, 4, 4)  # [..., plane, k % 4, i]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1)
    return np.bitwise_or.reduce(h << shifts, axis=-2).astype(np.uint8).reshape(*high.shape[:-1], 8)


def q4_k_as_q4k(raw: np.ndarray) -> np.ndarray:
    """Q4_K blocks (256 weights: ``d * sc * q - dmin * m`` per 32) as q4k records, exactly."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, 144)
    n = blocks.shape[0]
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    out = np.empty((n, 148), dtype=np.uint8)
    out[:, 0:2], out[:, 2:4] = _half(blocks, 0), _negated_half(blocks, 2)
    out[:, 4:12], out[:, 12:20] = sc.reshape(n, 8), mn.reshape(n, 8)
    out[:, 20:] = _nibbles(_k_nibbles(blocks[:, 16:], n)).reshape(n, 128)
    return out.reshape(rows, -1)


def q5_k_as_q5k(raw: np.ndarray) -> np.ndarray:
    """Q5_K blocks (256 weights: ``d * sc * q - dmin * m`` per 32, q 5 bits) as q5k records, exactly."""
    from gguf.quants import Q4_K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, 176)
    n = blocks.shape[0]
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    high = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    weights = np.concatenate([_nibbles(_k_nibbles(blocks[:, 48:], n)), _plane5(high & np.uint8(1))], axis=-1)
    out = np.empty((n, 180), dtype=np.uint8)
    out[:, 0:2], out[:, 2:4] = _half(blocks, 0), _negated_half(blocks, 2)
    out[:, 4:12], out[:, 12:20] = sc.reshape(n, 8), mn.reshape(n, 8)
    out[:, 20:] = weights.reshape(n, 160)
    return out.reshape(rows, -1)


def _q6k_records(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q6k records from ``d`` (float16 bytes ``[n, 2]``), int8 scales ``[n, 16]`` and weights 0..63 ``[n, 8, 32]``."""
    n = q.shape[0]
    out = np.empty((n, 210), dtype=np.uint8)
    out[:, 0:2], out[:, 2:18] = d, sc.view(np.uint8)
    out[:, 18:] = np.concatenate([_nibbles(q), _planes6(q >> np.uint8(4))], axis=-1).reshape(n, 192)
    return out


def q6_k_as_q6k(raw: np.ndarray) -> np.ndarray:
    """Q6_K blocks (256 weights: ``d * sc * (q - 32)`` per 16) as q6k records, exactly."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 210)
    sc = blocks[:, 192:208].copy().view(np.int8)
    return _q6k_records(_half(blocks, 208), sc, _q6_k_weights(blocks)).reshape(rows, -1)


def q3_k_as_q6k(raw: np.ndarray) -> np.ndarray:
    """Q3_K blocks (256 weights: ``d * (sc - 32) * q``, q in -4..3, per 16) as q6k records, exactly."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 110)
    n = blocks.shape[0]
    _, sc, q = _q3_k_fields(blocks)
    weights = (q + np.int8(32)).astype(np.uint8).reshape(n, 8, 32)
    return _q6k_records(_half(blocks, 108), sc, weights).reshape(rows, -1)


def q2_k_as_q2k(raw: np.ndarray) -> np.ndarray:
    """Q2_K blocks (256 weights: ``d * sc * q - dmin * m`` per 16, q 2 bits, ``sc`` and ``m`` 4 bits) as q2k records
    (``d``, ``-dmin``, the file's 16 scale and minimum bytes, the weights as 2-bit fields), exactly.

    A block holds 16 bytes of scales (low nibble) and minimums (high nibble), 64 bytes of weights (four a byte),
    ``d`` and ``dmin``: in half ``h`` of 128 weights, shift ``2 j`` of its 32 bytes gives block ``4 h + j`` of 32
    weights, the scale bytes ``2 b`` and ``2 b + 1`` its halves', as llama.cpp reads them.
    """
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 84)
    n = blocks.shape[0]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (blocks[:, 16:80].reshape(n, 2, 1, 32) >> shifts) & np.uint8(3)  # [n, h, j, 32]: block 4 h + j
    q = q.reshape(n, 8, 2, 4, 4)  # [n, block, word c, shift s, byte i]: weight 16 c + 4 s + i
    words = np.bitwise_or.reduce(q << (np.uint8(2) * np.arange(4, dtype=np.uint8)).reshape(4, 1), axis=-2)
    out = np.empty((n, 84), dtype=np.uint8)
    out[:, 0:2], out[:, 2:4] = _half(blocks, 80), _negated_half(blocks, 82)
    out[:, 4:20] = blocks[:, 0:16]
    out[:, 20:] = words.astype(np.uint8).reshape(n, 64)
    return out.reshape(rows, -1)


def _q5_legacy_fields(raw: np.ndarray, with_min: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q5_0/Q5_1 blocks' scale and minimum fields (float16 bytes ``[n, 2 or 4]``), nibbles ``[n, 16]`` (the
    file's: weight t low, t + 16 high) and 5th bits ``[n, 32]``."""
    size = 24 if with_min else 22
    blocks = raw.reshape(-1, size)
    head = 4 if with_min else 2
    qh = blocks[:, head : head + 4].copy().view(np.uint32)  # [n, 1]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)
    return blocks[:, :head], blocks[:, head + 4 :], high


def q5_0_as_q5_0(raw: np.ndarray) -> np.ndarray:
    """Q5_0 blocks (``d * (q - 16)``) as q5_0 records (``d``, nibbles, plane; the minimum ``d * -16``), exactly."""
    head, qs, high = _q5_legacy_fields(raw, with_min=False)
    return np.concatenate([head, qs, _plane5(high)], axis=1).reshape(raw.shape[0], -1)


def q5_1_as_q5_1(raw: np.ndarray) -> np.ndarray:
    """Q5_1 blocks (``d * q + m``) as q5_1 records (``d``, ``m``, nibbles, plane), exactly."""
    head, qs, high = _q5_legacy_fields(raw, with_min=True)
    return np.concatenate([head, qs, _plane5(high)], axis=1).reshape(raw.shape[0], -1)


# ---------------------------------------------------------------- the wide records (float32 fields)


def q4_0_as_q4_1(raw: np.ndarray) -> np.ndarray:
    """Q4_0 blocks (``d * (q - 8)``) as Q4_1 (the minimum ``-8 d`` in float16: a power of two, exact)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 18)
    d = blocks[..., :2].copy().view(np.float16)
    out = np.empty((rows, blocks.shape[1], 20), dtype=np.uint8)
    out[..., 0:2] = d.view(np.uint8)
    out[..., 2:4] = (d * np.float16(-8)).astype(np.float16).view(np.uint8)
    out[..., 4:] = blocks[..., 2:]
    return out.reshape(rows, -1)


def _wide(first: np.ndarray, second: np.ndarray, weights: np.ndarray, rows: int) -> np.ndarray:
    """Wide records (two float32 fields, then the weights) from ``[m]`` fields and ``[m, bytes]`` weights."""
    out = np.empty((weights.shape[0], 8 + weights.shape[1]), dtype=np.uint8)
    out[:, 0:4] = first.astype(np.float32).reshape(-1, 1).view(np.uint8)
    out[:, 4:8] = second.astype(np.float32).reshape(-1, 1).view(np.uint8)
    out[:, 8:] = weights
    return out.reshape(rows, -1)


def _k_scale_min(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's float32 scales ``d * sc`` and minimums ``-(dmin * m)``, ``[n, 8]`` (exact: 11 x 6 bits)."""
    from gguf.quants import Q4_K

    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))


def q4_k_as_q4f(raw: np.ndarray) -> np.ndarray:
    """Q4_K blocks as q4f (float32 scale and minimum per 32 weights, nibbles), exactly."""
    blocks = raw.reshape(-1, 144)
    n = blocks.shape[0]
    scale, minimum = _k_scale_min(blocks)
    weights = _nibbles(_k_nibbles(blocks[:, 16:], n)).reshape(n * 8, 16)
    return _wide(scale.reshape(-1), minimum.reshape(-1), weights, raw.shape[0])


def q5_k_as_q5f(raw: np.ndarray) -> np.ndarray:
    """Q5_K blocks as q5f (float32 scale and minimum per 32 weights, a byte a weight), exactly."""
    blocks = raw.reshape(-1, 176)
    n = blocks.shape[0]
    scale, minimum = _k_scale_min(blocks)
    high = (blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    q = (_k_nibbles(blocks[:, 48:], n) | (high << np.uint8(4))).reshape(n * 8, 32)
    return _wide(scale.reshape(-1), minimum.reshape(-1), q, raw.shape[0])


def q6_k_as_q6s(raw: np.ndarray) -> np.ndarray:
    """Q6_K blocks as q6s (int8 weights ``q - 32``, a float32 scale ``d * sc`` per 16), exactly."""
    blocks = raw.reshape(-1, 210)
    n = blocks.shape[0]
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    scale = (d * blocks[:, 192:208].copy().view(np.int8).astype(np.float32)).reshape(n * 8, 2)
    q = (_q6_k_weights(blocks).astype(np.int8) - np.int8(32)).reshape(n * 8, 32)
    return _wide(scale[:, 0], scale[:, 1], q.view(np.uint8), raw.shape[0])


def q3_k_as_q6s(raw: np.ndarray) -> np.ndarray:
    """Q3_K blocks as q6s (int8 weights -4..3, a float32 scale ``d * (sc - 32)`` per 16), exactly."""
    blocks = raw.reshape(-1, 110)
    n = blocks.shape[0]
    d, sc, q = _q3_k_fields(blocks)
    scale = (d * sc.astype(np.float32)).reshape(n * 8, 2)
    return _wide(scale[:, 0], scale[:, 1], q.reshape(n * 8, 32).view(np.uint8), raw.shape[0])


def q5_legacy_as_q5f(raw: np.ndarray, with_min: bool) -> np.ndarray:
    """Q5_0 (``d * (q - 16)``) and Q5_1 (``d * q + m``) blocks as q5f, exactly."""
    head, qs, high = _q5_legacy_fields(raw, with_min)
    d = head[:, 0:2].copy().view(np.float16).astype(np.float32)
    minimum = head[:, 2:4].copy().view(np.float16).astype(np.float32) if with_min else d * np.float32(-16)
    low = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)  # [n, 32]
    return _wide(d, minimum, low | (high << np.uint8(4)), raw.shape[0])
