"""Trace replay (``hvd-agents analyze``): estimate the speedup of drafting policies on recorded agent logs.

Modules: :mod:`.loader` (trace files), :mod:`.api_bank`, :mod:`.bfcl` and :mod:`.tau_bench` (API-Bank
dialogues, BFCL single-turn results and tau-bench results as conversations), :mod:`.sources` (one reader for
all of them),
:mod:`.strategies` (drafters behind one protocol), :mod:`.replay` (the engine's loop without a
model), :mod:`.stats` (step records and totals), :mod:`.report` (table, JSON, steps),
:mod:`.html_report` (the HTML report) and :mod:`.analyze` (the command).
"""

from hvd_agents.trace.analyze import AnalyzeOptions, run_analyze
from hvd_agents.trace.loader import BadLine, Conversation, TraceFile, load_trace
from hvd_agents.trace.replay import ReplayConfig, ReplayResult, replay_trace, reply_tokens
from hvd_agents.trace.sources import load_source
from hvd_agents.trace.stats import PolicyStats, ReplayStepRecord, StepRecord
from hvd_agents.trace.strategies import POLICIES, resolve_policy_names

__all__ = [
    "POLICIES",
    "AnalyzeOptions",
    "BadLine",
    "Conversation",
    "PolicyStats",
    "ReplayConfig",
    "ReplayResult",
    "ReplayStepRecord",
    "StepRecord",
    "TraceFile",
    "load_source",
    "load_trace",
    "replay_trace",
    "reply_tokens",
    "resolve_policy_names",
    "run_analyze",
]
