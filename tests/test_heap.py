"""``runtime/heap.py``: after a model is loaded, full garbage collections skip the objects loading left."""

from __future__ import annotations

import gc

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
    assert heap.freeze_loaded_objects() is False and gc.get_freeze_count() == frozen
    assert len(more) == len(kept)


@pytest.mark.real_model
def test_load_model_freezes_what_it_loaded(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(loading, "freeze_loaded_objects", lambda: calls.append(1) or True)
    loading.load_model(None)
    assert calls == [1]
