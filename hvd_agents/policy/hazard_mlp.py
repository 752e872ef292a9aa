"""The payoff predictor's hazard as a small network over the feature rows and the draft's text.

The logistic hazard (:mod:`hvd_agents.policy.payoff`) weighs each feature the
same everywhere. Where a copied draft breaks off depends on combinations: a long
match is safe in the middle of a copied observation and not at the opening quote
of an argument's value (:mod:`hvd_agents.policy.token_text`). :class:`HazardMLP`
is one hidden layer of ``tanh`` units over the standardized feature row
(:data:`~hvd_agents.policy.features.FEATURE_NAMES`) and the position's text
columns (:data:`~hvd_agents.policy.token_text.TEXT_COLUMNS`), giving the hazard's
logit; fitted offline (:func:`fit_hazard_mlp`, by ``hvd-agents train-payoff``) and
shipped in the predictor's weights file beside the logistic weights.

Inputs that never varied in the training rows (the target's signal, absent from
trace replays) get zero weight: the network reads them as their training value
whatever they are at run time.

Worked example: an ``[L, 105]`` input is standardized by ``mu`` and ``sd``,
multiplied by ``w1`` (``[105, H]``), put through ``tanh`` and dotted with ``w2``;
``b1`` and ``b2`` are the biases. The standardization is folded into ``w1`` and
``b1`` once, so a prediction is two small products.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvd_agents.policy.features import FEATURE_NAMES
from hvd_agents.policy.token_text import TEXT_COLUMNS

MLP_INPUTS: tuple[str, ...] = FEATURE_NAMES + TEXT_COLUMNS
"""The network's input columns, in order: the feature row, then the text columns."""
_CONSTANT = 1e-9  # a column whose standard deviation in training is below this never varied


class HazardMLPError(ValueError):
    """A hazard network's document is malformed or made for other inputs."""


@dataclass(frozen=True, eq=False)
class HazardMLP:
    """One hidden layer of ``tanh`` units giving the hazard's logit (see the module docstring).

    Attributes:
        mu, sd: ``[D]`` the training rows' mean and standard deviation of each input.
        w1: ``[D, H]``, b1: ``[H]``, w2: ``[H]``, b2: the layers' weights.
    """

    mu: np.ndarray
    sd: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: float
    _folded: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        d = len(MLP_INPUTS)
        arrays = {name: np.asarray(getattr(self, name), dtype=np.float64) for name in ("mu", "sd", "w1", "b1", "w2")}
        h = arrays["b1"].shape[0] if arrays["b1"].ndim == 1 else -1
        shapes = {"mu": (d,), "sd": (d,), "w1": (d, h), "b1": (h,), "w2": (h,)}
        for name, array in arrays.items():
            if array.shape != shapes[name] or h <= 0:
                raise HazardMLPError(f"{name} must have shape {shapes[name]} for {d} inputs, got {array.shape}")
            if not np.all(np.isfinite(array)):
                raise HazardMLPError(f"{name} must be finite")
            object.__setattr__(self, name, array)
        if not np.isfinite(self.b2):
            raise HazardMLPError("b2 must be finite")
        if np.any(arrays["sd"] <= 0):
            raise HazardMLPError("sd must be > 0")
        w1 = arrays["w1"] / arrays["sd"][:, None]  # [D, H]
        object.__setattr__(self, "_folded", (w1, arrays["b1"] - (arrays["mu"] / arrays["sd"]) @ arrays["w1"]))

    @property
    def hidden(self) -> int:
        return len(self.b1)

    def logits(self, rows: np.ndarray) -> np.ndarray:
        """``[L]``: the hazard's logit for each input row (``rows``: ``[L, D]``, :data:`MLP_INPUTS`)."""
        w1, b1 = self._folded
        return np.tanh(rows @ w1 + b1) @ self.w2 + self.b2

    def to_document(self) -> dict[str, Any]:
        return {"inputs": list(MLP_INPUTS), "mu": self.mu.tolist(), "sd": self.sd.tolist(), "w1": self.w1.tolist(),
                "b1": self.b1.tolist(), "w2": self.w2.tolist(), "b2": float(self.b2)}

    @classmethod
    def from_document(cls, document: Any, origin: str = "<document>") -> HazardMLP:
        """Read :meth:`to_document`'s output.

        Raises:
            HazardMLPError: not such a document, other inputs than :data:`MLP_INPUTS`, or bad shapes or values.
        """
        if not isinstance(document, Mapping):
            raise HazardMLPError(f"{origin}: the hazard network must be an object")
        if list(document.get("inputs", ())) != list(MLP_INPUTS):
            raise HazardMLPError(f"{origin}: the hazard network's inputs do not match this version's")
        try:
            return cls(*(np.array(document[name], dtype=np.float64) for name in ("mu", "sd", "w1", "b1", "w2")),
                       float(document["b2"]))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, HazardMLPError):
                raise HazardMLPError(f"{origin}: {exc}") from exc
            raise HazardMLPError(f"{origin}: malformed hazard network: {exc}") from exc


def fit_hazard_mlp(rows: np.ndarray, labels: np.ndarray, *, hidden: int = 64, epochs: int = 30, seed: int = 0,
                   l2: float = 1e-4, learning_rate: float = 3e-3, batch: int = 512) -> HazardMLP:
    """Fit a :class:`HazardMLP` to hazard labels by Adam on the log-loss (deterministic for a ``seed``).

    Args:
        rows: ``[n, D]`` input rows (:data:`MLP_INPUTS`).
        labels: ``[n]`` 1 where the position was accepted, 0 where it was the first rejected one.
        hidden: hidden units.
        epochs: passes over the rows, each in a fresh random order.
        l2: weight decay on ``w1`` and ``w2``.
        learning_rate, batch: Adam's step size and the rows per step.

    Raises:
        ValueError: no rows, or shapes that do not match.
    """
    rows = np.asarray(rows, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != len(MLP_INPUTS) or len(rows) != len(labels) or len(rows) == 0:
        raise ValueError(f"need [n, {len(MLP_INPUTS)}] rows and [n] labels with n > 0, got {rows.shape} and "
                         f"{labels.shape}")
    if hidden < 1 or epochs < 1:
        raise ValueError(f"hidden and epochs must be >= 1, got {hidden} and {epochs}")
    mu, sd = rows.mean(axis=0), rows.std(axis=0)  # [D]
    constant = sd < _CONSTANT
    sd = np.where(constant, 1.0, sd)
    x = (rows - mu) / sd  # [n, D]
    x[:, constant] = 0.0
    rng = np.random.default_rng(seed)
    params = [rng.normal(0.0, 1.0 / np.sqrt(x.shape[1]), (x.shape[1], hidden)), np.zeros(hidden),
              rng.normal(0.0, 1.0 / np.sqrt(hidden), hidden), np.zeros(1)]
    params[0][constant] = 0.0
    first, second = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            chosen = order[start : start + batch]
            xb, yb = x[chosen], labels[chosen]  # [b, D], [b]
            h = np.tanh(xb @ params[0] + params[1])  # [b, H]
            p = 1.0 / (1.0 + np.exp(-np.clip(h @ params[2] + params[3][0], -30, 30)))  # [b]
            dz = (p - yb) / len(chosen)  # [b]
            dh = np.outer(dz, params[2]) * (1.0 - h * h)  # [b, H]
            grads = [xb.T @ dh + l2 * params[0], dh.sum(axis=0), h.T @ dz + l2 * params[2], np.array([dz.sum()])]
            grads[0][constant] = 0.0
            step += 1
            for i, grad in enumerate(grads):
                first[i] = 0.9 * first[i] + 0.1 * grad
                second[i] = 0.999 * second[i] + 0.001 * grad * grad
                corrected = first[i] / (1 - 0.9**step)
                params[i] -= learning_rate * corrected / (np.sqrt(second[i] / (1 - 0.999**step)) + 1e-8)
    return HazardMLP(mu, sd, params[0], params[1], params[2], float(params[3][0]))
