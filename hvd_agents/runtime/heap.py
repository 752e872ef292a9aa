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

Loading also frees large temporaries (a GGUF file's converted blocks once the native model holds them in its
tiles); glibc keeps much of what is freed in its heap, resident. :func:`return_free_memory` (also called by
``load_model``) asks it to give free pages back to the system (``malloc_trim``; nothing elsewhere).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

GC_FREEZE_ENV = "HVD_AGENTS_GC_FREEZE"


def freeze_loaded_objects() -> bool:
    """Collect, then freeze every live object out of later collections; False when turned off."""
    if os.environ.get(GC_FREEZE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    gc.collect()
    gc.freeze()
    return True


def return_free_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``); False where the C library has
    no ``malloc_trim``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # another C library (musl)
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)  # 1 when pages were returned, 0 when there were none to return
    return True
