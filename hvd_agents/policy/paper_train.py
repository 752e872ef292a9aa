"""Offline training of the paper's MLP (``hvd-agents train-payoff --paper``).

Input: step records of ``hvd-agents analyze --policy suffix --steps FILE`` (whole cache
drafts verified, so each record labels its draft's accepted length exactly). A record
is one sample when its cache drafter proposed something and the whole proposal was
verified (``cache_drafted > 0`` and ``drafted == cache_drafted``); other records (other
policies' cut or skipped drafts) are left out and counted.

The MLP regresses the accepted length (:func:`~hvd_agents.policy.paper.fit_mlp`); the
held-out conversations (a stable hash of each conversation id picks them, as for the
hazard model) give its mean absolute error and its precision and recall at the
threshold, next to the same figures for ``hvd``'s hazard model (its expected accepted
length of the whole draft) on the same drafts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvd_agents.errors import HVDError
from hvd_agents.policy.features import CacheDraftFeatures, FeatureRecordError
from hvd_agents.policy.paper import FLAG_NAMES, PAPER_THRESHOLD, PaperFeatures, PaperMLP, ThresholdQuality, fit_mlp
from hvd_agents.policy.payoff import PayoffPredictor
from hvd_agents.policy.train import split


@dataclass(frozen=True)
class PaperSample:
    """One whole cache draft: the hazard model's features, the paper's, its accepted length."""

    features: CacheDraftFeatures
    paper: PaperFeatures
    drafted: int
    accepted: int
    group: str


@dataclass(frozen=True)
class PaperEvaluation:
    """Held-out quality of the paper's MLP and of ``hvd``'s hazard model on the same drafts."""

    drafts: int
    mlp_mae: float
    mlp: ThresholdQuality
    hazard_mae: float
    hazard: ThresholdQuality

    def to_dict(self) -> dict[str, float]:
        return {"drafts": self.drafts, "mlp_mae": self.mlp_mae, "mlp_precision": self.mlp.precision,
                "mlp_recall": self.mlp.recall, "hazard_mae": self.hazard_mae,
                "hazard_precision": self.hazard.precision, "hazard_recall": self.hazard.recall,
                "high_payoff_share": self.mlp.high / self.drafts if self.drafts else float("nan")}


def read_paper_samples(paths: Sequence[str | os.PathLike]) -> tuple[list[PaperSample], int]:
    """Whole cache drafts from step-record files, and how many records were left out.

    Raises:
        HVDError: a file cannot be read, or a line is not a step record (the message names the file and line).
    """
    samples: list[PaperSample] = []
    left_out = 0
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise HVDError(f"cannot read step records {path}: {exc}") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            sample = _paper_sample(line, f"{path}:{number}")
            if sample is None:
                left_out += 1
            else:
                samples.append(sample)
    return samples, left_out


def _paper_sample(line: str, where: str) -> PaperSample | None:
    try:
        record = json.loads(line)
        drafted, cache_drafted = int(record["drafted"]), int(record.get("cache_drafted", 0))
        accepted = int(record["accepted"])
        flags = record.get("flags", {})
        flag_values = tuple(float(flags.get(name, 0.0)) for name in FLAG_NAMES)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HVDError(f"{where}: not a step record of hvd-agents analyze --steps ({exc})") from exc
    if cache_drafted <= 0 or drafted != cache_drafted:
        return None
    try:
        features = CacheDraftFeatures.from_record(record["features"])
    except FeatureRecordError as exc:
        raise HVDError(f"{where}: {exc}") from exc
    paper = PaperFeatures.of(features, float(features.match_len), drafted, flag_values)
    group = f"{record.get('policy', '')}/{record.get('conversation', '')}"
    return PaperSample(features, paper, drafted, accepted, group)


def evaluate_paper(mlp: PaperMLP, samples: Sequence[PaperSample], threshold: float) -> PaperEvaluation:
    """Both predictors' MAE and threshold quality on ``samples``."""
    actual = np.array([s.accepted for s in samples], dtype=np.float64)
    if not samples:
        empty = ThresholdQuality(0, 0, 0, 0)
        return PaperEvaluation(0, float("nan"), empty, float("nan"), empty)
    predicted = mlp.predict(np.stack([s.paper.row() for s in samples]))
    hazard = PayoffPredictor(learning_rate=0.0)
    expected = np.array([hazard.expected_accepted(s.features, s.drafted) for s in samples])
    return PaperEvaluation(len(samples), float(np.mean(np.abs(predicted - actual))),
                           ThresholdQuality.of(predicted, actual, threshold),
                           float(np.mean(np.abs(expected - actual))), ThresholdQuality.of(expected, actual, threshold))


def train_paper(paths: Sequence[str | os.PathLike], output: str | os.PathLike, *, held_out: float = 0.2,
                threshold: float = PAPER_THRESHOLD, epochs: int = 30, seed: int = 0) -> tuple[PaperMLP, PaperEvaluation]:
    """Fit the MLP on the records in ``paths``, evaluate on held-out conversations, save to ``output``.

    Raises:
        HVDError: unreadable or malformed records, or no whole cache draft to train on.
    """
    samples, left_out = read_paper_samples(paths)
    train, test = split(samples, held_out)  # type: ignore[arg-type]  (any sample with a ``group``)
    if not train:
        raise HVDError("no whole cache drafts to train on: pass steps of hvd-agents analyze --policy suffix --steps")
    x = np.stack([s.paper.row() for s in train])
    y = np.array([s.accepted for s in train], dtype=np.float64)
    mlp = fit_mlp(x, y, epochs=epochs, seed=seed)
    evaluation = evaluate_paper(mlp, test, threshold)
    mlp.meta = {"sources": [Path(p).name for p in paths], "train_drafts": len(train), "held_out_drafts": len(test),
                "left_out_records": left_out, "epochs": epochs, "seed": seed, "threshold": threshold,
                "held_out": evaluation.to_dict()}
    mlp.save(output)
    return mlp, evaluation
