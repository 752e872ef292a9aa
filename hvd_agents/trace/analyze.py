"""``hvd-agents analyze``: replay an agent trace through the drafters and report the estimated speedup.

:func:`run_analyze` is the whole command: load the tokenizer and the trace,
resolve the policies, replay (optionally streaming ``--steps`` and ``--proposals``), print the table
(and notes) to ``out``, and write ``--json`` / ``--html``. It returns the JSON
document. Every error a user can cause is an :class:`~hvd_agents.errors.HVDError`.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, Any

from hvd_agents.errors import HVDError, InvalidRequestError
from hvd_agents.policy.cost import FALLBACK_VERIFY_COST
from hvd_agents.policy.paper import PAPER_THRESHOLD
from hvd_agents.trace.loader import TraceFile
from hvd_agents.trace.replay import ReplayConfig, ReplayResult, prepare_conversation, replay_trace
from hvd_agents.trace.report import ProposalWriter, StepWriter, format_table, report_json, write_json
from hvd_agents.trace.sources import load_source
from hvd_agents.trace.stats import ReplayStepRecord
from hvd_agents.trace.strategies import resolve_policy_names

logger = logging.getLogger(__name__)

TIKTOKEN_PREFIX = "tiktoken:"
PROPOSING = ("suffix", "hvd")  # the policies whose step records carry their cache proposal's features


@dataclass(frozen=True)
class AnalyzeOptions:
    """The command's options (see ``hvd-agents analyze --help``)."""

    file: str
    policy: str | None = None
    k: int = 16
    verify_cost: float | None = None  # None: the configured model's measured profile
    threshold: float | None = None
    json_path: str | None = None
    steps_path: str | None = None
    html_path: str | None = None
    skip_bad: bool = False
    tokenizer: str | None = None
    limit: int | None = None
    canonical_tools: bool = False
    system_template: str | None = None
    html_conversation: str | None = None
    quiet: bool = False
    payoff_threshold: float = PAPER_THRESHOLD
    paper_weights: str | None = None
    payoff_weights: str | None = None
    proposals_path: str | None = None


def _check(options: AnalyzeOptions) -> None:
    if options.k < 1:
        raise InvalidRequestError(f"--k must be >= 1, got {options.k}")
    if options.verify_cost is not None and options.verify_cost < 0:
        raise InvalidRequestError(f"--verify-cost must be >= 0, got {options.verify_cost}")
    if options.payoff_threshold < 0:
        raise InvalidRequestError(f"--payoff-threshold must be >= 0, got {options.payoff_threshold}")
    if options.limit is not None and options.limit < 1:
        raise InvalidRequestError(f"--limit must be >= 1, got {options.limit}")


def run_analyze(options: AnalyzeOptions, out: IO[str] | None = None) -> dict[str, Any]:
    """Run the analysis and print the report to ``out`` (stdout by default).

    Raises:
        HVDError: bad options, a missing or malformed trace, an unknown policy,
            template or tokenizer, or an unwritable output file.
    """
    out = out or sys.stdout
    _check(options)
    names, notes = resolve_policy_names(options.policy)
    if options.payoff_weights and "hvd" not in names:
        raise InvalidRequestError("--payoff-weights sets the hvd policy's predictor; --policy does not include hvd")
    if options.proposals_path and not any(name in PROPOSING for name in names):
        raise InvalidRequestError(f"--proposals writes the cache proposals of {' or '.join(PROPOSING)}; "
                                  f"--policy includes neither")
    template = None
    if options.system_template:
        from hvd_agents.chat.prompt_templates import load_template

        template = load_template(options.system_template)
    trace = load_source(options.file, skip_bad=options.skip_bad, limit=options.limit)
    from hvd_agents.runtime.loading import load_tokenizer

    tokenizer = load_tokenizer(options.tokenizer)
    verify_cost = options.verify_cost
    if verify_cost is None:
        verify_cost = measured_verify_cost(options.tokenizer, notes)
    config = ReplayConfig(tuple(names), options.k, verify_cost, options.threshold,
                          options.canonical_tools, template, options.html_conversation,
                          payoff_threshold=options.payoff_threshold, paper_weights=options.paper_weights,
                          payoff_weights=options.payoff_weights)
    start = time.perf_counter()
    with ExitStack() as stack:
        writers = [stack.enter_context(kind(path)) for kind, path in ((StepWriter, options.steps_path),
                                                                      (ProposalWriter, options.proposals_path)) if path]

        def sink(step: ReplayStepRecord) -> None:
            for writer in writers:
                writer(step)

        result = replay_trace(tokenizer, trace, config, step_sink=sink if writers else None, progress=not options.quiet)
    elapsed = time.perf_counter() - start
    result.notes.extend(notes)
    if trace.skipped:
        result.notes.append(f"{len(trace.skipped)} malformed conversation(s) skipped")
    meta = _meta(options, tokenizer, names, len(trace.skipped), elapsed)
    document = report_json(result, verify_cost, meta)
    print(format_table(result, verify_cost), file=out)
    for note in result.notes:
        print(f"note: {note}", file=out)
    if not options.quiet:
        print(f"{result.conversations} conversations, {result.turns} assistant turns, "
              f"replayed in {elapsed:.1f} s", file=out)
    if options.json_path:
        write_json(options.json_path, document)
    if options.html_path:
        _write_html(options.html_path, config, result, meta, tokenizer, trace)
    return document


def measured_verify_cost(model: str | None, notes: list[str]) -> float:
    """``c`` of the configured model's measured cost profile on this machine (mean marginal cost of a
    draft token over 0..32 tokens); :data:`FALLBACK_VERIFY_COST` with a note when no model loads."""
    if model is not None and model.startswith(TIKTOKEN_PREFIX):
        notes.append(f"--verify-cost defaults to {FALLBACK_VERIFY_COST}: a tiktoken tokenizer has no model to measure")
        return FALLBACK_VERIFY_COST
    from hvd_agents.engine.shared import shared_engine

    try:
        profile = shared_engine(model).cost_model()
    except HVDError as exc:
        notes.append(f"--verify-cost defaults to {FALLBACK_VERIFY_COST}: no model to measure ({exc})")
        return FALLBACK_VERIFY_COST
    c = round(profile.per_token, 4)
    notes.append(f"--verify-cost {c} from the model's cost profile ({profile.source})")
    return c


def _meta(options: AnalyzeOptions, tokenizer: Any, names: list[str], skipped: int, elapsed: float) -> dict[str, Any]:
    return {
        "file": options.file,
        "tokenizer": options.tokenizer or f"embedded ({getattr(tokenizer, 'name_or_path', '?')})",
        "k": options.k,
        "threshold": options.k if options.threshold is None else options.threshold,
        "payoff_threshold": options.payoff_threshold,
        "paper_weights": options.paper_weights or "packaged",
        "policies": names,
        "canonical_tools": options.canonical_tools,
        "system_template": options.system_template,
        "skipped": skipped,
        "replay_seconds": round(elapsed, 2),
    }


def _write_html(
    path: str, config: ReplayConfig, result: ReplayResult, meta: dict[str, Any], tokenizer: Any, trace: TraceFile
) -> None:
    from hvd_agents.trace.html_report import render_html, write_html

    conversation = next((c for c in trace.conversations if c.id == result.highlight_id), None)
    if conversation is not None:  # message indices as replayed (a system template may insert one)
        conversation = prepare_conversation(conversation, config)
    write_html(path, render_html(result, config.verify_cost, meta, tokenizer, conversation))
