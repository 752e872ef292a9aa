"""Offline training and evaluation of the payoff predictor (``hvd-agents train-payoff``).

Input: step records, one JSON object per line, as ``hvd-agents analyze --steps``
writes them (``drafted``, ``accepted``, ``features``, ``conversation``, ...), or as
``analyze --proposals`` writes them (a policy's whole cache proposal at every step, verified
or not, labelled by the reply); or the engine's live
:class:`~hvd_agents.engine.stats.VerifyStepRecord` s as dicts. Only drafted steps are used. A draft of ``d`` tokens with ``a`` accepted labels
positions ``0..a-1`` as accepted and position ``a`` (when ``a < d``) as rejected;
later positions are unobserved. A record's ``features`` are read by
:meth:`~hvd_agents.policy.features.CacheDraftFeatures.from_record`: an unknown
or misspelt name is an error (naming the file and line), never a silent default.
Train on records of a policy that verifies whole
drafts (``suffix`` with a large ``--k``), so long drafts are labelled too, or on ``hvd``'s own
``--proposals`` (its features, the acceptance history above all, as ``hvd`` makes them; see
docs/hvd-policy.md, "The shipped weights").

Fit: L2-regularised logistic regression of the hazard by Newton's method (IRLS)
over all labelled positions; and, when the records carry the drafts' text classes
(``analyze`` writes them where the tokenizer is known), the hazard network
(:mod:`hvd_agents.policy.hazard_mlp`) on the same positions with their text
columns, shipped in the same file (the predictor uses it where a draft's text is
known, the logistic weights elsewhere). Evaluation on held-out conversations (a stable hash
of the conversation id picks them): mean absolute error of the predicted
expected accepted length of each whole draft, Spearman rank correlation between
predicted and actual accepted lengths, and the same two figures for the
baseline that predicts per-position acceptance rates (no features), so a
report shows what the features add.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hvd_agents.errors import HVDError, InvalidRequestError
from hvd_agents.policy.features import (
    DRAFT_FEATURES,
    FEATURE_NAMES,
    NUM_FEATURES,
    CacheDraftFeatures,
    FeatureRecordError,
    feature_matrix,
)
from hvd_agents.policy.hazard_mlp import MLP_INPUTS, HazardMLP, fit_hazard_mlp
from hvd_agents.policy.payoff import (
    DEFAULT_ONLINE,
    DEFAULT_ONLINE_RATE,
    WEIGHTINGS,
    PayoffPredictor,
    PayoffWeights,
)
from hvd_agents.policy.token_text import text_columns

BALANCES: tuple[str, ...] = ("none", "conversation")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftSample:
    """One verified draft: its features, length and accepted length."""

    features: CacheDraftFeatures
    drafted: int
    accepted: int
    group: str  # the conversation (train/held-out split unit)


@dataclass(frozen=True)
class Evaluation:
    """Predictor quality on held-out drafts."""

    drafts: int
    mae: float
    spearman: float
    baseline_mae: float
    baseline_spearman: float

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class FitSettings:
    """How the predictor is fitted and how it adapts online (``train-payoff`` and ``loko`` options).

    Attributes:
        l2: ridge penalty of the logistic fit (the bias is not penalised).
        hidden: hidden units of the hazard network (0: the logistic hazard only).
        epochs: the network's training epochs.
        seed: the network's seed.
        held_out: share of conversations held out for the evaluation in ``meta`` (not fitted on).
        drop: inputs left out, by name or ``fnmatch`` pattern over
            :data:`~hvd_agents.policy.hazard_mlp.MLP_INPUTS` (``"log_distance"``, ``"kind=*"``,
            ``"text-3:*"``): their columns read as 0 in fitting, so their weights are 0 and the network never
            reads them.
        online_rate: the online step's learning rate, shipped in the weights (0: no online step).
        online: the draft-level weights the online step moves, by name or pattern over
            :data:`~hvd_agents.policy.features.DRAFT_FEATURES`.
        shared_rate: the online step's rate on the offset every session shares (0: none).
        online_weighting: how a draft's labelled positions weigh in the online step
            (:data:`~hvd_agents.policy.payoff.WEIGHTINGS`).
        online_next_label: the online step labels the proposal's position after a cut draft accepted whole
            (:class:`~hvd_agents.policy.payoff.OnlineStep`'s ``next_label``).
        balance: how the logistic fit weighs the labelled positions (:data:`BALANCES`): ``"none"`` each the
            same, ``"conversation"`` each conversation's positions together as much as any other conversation's
            (a long conversation no longer outweighs many short ones). The network's fit is not weighted, so a
            balance other than ``"none"`` needs ``hidden=0``.
        text_l2: the ridge on the text columns' weights when the logistic hazard reads the draft's text too
            (:attr:`~hvd_agents.policy.payoff.PayoffWeights.text_weights`; the step records must carry their
            text); None: it reads none. The text serves the logistic hazard only where there is no network, so
            it needs ``hidden=0``.
    """

    l2: float = 1.0
    hidden: int = 64
    epochs: int = 30
    seed: int = 0
    held_out: float = 0.2
    drop: tuple[str, ...] = ()
    online_rate: float = DEFAULT_ONLINE_RATE
    online: tuple[str, ...] = field(default=DEFAULT_ONLINE)
    shared_rate: float = 0.0
    online_weighting: str = "draft"
    online_next_label: bool = False
    balance: str = "none"
    text_l2: float | None = None

    def __post_init__(self) -> None:
        if self.text_l2 is not None and (self.hidden > 0 or self.text_l2 < 0):
            raise InvalidRequestError(f"text_l2 fits text weights into the logistic hazard, which serves drafts whose "
                                      f"text is known only without a network: it needs hidden=0 (--hidden 0) and "
                                      f"a ridge >= 0, got hidden={self.hidden} and text_l2={self.text_l2}")
        if self.balance not in BALANCES:
            raise InvalidRequestError(f"balance is one of {BALANCES}, got {self.balance!r}")
        if self.balance != "none" and self.hidden > 0:
            raise InvalidRequestError(f"balance {self.balance!r} weighs the logistic fit only: it needs hidden=0 "
                                      f"(--hidden 0), got hidden={self.hidden}")
        if self.online_weighting not in WEIGHTINGS:
            raise InvalidRequestError(f"online_weighting is one of {WEIGHTINGS}, got {self.online_weighting!r}")
        if not 0.0 <= self.held_out < 1.0:
            raise InvalidRequestError(f"held_out must be in [0, 1), got {self.held_out}")
        if self.hidden < 0 or self.epochs < 1:
            raise InvalidRequestError(f"hidden must be >= 0 and epochs >= 1, got {self.hidden} and {self.epochs}")
        if min(self.l2, self.online_rate, self.shared_rate) < 0:
            raise InvalidRequestError(f"l2, online_rate and shared_rate must be >= 0, got {self.l2}, "
                                      f"{self.online_rate} and {self.shared_rate}")
        matching(self.drop, MLP_INPUTS, "drop")
        matching(self.online, DRAFT_FEATURES, "online")

    def to_dict(self) -> dict[str, Any]:
        return {"l2": self.l2, "hidden": self.hidden, "epochs": self.epochs, "seed": self.seed,
                "held_out": self.held_out, "drop": list(self.drop), "online_rate": self.online_rate,
                "online": list(self.online), "shared_rate": self.shared_rate,
                "online_weighting": self.online_weighting, "online_next_label": self.online_next_label,
                "balance": self.balance, "text_l2": self.text_l2}


def matching(patterns: Sequence[str], names: Sequence[str], what: str) -> np.ndarray:
    """``[len(names)]`` True where a name matches one of ``patterns`` (names or ``fnmatch`` patterns).

    Raises:
        InvalidRequestError: a pattern that matches no name (a misspelt input is an error, not a no-op).
    """
    mask = np.zeros(len(names), dtype=bool)
    for pattern in patterns:
        hits = np.array([fnmatch.fnmatchcase(name, pattern) for name in names], dtype=bool)
        if not hits.any():
            close = ", ".join(names[:8])
            raise InvalidRequestError(f"{what}: {pattern!r} names no input (inputs are {close}, ...)")
        mask |= hits
    return mask


def read_samples(paths: Sequence[str | os.PathLike]) -> list[DraftSample]:
    """Drafted steps from step-record JSONL files.

    Raises:
        HVDError: a file cannot be read, or a line is not a step record or
            names an unknown feature (the message names the file and line).
    """
    samples: list[DraftSample] = []
    for path in paths:
        try:
            handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed by the `with` below; opened here to name the path)
        except OSError as exc:
            raise HVDError(f"cannot read step records {path}: {exc}") from exc
        with handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    sample = record_sample(json.loads(line) if _is_json(line) else None, f"{path}:{number}")
                    if sample is not None:
                        samples.append(sample)
    return samples


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def record_sample(record: Any, where: str) -> DraftSample | None:
    """A step record (``analyze --steps`` / ``--proposals``, as a dict) as a sample; None for an undrafted step.

    Raises:
        HVDError: not a step record, or bad values (the message starts with ``where``).
    """
    if not isinstance(record, dict) or not isinstance(record.get("features"), dict):
        raise HVDError(f"{where}: not a step record (a JSON object with drafted, accepted, features)")
    try:
        drafted, accepted = int(record["drafted"]), int(record["accepted"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HVDError(f"{where}: drafted/accepted missing or not integers") from exc
    if drafted <= 0:
        return None
    if not 0 <= accepted <= drafted:
        raise HVDError(f"{where}: accepted={accepted} outside [0, drafted={drafted}]")
    try:
        features = CacheDraftFeatures.from_record(record["features"])
    except FeatureRecordError as exc:
        raise HVDError(f"{where}: {exc}") from exc
    group = f"{record.get('policy', '')}/{record.get('conversation', record.get('req_id', ''))}"
    return DraftSample(features, drafted, accepted, group)


def split(samples: Iterable[DraftSample], held_out: float) -> tuple[list[DraftSample], list[DraftSample]]:
    """Train / held-out split by a stable hash of each sample's conversation."""
    train, test = [], []
    for sample in samples:
        bucket = int(hashlib.sha1(sample.group.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (test if bucket < held_out else train).append(sample)
    return train, test


def labelled_rows(samples: Iterable[DraftSample]) -> tuple[np.ndarray, np.ndarray]:
    """Feature rows ``[n, F]`` and hazard labels ``[n]`` of every observed position."""
    rows: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for sample in samples:
        observed = min(sample.accepted + 1, sample.drafted)
        rows.append(feature_matrix(sample.features, observed))
        labels.append((np.arange(observed) < sample.accepted).astype(np.float64))
    if not rows:
        return np.zeros((0, NUM_FEATURES)), np.zeros(0)
    return np.concatenate(rows), np.concatenate(labels)


def labelled_text_rows(samples: Iterable[DraftSample]) -> np.ndarray:
    """The text columns ``[n, T]`` of the positions :func:`labelled_rows` labels, in its order (every sample's
    features must carry their text)."""
    rows = []
    for sample in samples:
        if not len(sample.features.text):
            raise InvalidRequestError(f"a step record of {sample.group} carries no text classes")
        rows.append(text_columns(sample.features.text, min(sample.accepted + 1, sample.drafted)))
    return np.concatenate(rows) if rows else np.zeros((0, 0))


def fit_network(samples: Sequence[DraftSample], hidden: int = 64, epochs: int = 30, seed: int = 0,
                drop: Sequence[str] = ()) -> HazardMLP:
    """Fit the hazard network on every observed position of ``samples`` (which must carry their text); the
    inputs ``drop`` names (see :class:`FitSettings`) read as 0, so the network never reads them.

    Raises:
        InvalidRequestError: no drafted step, a sample without text classes, or a ``drop`` that names no input.
    """
    rows, y = labelled_inputs(samples, drop)
    return fit_hazard_mlp(rows, y, hidden=hidden, epochs=epochs, seed=seed)


def labelled_inputs(samples: Sequence[DraftSample], drop: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``[n, F + T]`` of :data:`~hvd_agents.policy.hazard_mlp.MLP_INPUTS` (features, then text columns) of
    every observed position and their hazard labels ``[n]``; the inputs ``drop`` names read as 0 (constant: a fit
    gives them no weight).

    Raises:
        InvalidRequestError: no drafted step, a sample without text classes, or a ``drop`` that names no input.
    """
    x, y = labelled_rows(samples)  # [n, F], [n]
    if len(y) == 0:
        raise InvalidRequestError("no drafted steps to train on")
    rows = np.concatenate([x, labelled_text_rows(samples)], axis=1)  # [n, F + T]
    rows[:, matching(drop, MLP_INPUTS, "drop")] = 0.0
    return rows, y


def row_weights(samples: Sequence[DraftSample], balance: str = "none") -> np.ndarray:
    """The weight of each position :func:`labelled_rows` labels, in its order, with mean 1 (see
    :class:`FitSettings`'s ``balance``)."""
    counts = [min(sample.accepted + 1, sample.drafted) for sample in samples]
    if balance == "none" or not samples:
        return np.ones(sum(counts))
    per_group: dict[str, int] = {}
    for sample, count in zip(samples, counts):
        per_group[sample.group] = per_group.get(sample.group, 0) + count
    weights = np.concatenate([np.full(count, 1.0 / per_group[sample.group]) for sample, count in zip(samples, counts)])
    return weights * (len(weights) / weights.sum())


def fit(samples: Sequence[DraftSample], l2: float = 1.0, iterations: int = 25, drop: Sequence[str] = (),
        balance: str = "none") -> np.ndarray:
    """Fit the hazard weights (``[F]``) by IRLS; ``l2`` is the ridge penalty (the bias is not penalised); the
    features ``drop`` names get weight 0; ``balance`` weighs the positions (:func:`row_weights`).

    Raises:
        InvalidRequestError: no drafted step to learn from, or a ``drop`` that names no input.
    """
    x, y = labelled_rows(samples)  # [n, F], [n]
    if len(y) == 0:
        raise InvalidRequestError("no drafted steps to train on")
    x[:, matching(drop, MLP_INPUTS, "drop")[:NUM_FEATURES]] = 0.0
    penalty = np.full(NUM_FEATURES, l2)
    penalty[FEATURE_NAMES.index("bias")] = 0.0
    return _irls(x, y, row_weights(samples, balance), penalty, iterations)


def fit_text(samples: Sequence[DraftSample], l2: float = 1.0, text_l2: float = 1.0, iterations: int = 25,
             drop: Sequence[str] = (), balance: str = "none") -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit` with the text columns beside the features (every sample must carry its text): the hazard
    weights ``[F]`` and the text columns' ``[T]``, whose ridge is ``text_l2``; the inputs ``drop`` names (features
    or text columns) get weight 0.

    Raises:
        InvalidRequestError: no drafted step, a sample without text classes, or a ``drop`` that names no input.
    """
    rows, y = labelled_inputs(samples, drop)
    penalty = np.concatenate([np.full(NUM_FEATURES, l2), np.full(rows.shape[1] - NUM_FEATURES, text_l2)])
    penalty[FEATURE_NAMES.index("bias")] = 0.0
    w = _irls(rows, y, row_weights(samples, balance), penalty, iterations)
    return w[:NUM_FEATURES], w[NUM_FEATURES:]


def _irls(x: np.ndarray, y: np.ndarray, r: np.ndarray, penalty: np.ndarray, iterations: int) -> np.ndarray:
    """Ridge-penalised logistic regression of ``y`` ``[n]`` on ``x`` ``[n, D]``, rows weighted by ``r``, by IRLS."""
    w = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))  # [n]
        grad = x.T @ (r * (y - p)) - penalty * w  # [D]
        hess = (x * (r * p * (1 - p))[:, None]).T @ x + np.diag(penalty) + 1e-9 * np.eye(len(w))  # [D, D]
        step = np.linalg.solve(hess, grad)
        w += step
        if np.max(np.abs(step)) < 1e-6:
            break
    return w


def evaluate(predictor: PayoffPredictor, samples: Sequence[DraftSample], train: Sequence[DraftSample]) -> Evaluation:
    """MAE and rank correlation of the expected accepted length, vs a per-position-rate baseline."""
    if not samples:
        return Evaluation(0, float("nan"), float("nan"), float("nan"), float("nan"))
    actual = np.array([s.accepted for s in samples], dtype=np.float64)
    predicted = np.array([predictor.expected_accepted(s.features, s.drafted) for s in samples])
    survival = _position_survival(train, max(s.drafted for s in samples))
    baseline = np.array([survival[: s.drafted].sum() for s in samples])
    return Evaluation(
        len(samples),
        float(np.mean(np.abs(predicted - actual))),
        spearman(predicted, actual),
        float(np.mean(np.abs(baseline - actual))),
        spearman(baseline, actual),
    )


def _position_survival(samples: Sequence[DraftSample], length: int) -> np.ndarray:
    """Per-position survival from plain acceptance counts (the featureless baseline)."""
    accepted = np.zeros(length)
    seen = np.zeros(length)
    for sample in samples:
        observed = min(sample.accepted + 1, sample.drafted, length)
        seen[:observed] += 1
        accepted[: min(sample.accepted, length)] += 1
    hazard = np.where(seen > 0, (accepted + 1) / (seen + 2), 0.5)
    return np.cumprod(hazard)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); nan when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end - 1) / 2.0
            start = end
    return ranks


def fit_payoff(samples: Sequence[DraftSample], settings: FitSettings | None = None,
               sources: Sequence[str] = ()) -> tuple[PayoffWeights, Evaluation]:
    """Fit weights on ``samples`` with ``settings``, evaluated on their held-out conversations.

    The logistic weights are always fitted; the hazard network too when ``settings.hidden > 0`` and every sample
    carries its draft's text classes (else there is none, and ``meta["network"]`` says why). ``meta`` records
    the sources, sample counts, the settings (the online step's among them: the predictor reads
    ``meta["online"]``) and the held-out evaluation of the result (``held_out``) and of the logistic weights
    alone (``held_out_logistic``). Returns the weights and the evaluation of what they predict with.

    Raises:
        InvalidRequestError: nothing to train on.
    """
    settings = settings or FitSettings()
    train, test = split(samples, settings.held_out)
    weights = fit(train, l2=settings.l2, drop=settings.drop, balance=settings.balance)
    text_weights = None
    if settings.text_l2 is not None:
        if not all(len(sample.features.text) for sample in samples):
            raise InvalidRequestError("text_l2 fits the logistic hazard on the drafts' text, and the step records "
                                      "carry no text classes (replay with a tokenizer)")
        weights, text_weights = fit_text(train, l2=settings.l2, text_l2=settings.text_l2, drop=settings.drop,
                                         balance=settings.balance)
    meta: dict[str, Any] = {
        "sources": list(sources),
        "train_drafts": len(train),
        "held_out_drafts": len(test),
        "l2": settings.l2,
        "settings": settings.to_dict(),
        "online": {"learning_rate": settings.online_rate, "moves": list(settings.online),
                   "shared_rate": settings.shared_rate, "weighting": settings.online_weighting,
                   "next_label": settings.online_next_label},
    }
    logistic = evaluate(PayoffPredictor(PayoffWeights(weights, text_weights=text_weights), learning_rate=0.0),
                        test, train)
    network = None
    if settings.hidden == 0:
        meta["network"] = "none: --hidden 0"
    elif not all(len(sample.features.text) for sample in samples):
        meta["network"] = "none: the step records carry no text classes (replay with a tokenizer)"
    else:
        network = fit_network(train, hidden=settings.hidden, epochs=settings.epochs, seed=settings.seed,
                              drop=settings.drop)
        meta["network"] = {"hidden": settings.hidden, "epochs": settings.epochs, "seed": settings.seed}
    result = PayoffWeights(weights, meta, network, text_weights)
    evaluation = evaluate(PayoffPredictor(result, learning_rate=0.0), test, train) if network else logistic
    meta |= {"held_out": evaluation.to_dict(), "held_out_logistic": logistic.to_dict()}
    return PayoffWeights(weights, meta, network, text_weights), evaluation


def train_payoff(
    paths: Sequence[str | os.PathLike], output: str | os.PathLike, *, held_out: float = 0.2, l2: float = 1.0,
    hidden: int = 64, epochs: int = 30, seed: int = 0, settings: FitSettings | None = None,
) -> tuple[PayoffWeights, Evaluation]:
    """Fit weights on the step records in ``paths`` (:func:`fit_payoff`) and save them to ``output``.

    ``settings`` gives every option at once; without it, ``held_out``, ``l2``, ``hidden``, ``epochs`` and
    ``seed`` with the other settings' defaults. Returns the evaluation of what is saved.

    Raises:
        HVDError: unreadable or malformed records, or nothing to train on.
        InvalidRequestError: ``held_out`` outside [0, 1), or ``hidden`` or ``epochs`` < 0 / < 1.
    """
    if settings is None:
        settings = FitSettings(l2=l2, hidden=hidden, epochs=epochs, seed=seed, held_out=held_out)
    result, evaluation = fit_payoff(read_samples(paths), settings, [Path(p).name for p in paths])
    result.save(output)
    return result, evaluation
