"""A GGUF file read once: its metadata, its tensor table, and its tensor data memory-mapped.

:class:`GGUFFile` parses the header in one pass with ``struct`` over a read-only memory map of the file (no
tensor byte is read until a tensor's ``data`` is used). ``gguf.GGUFReader`` builds a numpy view for every
part of every metadata value, about 20 s for a 49k-token vocabulary; this pass takes a fraction of a second
and skips the vocabulary's strings, which only the tokenizer reads (transformers' own reader does that).

Tensors are :class:`GGUFTensor` with the fields of ``gguf.GGUFReader``'s tensors that the loaders read
(``name``, ``tensor_type``, ``shape`` in ggml order, ``n_elements``, ``data``): ``data`` is float32 for F32,
float16 for F16, and the raw block bytes ``[rows, bytes per row]`` for any other type.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

_VERSIONS = (2, 3)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32


class StringArray(NamedTuple):
    """A metadata array of strings, left unread (a vocabulary, a merge table): how many it holds."""

    count: int


class GGUFTensor(NamedTuple):
    """One tensor of the file (the fields of ``gguf.GGUFReader``'s tensors the loaders use)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: the row length first
    n_elements: int
    data: np.ndarray  # a read-only view of the mapped file


class GGUFFile:
    """The file at ``path``, its header parsed once (see the module docstring).

    Attributes:
        path: the file.
        metadata: every key's value (numbers, strings, lists of numbers; string arrays as
            :class:`StringArray`).
        tensors: the tensors by name, in the file's order.

    Raises:
        ValueError: not a GGUF file, or a version or value type this reader does not read.
    """

    def __init__(self, path: str | Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        blob = np.memmap(self.path, mode="r", dtype=np.uint8)
        if bytes(blob[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file")
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", blob, 4)
        if version not in _VERSIONS:
            raise ValueError(f"{self.path} is GGUF version {version}; this reader reads versions 2 and 3")
        pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key, pos = _string(blob, pos)
            (kind,) = struct.unpack_from("<I", blob, pos)
            self.metadata[key], pos = _value(blob, pos + 4, kind)
        table = []
        for _ in range(tensor_count):
            name, pos = _string(blob, pos)
            (dims,) = struct.unpack_from("<I", blob, pos)
            shape = struct.unpack_from(f"<{dims}Q", blob, pos + 4)
            kind, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 12
            table.append((name, tuple(int(d) for d in shape), GGMLQuantizationType(kind), int(offset)))
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = (pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, kind, offset in table:
            n = int(np.prod(shape))
            block, size = GGML_QUANT_SIZES[kind]
            nbytes = n // block * size
            raw = blob[start + offset : start + offset + nbytes]
            if kind == GGMLQuantizationType.F32:
                data = raw.view(np.float32).reshape(shape[::-1])
            elif kind == GGMLQuantizationType.F16:
                data = raw.view(np.float16).reshape(shape[::-1])
            else:
                data = raw.reshape(*shape[:0:-1], shape[0] // block * size)
            self.tensors[name] = GGUFTensor(name, kind, shape, n, data)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def field(self, key: str, default: Any = None) -> Any:
        """A metadata value; ``default`` when the file does not have it."""
        return self.metadata.get(key, default)

    @property
    def float32_bytes(self) -> int:
        """What the file's tensors take as float32."""
        return 4 * sum(t.n_elements for t in self.tensors.values())


def _string(blob: np.ndarray, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    pos += 8
    return bytes(blob[pos : pos + length]).decode("utf-8"), pos + length


def _value(blob: np.ndarray, pos: int, kind: int) -> tuple[Any, int]:
    """One metadata value and the offset after it (a one-element array reads as its element, as
    transformers' GGUF config reader takes it)."""
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, blob, pos)
        return value, pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(blob, pos)
    if kind != _ARRAY:
        raise ValueError(f"GGUF metadata value of type {kind}")
    element, count = struct.unpack_from("<IQ", blob, pos)
    pos += 12
    if element in _SCALARS:
        fmt = _SCALARS[element]
        values = list(struct.unpack_from(f"<{count}{fmt[1]}", blob, pos))
        pos += count * struct.calcsize(fmt)
        return (values[0] if count == 1 else values), pos
    if element != _STRING:
        raise ValueError(f"GGUF metadata array of type {element}")
    if count == 1:
        return _string(blob, pos)
    for _ in range(count):
        (length,) = struct.unpack_from("<Q", blob, pos)
        pos += 8 + length
    return StringArray(int(count)), pos
