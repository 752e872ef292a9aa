"""GGUF's IQ blocks as the native formats' records, exactly: every weight's value is the file's.

:func:`~hvd_agents.runtime.cpu.gguf_blocks.native_blocks` converts a tensor of an IQ type with the converters
here (the K-quants and the legacy types with its own):

* IQ4_NL as Q8_0 (``d * table[q]``: the file's ``d``, the non-linear table's int8 values; 34 bytes per 32, the
  file 18) and IQ4_XS as ``q6s`` (``d * (ls - 32)``, exact in float32, for both halves of a block of 32; 40
  bytes per 32, the file 17).
* The grid types as ``q6s``, a weight ``scale * grid * sign`` with small integer grid values (IQ2: 8, 25, 43;
  IQ3: up to 62): the block's float32 scale per 16 weights (IQ2_XS, IQ2_S) or 32 (IQ2_XXS, IQ3_XXS, IQ3_S: for
  both halves), ``d * (0.5 + ls) * 0.25``, ``d * (0.5 + ls) * 0.5`` or ``d * (1 + 2 sc)``, and the int8
  ``grid * sign``. IQ1_S and IQ1_M (``d * (2 s + 1) * (grid + delta)``, grid -1..1, ``delta`` -+1/8, per 32 and
  per 16) hold the scale ``d * (2 s + 1) / 8`` and the int8 ``8 grid -+ 1``. Every scale is a float16 ``d``
  times a small integer (and a power of two), exact in float32, and the products with the weights (at most 22
  significant bits) too: the values are gguf's bit for bit. 40 bytes per 32 weights (the files 6.25 to 13.75).
"""

from __future__ import annotations

import functools

import numpy as np

# ---------------------------------------------------------------- IQ4: a non-linear table of int8 values

IQ4_VALUES = np.array((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), dtype=np.int8)


def _iq4_values(qs: np.ndarray) -> np.ndarray:
    """``[n, 16]`` bytes of 4-bit indices (low nibbles the first 16 weights, high nibbles the next 16) as the
    ``[n, 32]`` int8 values of IQ4's table."""
    return IQ4_VALUES[np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)]


def iq4_nl_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks (32 weights: ``d * table[q]``, ``d`` float16) as Q8_0 (the same ``d``, the table's int8
    values), exactly."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 18)
    out = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = blocks[:, 0:2]
    out[:, 2:] = _iq4_values(blocks[:, 2:]).view(np.uint8)
    return out.reshape(rows, -1)


def iq4_xs_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks (256 weights: ``d * (ls - 32) * table[q]`` per 32, ``ls`` 6 bits) as q6s (the float32
    scale ``d * (ls - 32)``, exact in 11 x 6 bits, for both halves of a block of 32), exactly."""
    rows = raw.shape[0]
    blocks = raw.reshape(-1, 136)
    n = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    high = blocks[:, 2:4].copy().view(np.uint16)  # [n, 1]: 2 bits a sub-block
    low = blocks[:, 4:8]
    ls = np.concatenate([low & np.uint8(0x0F), low >> np.uint8(4)], axis=1)[:, [0, 4, 1, 5, 2, 6, 3, 7]]
    ls = ls.astype(np.int32) | (((high >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)).astype(np.int32) << 4)
    scale = (d * (ls - 32).astype(np.float32)).astype(np.float32).reshape(n * 8, 1)  # [n * 8, 1], exact
    out = np.empty((n * 8, 40), dtype=np.uint8)
    out[:, 0:8] = np.repeat(scale, 2, axis=1).view(np.uint8)
    out[:, 8:] = _iq4_values(blocks[:, 8:].reshape(n * 8, 16)).view(np.uint8)
    return out.reshape(rows, -1)


# ---------------------------------------------------------------- IQ1, IQ2, IQ3: grids of small integers, signs


@functools.cache
def _grid(name: str) -> np.ndarray:
    """gguf's grid of IQ type ``name`` as int8 ``[entries, values]`` (IQ2: 8, 25, 43; IQ3: 4..62 or 1..15 odd;
    IQ1: -1, 0, 1)."""
    from gguf import quants

    cls = getattr(quants, name)
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    out = grid.astype(np.int8)
    assert np.array_equal(out.astype(np.float32), grid)
    return out


@functools.cache
def _sign_table(packed: bool) -> np.ndarray:
    """The multipliers (+1 or -1, int8 ``[entries, 8]``) of 8 weights' sign bits (bit k set: weight k negative):
    of ggml's ``ksigns`` (``packed``: a 7-bit index, the 8th sign the parity), or of a byte."""
    from gguf.quants import IQ2_XXS

    codes = np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8) if packed else np.arange(256, dtype=np.uint8)
    bits = (codes.reshape(-1, 1) >> np.arange(8, dtype=np.uint8)) & np.uint8(1)
    return (np.int8(1) - np.int8(2) * bits.astype(np.int8)).astype(np.int8)


def _nibble_pairs(scales: np.ndarray) -> np.ndarray:
    """Bytes ``[n, m]`` of 4-bit fields (low nibble first) as ``[n, 2 m]`` floats."""
    return np.stack([scales & np.uint8(0x0F), scales >> np.uint8(4)], axis=-1).reshape(scales.shape[0], -1).astype(np.float32)


def _q6s_records(scale: np.ndarray, values: np.ndarray, rows: int) -> np.ndarray:
    """q6s records from float32 scales per 16 weights ``[n, 16]`` (or per 32, ``[n, 8]``: both halves) and int8
    weights ``[n, 256]`` of super-blocks of 256."""
    scale = scale.astype(np.float32)
    if scale.shape[1] == 8:
        scale = np.repeat(scale, 2, axis=1)
    out = np.empty((scale.shape[0] * 8, 40), dtype=np.uint8)
    out[:, 0:8] = np.ascontiguousarray(scale.reshape(-1, 2)).view(np.uint8)
    out[:, 8:] = values.astype(np.int8).reshape(-1, 32).view(np.uint8)
    return out.reshape(rows, -1)


def _f16(field: np.ndarray) -> np.ndarray:
    """A float16 field ``[n, 2]`` as float32 ``[n, 1]``."""
    return field.copy().view(np.float16).astype(np.float32)


def iq2_xxs_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ2_XXS blocks (256 weights: ``d * (0.5 + ls) * 0.25 * grid * sign`` per 32; a 32-bit word of four 8-value
    grid indices and one of four 7-bit sign codes and ``ls``) as q6s (that float32 scale, exact in 11 x 5 bits,
    and the int8 ``grid * sign``), exactly."""
    blocks = raw.reshape(-1, 66)
    n = blocks.shape[0]
    words = blocks[:, 2:].copy().view("<u4").reshape(n, 8, 2)
    aux = words[..., 1]
    scale = _f16(blocks[:, 0:2]) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.25)
    grid = _grid("IQ2_XXS")[words[..., 0].copy().view(np.uint8).reshape(n, 8, 4)]  # [n, 8, 4, 8]
    signs = _sign_table(True)[(aux[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)]
    return _q6s_records(scale, (grid * signs).reshape(n, 256), raw.shape[0])


def iq2_xs_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ2_XS blocks (256 weights: ``d * (0.5 + ls) * 0.25 * grid * sign`` per 16; 16 bits per 8 weights: a 9-bit
    grid index, a 7-bit sign code) as q6s, exactly."""
    blocks = raw.reshape(-1, 74)
    n = blocks.shape[0]
    qs = blocks[:, 2:66].copy().view("<u2")  # [n, 32]
    scale = _f16(blocks[:, 0:2]) * (np.float32(0.5) + _nibble_pairs(blocks[:, 66:74])) * np.float32(0.25)
    values = _grid("IQ2_XS")[qs & np.uint16(511)] * _sign_table(True)[qs >> np.uint16(9)]
    return _q6s_records(scale, values.reshape(n, 256), raw.shape[0])


def iq2_s_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ2_S blocks (256 weights: ``d * (0.5 + ls) * 0.25 * grid * sign`` per 16; 10-bit grid indices per 8
    weights, a sign bit a weight) as q6s, exactly."""
    blocks = raw.reshape(-1, 82)
    n = blocks.shape[0]
    qs, sign_bytes, qh = blocks[:, 2:34], blocks[:, 34:66], blocks[:, 66:74]
    high = ((qh[..., None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & np.uint8(3)).reshape(n, 32)
    index = qs.astype(np.uint16) | (high.astype(np.uint16) << np.uint16(8))
    scale = _f16(blocks[:, 0:2]) * (np.float32(0.5) + _nibble_pairs(blocks[:, 74:82])) * np.float32(0.25)
    values = _grid("IQ2_S")[index] * _sign_table(False)[sign_bytes]
    return _q6s_records(scale, values.reshape(n, 256), raw.shape[0])


def iq3_xxs_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ3_XXS blocks (256 weights: ``d * (0.5 + ls) * 0.5 * grid * sign`` per 32; 8-bit grid indices per 4
    weights, a word of four 7-bit sign codes and ``ls`` per 32) as q6s, exactly."""
    blocks = raw.reshape(-1, 98)
    n = blocks.shape[0]
    aux = blocks[:, 66:98].copy().view("<u4")  # [n, 8]
    scale = _f16(blocks[:, 0:2]) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)
    grid = _grid("IQ3_XXS")[blocks[:, 2:66]].reshape(n, 8, 4, 8)
    signs = _sign_table(True)[(aux[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & np.uint32(127)]
    return _q6s_records(scale, (grid * signs).reshape(n, 256), raw.shape[0])


def iq3_s_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ3_S blocks (256 weights: ``d * (1 + 2 sc) * grid * sign`` per 32; 9-bit grid indices per 4 weights, a
    sign bit a weight) as q6s, exactly."""
    blocks = raw.reshape(-1, 110)
    n = blocks.shape[0]
    qs, qh, sign_bytes = blocks[:, 2:66], blocks[:, 66:74], blocks[:, 74:106]
    high = ((qh[..., None] >> np.arange(8, dtype=np.uint8)) & np.uint8(1)).reshape(n, 64)
    index = qs.astype(np.uint16) | (high.astype(np.uint16) << np.uint16(8))
    scale = _f16(blocks[:, 0:2]) * (np.float32(1) + np.float32(2) * _nibble_pairs(blocks[:, 106:110]))
    values = _grid("IQ3_S")[index].reshape(n, 32, 8) * _sign_table(False)[sign_bytes]
    return _q6s_records(scale, values.reshape(n, 256), raw.shape[0])


def _iq1_values(index: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """IQ1's weights times 8, ``8 * grid -+ 1`` (``grid + delta``, ``delta`` -+1/8), from grid indices ``[n, 32]``
    and the delta's sign per 8 weights ``[n, 32]``: int8 ``[n, 256]``."""
    delta = np.where(negative, np.int8(-1), np.int8(1)).astype(np.int8)
    return (np.int8(8) * _grid("IQ1_S")[index] + delta[..., None]).reshape(index.shape[0], 256)


def iq1_s_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ1_S blocks (256 weights: ``d * (2 s + 1) * (grid + delta)`` per 32, grid -1..1, delta -+1/8) as q6s (the
    scale ``d * (2 s + 1) / 8``, the int8 weights ``8 (grid + delta)``), exactly."""
    blocks = raw.reshape(-1, 50)
    n = blocks.shape[0]
    qs, qh = blocks[:, 2:34], blocks[:, 34:50].copy().view("<u2")  # [n, 32], [n, 8]
    high = ((qh[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & np.uint16(7)).reshape(n, 32)
    index = qs.astype(np.uint16) | (high << np.uint16(8))
    negative = np.repeat((qh & np.uint16(0x8000)) != 0, 4, axis=1)
    scale = _f16(blocks[:, 0:2]) * (np.float32(2) * ((qh >> np.uint16(12)) & np.uint16(7)).astype(np.float32) + np.float32(1))
    return _q6s_records(scale * np.float32(0.125), _iq1_values(index, negative), raw.shape[0])


def iq1_m_as_q6s(raw: np.ndarray) -> np.ndarray:
    """IQ1_M blocks (256 weights: ``d * (2 s + 1) * (grid + delta)`` per 16, delta per 8, ``d`` float16 in the
    scales' top nibbles) as q6s (the scale ``d * (2 s + 1) / 8``, the int8 weights ``8 (grid + delta)``), exactly."""
    blocks = raw.reshape(-1, 56)
    n = blocks.shape[0]
    qs, qh, sc = blocks[:, 0:32], blocks[:, 32:48], blocks[:, 48:56].copy().view("<u2")  # [n, 4] 16-bit words
    top = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    d = np.bitwise_or.reduce(top, axis=1).astype(np.uint16).view(np.float16).astype(np.float32).reshape(n, 1)
    nib = np.stack([qh & np.uint8(0x0F), qh >> np.uint8(4)], axis=-1).reshape(n, 32)
    index = qs.astype(np.uint16) | ((nib & np.uint8(7)).astype(np.uint16) << np.uint16(8))
    s = ((sc[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & np.uint16(7)).reshape(n, 16)
    scale = d * (np.float32(2) * s.astype(np.float32) + np.float32(1))
    return _q6s_records(scale * np.float32(0.125), _iq1_values(index, (nib & np.uint8(8)) != 0), raw.shape[0])


IQ_GRID_TYPES = {  # the grid types, each as q6s
    "IQ2_XXS": iq2_xxs_as_q6s, "IQ2_XS": iq2_xs_as_q6s, "IQ2_S": iq2_s_as_q6s, "IQ3_XXS": iq3_xxs_as_q6s,
    "IQ3_S": iq3_s_as_q6s, "IQ1_S": iq1_s_as_q6s, "IQ1_M": iq1_m_as_q6s,
}
