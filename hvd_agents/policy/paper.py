"""The HVD paper's payoff predictor: an MLP that predicts a cache draft's accepted length.

The paper's rule (method ``hvd-paper``): predict the accepted length of the cache
draft from cheap pre-verification features with a small MLP (two hidden layers of
256 ReLU units), trained offline on replayed traces; verify the cache draft when the
prediction exceeds a threshold (6 tokens), else ask the model drafter.

Its inputs (:class:`PaperFeatures`, :data:`PAPER_FEATURES`): the suffix-match score,
the match length and the draft length, the position in the output, the request's
rolling acceptance history (last and moving-average accepted fractions, whether the
last draft was accepted whole, whether there is any history), and punctuation and
bracket flags of the last context token and of the draft's first token
(:class:`TokenClasses`, read once off the tokenizer's vocabulary).

The network (:class:`PaperMLP`) regresses the accepted length of the whole draft
(mean squared error, Adam), on standardised inputs; :func:`fit_mlp` trains it and
:class:`PaperMLP` saves and loads it as JSON with base64 float16 arrays
(``weights/paper.json`` ships with the package, made by ``hvd-agents train-payoff
--paper``). NumPy only.

Worked example: a draft of 16 tokens whose 20-token match came from an earlier
identical tool call, with the last draft accepted whole, predicts about 14 accepted
tokens: above 6, so the whole draft is verified; a 2-token match at the start of a
free-text reply predicts under 1: the model drafter is asked instead.
"""

from __future__ import annotations

import base64
import json
import math
import os
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hvd_agents.errors import HVDError
from hvd_agents.policy.features import CacheDraftFeatures

PAPER_FEATURES: tuple[str, ...] = (
    "log_score", "log_match", "log_draft_len", "log_out_pos",
    "last_frac", "ema_frac", "last_full", "no_history",
    "prev_punct", "prev_bracket", "first_punct", "first_bracket",
)
FLAG_NAMES: tuple[str, ...] = ("prev_punct", "prev_bracket", "first_punct", "first_bracket")
PAPER_WEIGHTS = "paper.json"
PAPER_THRESHOLD = 6.0  # the paper's rule: verify the cache draft iff its predicted accepted length exceeds this
HIDDEN = 256
_BRACKETS = frozenset("()[]{}<>")


class PaperWeightsError(HVDError, ValueError):
    """A paper-predictor weights file is missing, malformed or made for other features."""


@dataclass(frozen=True)
class TokenClasses:
    """The token ids whose text holds punctuation, and those whose text holds a bracket.

    Example:
        >>> classes = TokenClasses(frozenset({5}), frozenset({5, 7}))
        >>> classes.flags(5, 7)
        (1.0, 1.0, 0.0, 1.0)
    """

    punct: frozenset[int] = frozenset()
    brackets: frozenset[int] = frozenset()

    @classmethod
    def from_decoder(cls, decode: Callable[[int], str], vocab_size: int) -> TokenClasses:
        """Classes of ids ``0..vocab_size-1`` by their decoded text."""
        punct, brackets = set(), set()
        for token in range(vocab_size):
            text = decode(token)
            if any(ch in _BRACKETS for ch in text):
                brackets.add(token)
            if any(unicodedata.category(ch).startswith("P") for ch in text):
                punct.add(token)
        return cls(frozenset(punct), frozenset(brackets))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenClasses:
        """Classes read off a Hugging Face style tokenizer (``decode`` and ``len``); empty when it has none."""
        if tokenizer is None or not hasattr(tokenizer, "decode"):
            return cls()
        try:
            size = len(tokenizer)
        except TypeError:
            return cls()
        return cls.from_decoder(lambda t: tokenizer.decode([t]), size)

    def flags(self, prev_token: int | None, first_token: int | None) -> tuple[float, float, float, float]:
        """``(prev_punct, prev_bracket, first_punct, first_bracket)`` as 0/1."""
        return (float(prev_token in self.punct), float(prev_token in self.brackets),
                float(first_token in self.punct), float(first_token in self.brackets))


@dataclass(frozen=True)
class PaperFeatures:
    """The paper's inputs for one cache draft."""

    score: float
    match_len: int
    draft_len: int
    out_pos: int
    last_frac: float
    ema_frac: float
    last_full: bool
    no_history: bool
    flags: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @classmethod
    def of(cls, features: CacheDraftFeatures, score: float, draft_len: int,
           flags: Sequence[float] = (0.0, 0.0, 0.0, 0.0)) -> PaperFeatures:
        """From the cache drafter's features, its draft's score and length, and the token flags."""
        history = features.history
        return cls(float(score), features.match_len, draft_len, features.out_pos, history.last_frac,
                   history.ema_frac, history.last_full, history.drafts == 0,
                   tuple(float(f) for f in flags))  # type: ignore[arg-type]

    def row(self) -> np.ndarray:
        """``[len(PAPER_FEATURES)]`` inputs, in that order."""
        return np.array([math.log1p(max(self.score, 0.0)), math.log1p(self.match_len), math.log1p(self.draft_len),
                         math.log1p(self.out_pos), self.last_frac, self.ema_frac, float(self.last_full),
                         float(self.no_history), *self.flags])


@dataclass
class PaperMLP:
    """Inputs -> 256 ReLU -> 256 ReLU -> predicted accepted length (clipped at 0).

    Attributes:
        mean, std: ``[F]`` input standardisation.
        w1 ``[F, H]``, b1 ``[H]``, w2 ``[H, H]``, b2 ``[H]``, w3 ``[H]``, b3 ``[]``: the layers.
        meta: where the weights came from (sources, sample counts, held-out figures).
    """

    mean: np.ndarray
    std: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    w3: np.ndarray
    b3: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    ARRAYS = ("mean", "std", "w1", "b1", "w2", "b2", "w3", "b3")

    @classmethod
    def init(cls, inputs: int, rng: np.random.Generator, hidden: int = HIDDEN) -> PaperMLP:
        """He-initialised weights, identity standardisation."""
        def he(n_in: int, n_out: int) -> np.ndarray:
            return rng.normal(0.0, math.sqrt(2.0 / n_in), (n_in, n_out))

        return cls(np.zeros(inputs), np.ones(inputs), he(inputs, hidden), np.zeros(hidden), he(hidden, hidden),
                   np.zeros(hidden), rng.normal(0.0, math.sqrt(1.0 / hidden), hidden), np.zeros(()))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """Raw outputs ``[n]`` for inputs ``[n, F]``, and the activations backprop needs."""
        z = (x - self.mean) / self.std  # [n, F]
        h1 = np.maximum(z @ self.w1 + self.b1, 0.0)  # [n, H]
        h2 = np.maximum(h1 @ self.w2 + self.b2, 0.0)  # [n, H]
        return h2 @ self.w3 + self.b3, (z, h1, h2)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted accepted lengths ``[n]`` for inputs ``[n, F]``."""
        return np.maximum(self.forward(x)[0], 0.0)

    def predict_one(self, features: PaperFeatures) -> float:
        """The predicted accepted length of one draft."""
        return float(self.predict(features.row()[None, :])[0])

    def save(self, path: str | os.PathLike) -> None:
        """Write as JSON (float16 arrays in base64: half the size, and the predictions move by far less than a
        token), atomically."""
        arrays = {name: {"shape": list(np.shape(getattr(self, name))),
                         "data": base64.b64encode(np.asarray(getattr(self, name), np.float16).tobytes()).decode()}
                  for name in self.ARRAYS}
        document = {"features": list(PAPER_FEATURES), "arrays": arrays, "meta": self.meta}
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(document) + "\n", encoding="utf-8")
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PaperMLP:
        """Read weights written by :meth:`save`.

        Raises:
            PaperWeightsError: unreadable, malformed, or made for other features.
        """
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PaperWeightsError(f"cannot read paper-predictor weights {path}: {exc}") from exc
        return cls.from_document(document, str(path))

    @classmethod
    def from_document(cls, document: Any, origin: str) -> PaperMLP:
        if not isinstance(document, dict) or document.get("features") != list(PAPER_FEATURES):
            raise PaperWeightsError(f"{origin}: not paper-predictor weights for features {list(PAPER_FEATURES)}")
        try:
            arrays = {name: np.frombuffer(base64.b64decode(spec["data"]), np.float16).astype(np.float64)
                      .reshape(spec["shape"]) for name, spec in ((n, document["arrays"][n]) for n in cls.ARRAYS)}
        except (KeyError, TypeError, ValueError) as exc:
            raise PaperWeightsError(f"{origin}: malformed arrays: {exc}") from exc
        mlp = cls(**arrays, meta=dict(document.get("meta", {})))
        if mlp.w1.shape[0] != len(PAPER_FEATURES) or mlp.w2.shape != (mlp.w1.shape[1],) * 2:
            raise PaperWeightsError(f"{origin}: layer shapes do not fit together")
        return mlp

    @classmethod
    def default(cls) -> PaperMLP:
        """The weights shipped with the package (``weights/paper.json``)."""
        text = resources.files("hvd_agents.policy").joinpath("weights", PAPER_WEIGHTS).read_text(encoding="utf-8")
        return cls.from_document(json.loads(text), f"hvd_agents/policy/weights/{PAPER_WEIGHTS}")


def fit_mlp(x: np.ndarray, y: np.ndarray, *, epochs: int = 30, batch: int = 256, lr: float = 1e-3,
            seed: int = 0, hidden: int = HIDDEN) -> PaperMLP:
    """Train the MLP on inputs ``[n, F]`` and accepted lengths ``[n]`` (MSE, Adam, minibatches).

    Raises:
        ValueError: no samples.
    """
    if len(y) == 0:
        raise ValueError("no drafts to train on")
    rng = np.random.default_rng(seed)
    mlp = PaperMLP.init(x.shape[1], rng, hidden)
    mlp.mean, mlp.std = x.mean(axis=0), np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
    mlp.b3 = np.array(float(y.mean()))
    names = ("w1", "b1", "w2", "b2", "w3", "b3")
    moments = {n: (np.zeros_like(getattr(mlp, n)), np.zeros_like(getattr(mlp, n))) for n in names}
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch):
            idx = order[start : start + batch]
            grads = _gradients(mlp, x[idx], y[idx])
            step += 1
            for name in names:
                m, v = moments[name]
                g = grads[name]
                m *= 0.9
                m += 0.1 * g
                v *= 0.999
                v += 0.001 * g * g
                update = lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
                setattr(mlp, name, getattr(mlp, name) - update)
    return mlp


def _gradients(mlp: PaperMLP, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the mean squared error over one minibatch."""
    out, (z, h1, h2) = mlp.forward(x)
    d_out = 2.0 * (out - y) / len(y)  # [n]
    d_h2 = np.outer(d_out, mlp.w3) * (h2 > 0)  # [n, H]
    d_h1 = (d_h2 @ mlp.w2.T) * (h1 > 0)  # [n, H]
    return {"w3": h2.T @ d_out, "b3": np.array(d_out.sum()), "w2": h1.T @ d_h2, "b2": d_h2.sum(axis=0),
            "w1": z.T @ d_h1, "b1": d_h1.sum(axis=0)}


@dataclass(frozen=True)
class ThresholdQuality:
    """How well predictions find high-payoff drafts (accepted >= threshold) at a threshold.

    ``flagged`` counts drafts predicted above the threshold (the paper's rule verifies those).
    """

    drafts: int
    high: int
    flagged: int
    hits: int

    @property
    def precision(self) -> float:
        return self.hits / self.flagged if self.flagged else float("nan")

    @property
    def recall(self) -> float:
        return self.hits / self.high if self.high else float("nan")

    @classmethod
    def of(cls, predicted: np.ndarray, actual: np.ndarray, threshold: float) -> ThresholdQuality:
        high, flagged = actual >= threshold, predicted > threshold
        return cls(len(actual), int(high.sum()), int(flagged.sum()), int((high & flagged).sum()))
