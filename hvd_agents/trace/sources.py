"""Where agent conversations come from: one reader for every source ``analyze`` and ``loko`` take.

``load_source(path)`` reads API-Bank data (:mod:`hvd_agents.trace.api_bank`), a BFCL directory
(:mod:`hvd_agents.trace.bfcl`), a tau-bench results file (:mod:`hvd_agents.trace.tau_bench`) or a trace file
(:func:`~hvd_agents.trace.loader.load_trace`), by what ``path`` is.
"""

from __future__ import annotations

import os

from hvd_agents.trace.api_bank import is_api_bank, load_api_bank
from hvd_agents.trace.bfcl import is_bfcl, load_bfcl
from hvd_agents.trace.loader import TraceFile, load_trace
from hvd_agents.trace.tau_bench import is_tau_bench, load_tau_bench


def load_source(path: str | os.PathLike, *, skip_bad: bool = False, limit: int | None = None) -> TraceFile:
    """The conversations at ``path``; ``skip_bad`` applies to trace files (the other readers raise on bad data).

    Raises:
        TraceFormatError: a missing path, or data its reader cannot read.
    """
    if is_api_bank(path):
        return load_api_bank(path, limit=limit)
    if is_bfcl(path):
        return load_bfcl(path, limit=limit)
    if is_tau_bench(path):
        return load_tau_bench(path, limit=limit)
    return load_trace(path, skip_bad=skip_bad, limit=limit)
