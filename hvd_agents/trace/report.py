"""Reports of a trace replay: the text table, ``--json``, ``--steps`` and (via :mod:`.html_report`) ``--html``.

* :func:`format_table` gives one row per policy: requests (assistant turns),
  output tokens, steps, tokens/step, % of steps with a draft, mean accepted when
  drafted, wasted verified tokens (drafted - accepted) and their share of the
  drafted tokens, estimated speedup; then the share of accepted tokens by
  provenance kind; then the paper's measures (:func:`format_paper_table`).
* :func:`report_json` is ``{policy: {figures..., "est_speedup": x,
  "accepted_by_kind": {kind: share}}, "_meta": {file, tokenizer, k, verify_cost,
  conversations, skipped, ...}}``.
* :class:`StepWriter` writes one JSON object per step (``ReplayStepRecord.to_dict()``);
  :class:`ProposalWriter` one per step with a cache proposal (``ReplayStepRecord.proposal_dict()``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from hvd_agents.errors import HVDError
from hvd_agents.trace.replay import ReplayResult
from hvd_agents.trace.stats import ReplayStepRecord

_COLUMNS = (
    ("policy", "{:<17}", "policy"),
    ("requests", "{:>8}", "requests"),
    ("output", "{:>9}", "output_tokens"),
    ("steps", "{:>8}", "steps"),
    ("tok/step", "{:>8.2f}", "tokens_per_step"),
    ("%drafted", "{:>8.1f}", "pct_steps_drafted"),
    ("acc|draft", "{:>9.2f}", "mean_accepted_when_drafted"),
    ("wasted", "{:>9}", "wasted_tokens"),
    ("%wasted", "{:>7.1f}", "pct_wasted"),
    ("speedup", "{:>8.2f}x", "est_speedup"),
)


def policy_figures(result: ReplayResult, verify_cost: float) -> dict[str, dict[str, Any]]:
    """``{policy: figures}`` in replay order."""
    return {name: stats.figures(verify_cost) for name, stats in result.stats.items()}


def format_table(result: ReplayResult, verify_cost: float) -> str:
    """The per-policy table and the accepted-token shares by provenance kind, as text."""
    figures = policy_figures(result, verify_cost)
    header = "  ".join(f"{title:>{_width(fmt)}}" if i else f"{title:<17}" for i, (title, fmt, _) in
                       enumerate(_COLUMNS))
    lines = [header, "-" * len(header)]
    for name, fig in figures.items():
        cells = [fmt.format(name if key == "policy" else fig[key]) for _, fmt, key in _COLUMNS]
        lines.append("  ".join(cells))
    kinds = sorted({kind for fig in figures.values() for kind in fig["accepted_by_kind"]})
    if kinds:
        lines += ["", "share of accepted tokens by provenance kind (%):"]
        width = max(len(k) for k in kinds) + 1
        lines.append(f"{'policy':<17}" + "".join(f"{k:>{width}}" for k in kinds))
        for name, fig in figures.items():
            shares = fig["accepted_by_kind"]
            if shares:
                lines.append(f"{name:<17}" + "".join(f"{100 * shares.get(k, 0.0):>{width}.1f}" for k in kinds))
    lines += ["", format_paper_table(result, verify_cost)]
    return "\n".join(lines)


def format_paper_table(result: ReplayResult, verify_cost: float) -> str:
    """The HVD paper's measures per policy, as text: cache proposals, their high-payoff share, the
    predictor's precision and recall at the threshold (``-`` for a policy that predicts nothing), the
    share of steps on each arm, verification cycles per 1K output tokens, wasted verified tokens and the tokens
    accepted off the cache proposal's path (a tree's alternatives)."""
    figures = policy_figures(result, verify_cost)
    if not figures:
        return ""
    threshold = next(iter(figures.values()))["payoff_threshold"]
    header = (f"{'policy':<17}{'cache drafts':>13}{'%high':>7}{'prec':>7}{'recall':>7}{'%cache':>8}{'%model':>8}"
              f"{'%merged':>8}{'%none':>7}{'cyc/1K':>8}{'wasted':>9}{'off-path':>9}")
    title = (f"the paper's measures (high-payoff: a cache draft that keeps >= {threshold:g} tokens; the predictor "
             f"flags a draft predicted to keep more than {threshold:g}):")
    lines = [title, header, "-" * len(header)]
    for name, fig in figures.items():
        arms = fig["pct_steps_by_arm"]
        lines.append(f"{name:<17}{fig['cache_drafts']:>13}{fig['pct_high_payoff']:>7.1f}{_pct(fig['precision']):>7}"
                     f"{_pct(fig['recall']):>7}{arms['cache']:>8.1f}{arms['model']:>8.1f}{arms['merged']:>8.1f}"
                     f"{arms['none']:>7.1f}{fig['cycles_per_1k']:>8.1f}{fig['wasted_tokens']:>9}"
                     f"{fig['off_path_tokens']:>9}")
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _width(fmt: str) -> int:
    digits = fmt.split(">")[1].split(".")[0].rstrip("}dfx")
    return int(digits) + (1 if fmt.endswith("x") else 0)


def report_json(result: ReplayResult, verify_cost: float, meta: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` document: figures per policy plus ``_meta``."""
    out: dict[str, Any] = dict(policy_figures(result, verify_cost))
    out["_meta"] = {
        **meta,
        "verify_cost": verify_cost,
        "conversations": result.conversations,
        "turns": result.turns,
        "notes": list(result.notes),
    }
    return out


def write_json(path: str | os.PathLike, document: dict[str, Any]) -> None:
    """Write a JSON document (UTF-8, indented).

    Raises:
        HVDError: the file cannot be written.
    """
    try:
        Path(path).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise HVDError(f"cannot write {path}: {exc}") from exc


class StepWriter:
    """Writes step records as JSONL; use as a context manager and pass it as the step sink.

    Raises:
        HVDError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._fh: IO[str] | None = None
        self.count = 0

    def __enter__(self) -> StepWriter:  # noqa: PYI034 (a final class)
        try:
            self._fh = open(self.path, "w", encoding="utf-8")
        except OSError as exc:
            raise HVDError(f"cannot write {self.path}: {exc}") from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __call__(self, step: ReplayStepRecord) -> None:
        self._write(step.to_dict())

    def _write(self, record: dict[str, Any]) -> None:
        assert self._fh is not None, "StepWriter used outside its with-block"
        self._fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.count += 1


class ProposalWriter(StepWriter):
    """Writes, for every step with a cache proposal whose features the policy reports (``suffix``, ``hvd``), the
    whole proposal as a ``train-payoff`` record (``ReplayStepRecord.proposal_dict()``): declined and cut
    proposals too, labelled by the recorded reply. A predictor fitted on a policy's own proposals sees the
    features (the acceptance history above all) as that policy makes them."""

    def __call__(self, step: ReplayStepRecord) -> None:
        record = step.proposal_dict()
        if record is not None:
            self._write(record)
