"""A GGUF file's embedding table as float32, memory-mapped from a cache file: resident only where rows are read.

The native forward reads its embedding from its own quantized tiles; the float32 table is for what gathers
rows of it (a draft head's token embeddings and its vocabulary's LM rows). Held in memory it would be
``vocab x hidden x 4`` bytes (0.11 GB for SmolLM2-135M, 1.05 GB for a Llama-3.2-1B shape) for a few
rows read; :func:`mapped_table` writes it once under ``cache_root()/embeddings/`` (dequantized exactly as the
native forward reads it, a chunk of rows at a time) and maps it copy-on-write, so only the pages of the rows
read become resident.

A cache file is named by the GGUF file's path, size and modification time and by the tensor (name, type,
shape); it is written to a temporary name and renamed into place, so a reader never sees half a table.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from hvd_agents.runtime.cpu.weights import dense_rows
from hvd_agents.runtime.gguf_file import GGUFFile
from hvd_agents.runtime.paths import cache_root

CHUNK_ROWS = 4096  # rows dequantized at a time while writing
_FORMAT = 1


def table_path(gguf: GGUFFile, name: str) -> Path:
    """Where the float32 table of ``gguf``'s tensor ``name`` is cached."""
    tensor = gguf.tensors[name]
    stat = gguf.path.stat()
    key = "|".join(map(str, (_FORMAT, gguf.path.resolve(), stat.st_size, stat.st_mtime_ns, name,
                             tensor.tensor_type.name, tensor.shape)))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "embeddings" / f"{gguf.path.stem}-{name.removesuffix('.weight')}-{digest}.f32"


def _write(gguf: GGUFFile, name: str, target: Path) -> None:
    tensor = gguf.tensors[name]
    rows = tensor.n_elements // tensor.shape[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            for start in range(0, rows, CHUNK_ROWS):
                out.write(dense_rows(tensor, start, min(rows, start + CHUNK_ROWS)).tobytes())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def mapped_table(gguf: GGUFFile, name: str) -> torch.Tensor:
    """``gguf``'s matrix ``name`` as a float32 ``[rows, cols]`` tensor mapped from its cache file (written on
    first use); writes to it stay private to this process."""
    tensor = gguf.tensors[name]
    cols = int(tensor.shape[0])
    rows = tensor.n_elements // cols
    target = table_path(gguf, name)
    if not target.is_file() or target.stat().st_size != rows * cols * 4:
        _write(gguf, name, target)
    return torch.from_numpy(np.memmap(target, dtype=np.float32, mode="c", shape=(rows, cols)))
