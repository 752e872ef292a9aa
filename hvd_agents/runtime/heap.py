"""Keeping the garbage collector's pauses short once a model is loaded.

Loading a model leaves hundreds of thousands of long-lived Python objects (modules,
parameters, the tokenizer's vocabulary, ...). Each full collection of CPython's
cyclic garbage collector walks all of them while holding the GIL: about 230 ms on
the embedded model, during which an async application's event loop is frozen (a
heartbeat task missed 235 ms during 16 concurrent ``ChatHVD.ainvoke`` calls, against
60 ms with this). :func:`freeze_loaded_objects`, called at the end of
:func:`~hvd_agents.runtime.loading.load_model`, collects once and then moves every
object alive at that point to the collector's permanent generation
(:func:`gc.freeze`), which later collections skip; objects created afterwards are
collected as usual. ``HVD_AGENTS_GC_FREEZE=0`` turns it off.
"""

from __future__ import annotations

import gc
import os

GC_FREEZE_ENV = "HVD_AGENTS_GC_FREEZE"


def freeze_loaded_objects() -> bool:
    """Collect, then freeze every live object out of later collections; False when turned off."""
    if os.environ.get(GC_FREEZE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    gc.collect()
    gc.freeze()
    return True
