"""``runtime/heap.py``: after a model is loaded, full garbage collections skip the objects loading left."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import pytest

from hvd_agents.runtime import heap, loading


def test_freezing_moves_live_objects_out_of_collections_and_can_be_turned_off(monkeypatch) -> None:
    kept = [[] for _ in range(10_000)]  # containers: objects the collector tracks
    before = gc.get_freeze_count()
    assert heap.freeze_loaded_objects() is True
    assert gc.get_freeze_count() >= before + len(kept)
    monkeypatch.setenv(heap.GC_FREEZE_ENV, "0")
    more = [[] for _ in range(10_000)]
    frozen = gc.get_freeze_count()
    # turned off, nothing more is frozen (the count may fall: a frozen object freed meanwhile leaves it)
    assert heap.freeze_loaded_objects() is False and gc.get_freeze_count() <= frozen
    assert len(more) == len(kept)


@pytest.mark.real_model
def test_load_model_freezes_what_it_loaded(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(loading, "freeze_loaded_objects", lambda: calls.append(1) or True)
    monkeypatch.setattr(loading, "return_free_memory", lambda: calls.append(2) or True)
    loading.load_model(None)
    assert calls == [1, 2]


def _anon_mb() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("RssAnon:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    # 64 KiB blocks come from the heap (under glibc's mmap threshold); the last one kept pins the heap's top,
    # so free() alone cannot give the others back
    blocks = [np.ones(1 << 16, dtype=np.uint8) for _ in range(3200)]  # 200 MiB
    last = blocks.pop()
    del blocks
    before = _anon_mb()
    assert heap.return_free_memory() is True
    assert before - _anon_mb() > 100
    assert last[0] == 1
