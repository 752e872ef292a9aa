"""Head files measured beside an engine's own head (``bench-head --head``, ``bench-model --head``).

A head file is loaded for the engine's target and put on the kernel the engine drafts its own head on;
a head that fuses layers (``DraftHeadConfig.taps``) drafts only while the engine's runner gives those
layers' inputs, so each measured head runs inside :func:`tapped`, which sets the runner's taps to the
head's and gives the engine's own head its taps back afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hvd_agents.draft_head import DraftHead, load_head
from hvd_agents.errors import HVDError


def head_files(engine, paths: Sequence[str | Path]) -> dict[str, DraftHead]:
    """Each head file for ``engine``'s target, by its file's stem, on the engine's head kernel.

    Raises:
        HVDError: two files share a stem, or a head fuses layers the engine's runner cannot give.
    """
    heads: dict[str, DraftHead] = {}
    for path in paths:
        stem = Path(path).stem
        if stem in heads:
            raise HVDError(f"two head files are named {stem!r}: give each head file its own name")
        head = load_head(path, engine.model)
        if engine.drafters.quantize_head:  # the kernel the engine drafts its own head on
            head.quantize_for_cpu()
        if head.config.taps and _tap(engine) is None:
            raise HVDError(f"{path} fuses the inputs of layers {head.config.taps}, which this engine's runner "
                           "cannot give")
        heads[stem] = head
    return heads


@contextmanager
def tapped(engine, taps: Sequence[int]) -> Iterator[None]:
    """The engine's runner giving the inputs of layers ``taps`` beside its hidden states, then its own head's."""
    tap = _tap(engine)
    if tap is None:
        if taps:
            raise HVDError(f"this engine's runner cannot give the inputs of layers {tuple(taps)}")
        yield
        return
    tap(tuple(taps))
    try:
        yield
    finally:
        own = engine.draft_head
        tap(own.config.taps if own is not None else ())


def _tap(engine):
    return getattr(engine.runner, "set_hidden_taps", None)
