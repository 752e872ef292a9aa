"""The payoff predictor: a cache draft's accepted length, predicted before verification.

Model: a logistic hazard over draft positions. For position ``i`` (0-based),
``h_i = sigmoid(w . x_i)`` estimates ``P(token i accepted | tokens 0..i-1
accepted)`` from the feature row ``x_i`` (:mod:`hvd_agents.policy.features`).
The probability that the first ``i + 1`` tokens are all accepted is the survival
``S_i = h_0 * ... * h_i``, so the expected accepted length of the draft cut to
``L`` tokens is ``S_0 + ... + S_{L-1}``: one prediction serves every truncation.

Where the drafter knows the draft's text (:mod:`hvd_agents.policy.token_text`: the
classes of the tokens around each position) and the weights file ships a hazard
network (:mod:`hvd_agents.policy.hazard_mlp`), the network gives the logit instead
of ``w . x_i``, from the same feature row and the text columns; the logistic
weights serve drafts whose text is not known. Without a network, weights fitted with
the text (``FitSettings.text_l2``) add ``t . text_i`` to the logistic logit where the
text is known: one weight per text column, the same for every kind of agent.

Weights start from offline-trained defaults shipped in the package
(``weights/default.json``, fitted by ``hvd-agents train-payoff``) and are adapted
online per session: after each verification, one stochastic-gradient step on the
positions the outcome labels (accepted positions are 1, the first rejected one 0,
later ones are unobserved) updates a per-session offset added to the shared
weights. How fast, and which draft-level weights it moves, the weights file says
(``meta["online"]``, :class:`OnlineStep`: ``learning_rate`` and ``moves``, names or
``fnmatch`` patterns of :data:`~hvd_agents.policy.features.DRAFT_FEATURES`; a file
without it: 0.05 and the intercepts, overall and per provenance kind). With a
``shared_rate`` above 0 the same step also moves one offset shared by every session
(the deployment's: a new kind of agent shifts every session's predictions, not only the
one that saw it). The step's ``weighting`` says whether a draft's labelled positions are
averaged (each draft weighs the same) or summed (each position does: the likelihood's
gradient); with ``next_label``, a draft the predictor cut short of its proposal and that was
accepted whole also labels the proposal's next position by the target's next token, so a
predictor that cuts too early learns it (without it, what a cut hides is never seen).
Sessions are kept in least-recently-used order up to a bound.

Worked example: weights that give ``h = [0.9, 0.5, 0.5]`` predict ``S = [0.9,
0.45, 0.225]`` and an expected accepted length of 1.575 for the whole draft, 0.9
for the draft cut to one token.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hvd_agents.errors import HVDError
from hvd_agents.policy.features import (
    DRAFT_FEATURES,
    FEATURE_NAMES,
    NUM_FEATURES,
    POSITION_FEATURES,
    CacheDraftFeatures,
    draft_row,
    feature_matrix,
    position_columns,
)
from hvd_agents.policy.hazard_mlp import HazardMLP, HazardMLPError
from hvd_agents.policy.token_text import TEXT_COLUMNS, text_columns

logger = logging.getLogger(__name__)

DEFAULT_WEIGHTS = "default.json"
NUM_POSITION_FEATURES = len(POSITION_FEATURES)
# Features added after weights files were first written: a file without them reads them as 0 (the model it was
# fitted as).
LATER_FEATURES: tuple[str, ...] = ("share", "log_seen", "split")
MAX_SESSIONS = 1024  # per-session online offsets kept (least recently used dropped)
# By default online adaptation moves only the intercepts (overall and per provenance kind): a
# session shifts how often drafts of each kind are accepted, while the shape of the
# model (how match length, branch probabilities and position matter) stays as trained.
DEFAULT_ONLINE_RATE = 0.05
DEFAULT_ONLINE: tuple[str, ...] = ("bias", "kind=*")
# How a verified draft's labelled positions weigh in the online step: "draft" (the mean residual: every draft
# weighs the same, a 1-token failure as much as a 30-token copy) or "position" (the sum: the hazard's
# log-likelihood gradient, every labelled position weighs the same).
WEIGHTINGS: tuple[str, ...] = ("draft", "position")


class PayoffWeightsError(HVDError, ValueError):
    """A payoff weights file is missing, malformed or made for other features."""


@dataclass(frozen=True)
class OnlineStep:
    """How a predictor learns from the outcomes it sees (shipped in the weights file's ``meta["online"]``).

    Attributes:
        learning_rate: step size of each session's offset (0: none).
        moves: the draft-level weights the step moves, names or ``fnmatch`` patterns.
        shared_rate: step size of the offset every session shares (0: none).
        weighting: how the labelled positions of a draft weigh (:data:`WEIGHTINGS`; a file without it: "draft").
        next_label: a draft cut short of its proposal and accepted whole also labels the proposal's next
            position, by the target's own next token (the one the step produced): without it the step never
            sees the positions the predictor cut, so a predictor that cuts too early is never told so. A file
            without it: False.

    Raises:
        PayoffWeightsError: an unknown weighting.
    """

    learning_rate: float = DEFAULT_ONLINE_RATE
    moves: tuple[str, ...] = DEFAULT_ONLINE
    shared_rate: float = 0.0
    weighting: str = "draft"
    next_label: bool = False

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise PayoffWeightsError(f"the online step's weighting is one of {WEIGHTINGS}, got {self.weighting!r}")


@dataclass(frozen=True)
class PayoffWeights:
    """Weights of the hazard model, one per feature name, and where they came from.

    Attributes:
        weights: ``[F]`` the logistic hazard's weights.
        meta: where they came from (sources, sample counts, held-out figures).
        mlp: the hazard network (:mod:`hvd_agents.policy.hazard_mlp`), used for drafts whose text is known;
            None: the logistic hazard for every draft.
        text_weights: ``[T]`` the logistic hazard's weights of the text columns
            (:data:`~hvd_agents.policy.token_text.TEXT_COLUMNS`), added where a draft's text is known and there is
            no network; None: the logistic hazard reads no text.
    """

    weights: np.ndarray  # [F]
    meta: Mapping[str, Any] = field(default_factory=dict)
    mlp: HazardMLP | None = None
    text_weights: np.ndarray | None = None  # [T]

    def __post_init__(self) -> None:
        if self.weights.shape != (NUM_FEATURES,):
            raise PayoffWeightsError(f"expected {NUM_FEATURES} weights, got shape {self.weights.shape}")
        if self.text_weights is not None:
            if np.shape(self.text_weights) != (len(TEXT_COLUMNS),):
                raise PayoffWeightsError(f"expected {len(TEXT_COLUMNS)} text weights, got shape "
                                         f"{np.shape(self.text_weights)}")
            if not np.all(np.isfinite(self.text_weights)):
                raise PayoffWeightsError("text weights must be finite")

    @classmethod
    def load(cls, path: str | os.PathLike) -> PayoffWeights:
        """Read weights written by :meth:`save`.

        Raises:
            PayoffWeightsError: the file is missing or unreadable, is not such a
                JSON document, or names other features than this version uses.
        """
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PayoffWeightsError(f"cannot read payoff weights {path}: {exc}") from exc
        return cls.from_document(document, str(path))

    @classmethod
    def from_document(cls, document: Any, origin: str = "<document>") -> PayoffWeights:
        if not isinstance(document, dict) or not isinstance(document.get("weights"), dict):
            raise PayoffWeightsError(f"{origin}: expected an object with a 'weights' object")
        named = {name: 0.0 for name in LATER_FEATURES} | document["weights"]
        if set(named) != set(FEATURE_NAMES):
            missing = sorted(set(FEATURE_NAMES) - set(named))
            extra = sorted(set(named) - set(FEATURE_NAMES))
            raise PayoffWeightsError(f"{origin}: features do not match this version (missing {missing}, extra {extra})")
        try:
            weights = np.array([float(named[name]) for name in FEATURE_NAMES])
        except (TypeError, ValueError) as exc:
            raise PayoffWeightsError(f"{origin}: a weight is not a number: {exc}") from exc
        if not np.all(np.isfinite(weights)):
            raise PayoffWeightsError(f"{origin}: weights must be finite")
        mlp = None
        if document.get("mlp") is not None:
            try:
                mlp = HazardMLP.from_document(document["mlp"], origin)
            except HazardMLPError as exc:
                raise PayoffWeightsError(str(exc)) from exc
        text_weights = None
        if document.get("text_weights") is not None:
            named = document["text_weights"]
            if not isinstance(named, dict) or set(named) != set(TEXT_COLUMNS):
                raise PayoffWeightsError(f"{origin}: 'text_weights' must name each of the {len(TEXT_COLUMNS)} text "
                                         "columns of this version once")
            try:
                text_weights = np.array([float(named[name]) for name in TEXT_COLUMNS])
            except (TypeError, ValueError) as exc:
                raise PayoffWeightsError(f"{origin}: a text weight is not a number: {exc}") from exc
        try:
            return cls(weights, dict(document.get("meta", {})), mlp, text_weights)
        except PayoffWeightsError as exc:
            raise PayoffWeightsError(f"{origin}: {exc}") from exc

    def save(self, path: str | os.PathLike) -> None:
        """Write the weights as JSON (feature name -> weight, plus ``meta``), atomically."""
        document = {"weights": dict(zip(FEATURE_NAMES, map(float, self.weights))), "meta": dict(self.meta)}
        if self.mlp is not None:
            document["mlp"] = self.mlp.to_document()
        if self.text_weights is not None:
            document["text_weights"] = dict(zip(TEXT_COLUMNS, map(float, self.text_weights)))
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(document) + "\n", encoding="utf-8")
        os.replace(tmp, target)

    @property
    def online(self) -> OnlineStep:
        """The online step these weights were chosen with (``meta["online"]``; the defaults where the file has
        none).

        Raises:
            PayoffWeightsError: ``meta["online"]`` holds values of the wrong kind.
        """
        online = self.meta.get("online")
        if not isinstance(online, Mapping):
            return OnlineStep()
        try:
            return OnlineStep(float(online.get("learning_rate", DEFAULT_ONLINE_RATE)),
                              tuple(str(m) for m in online.get("moves", DEFAULT_ONLINE)),
                              float(online.get("shared_rate", 0.0)), str(online.get("weighting", "draft")),
                              bool(online.get("next_label", False)))
        except (TypeError, ValueError) as exc:
            raise PayoffWeightsError(f"malformed online step in the weights' meta: {exc}") from exc

    @classmethod
    def default(cls) -> PayoffWeights:
        """The weights shipped with the package."""
        text = resources.files("hvd_agents.policy").joinpath("weights", DEFAULT_WEIGHTS).read_text(encoding="utf-8")
        return cls.from_document(json.loads(text), f"hvd_agents/policy/weights/{DEFAULT_WEIGHTS}")


class PayoffPredictor:
    """Predicts per-position survival of a draft; learns online per session.

    Args:
        weights: the shared (offline) weights; the packaged defaults when None.
        learning_rate: step size of each session's online update (0 disables it); given, the shared offset
            does not move. None: the weights file's online step (:attr:`PayoffWeights.online`).
        l2: pull of the per-session offsets back towards 0 at each update.

    Raises:
        PayoffWeightsError: the weights file's online step names weights that are not draft-level features.

    Example:
        >>> from hvd_agents.structure import SpanKind
        >>> predictor = PayoffPredictor()
        >>> s = predictor.survival(CacheDraftFeatures(match_len=12, kind=SpanKind.TOOL_SCHEMA), 8)
        >>> s.shape, bool(np.all(np.diff(s) <= 0))
        ((8,), True)
    """

    def __init__(self, weights: PayoffWeights | None = None, *, learning_rate: float | None = None,
                 l2: float = 0.01) -> None:
        self.weights = weights if weights is not None else PayoffWeights.default()
        online = self.weights.online
        self.learning_rate = online.learning_rate if learning_rate is None else learning_rate
        self.shared_rate = online.shared_rate if learning_rate is None else 0.0
        self.l2 = l2
        self._per_position = online.weighting == "position"
        self._next_label = online.next_label
        self._online_mask = online_mask(online.moves)  # [F]
        self._offsets: OrderedDict[str, np.ndarray] = OrderedDict()
        self._shared = np.zeros(NUM_FEATURES)  # [F] every session's offset (moves only with shared_rate > 0)

    def survival(self, features: CacheDraftFeatures, length: int, session_id: str | None = None) -> np.ndarray:
        """``S_i`` for ``i < length``: the probability that the first ``i + 1`` tokens are accepted."""
        return np.cumprod(self.hazards(features, length, session_id))  # [L]

    def hazards(self, features: CacheDraftFeatures, length: int, session_id: str | None = None) -> np.ndarray:
        """``h_i`` for ``i < length``: the probability that token ``i`` is accepted given the ones before it were
        (``survival`` is their running product)."""
        if length <= 0:
            return np.zeros(0)
        return _sigmoid(self._logits(features, length, session_id))  # [L]

    def expected_accepted(self, features: CacheDraftFeatures, length: int, session_id: str | None = None) -> float:
        """Expected accepted length of the draft cut to ``length`` tokens."""
        return float(self.survival(features, length, session_id).sum())

    def update(self, features: CacheDraftFeatures, drafted: int, accepted: int, session_id: str | None,
               hazards: np.ndarray | None = None, next_accepted: bool | None = None) -> None:
        """One online step from a verified draft of ``drafted`` tokens with ``accepted`` accepted.

        Only the draft-level weights the weights file's online step names move (by default the intercepts):
        their gradient is the residual over the labelled positions (their mean, or with the ``"position"``
        weighting their sum) times the draft's row (for the intercepts: applied to the overall one and to the
        draft's provenance kind's). ``hazards`` are the ones :meth:`hazards` gave the draft before it
        was verified (for at least its labelled positions; None: computed again). ``next_accepted``: where the
        draft was cut from a longer proposal, whether the proposal's next token (position ``drafted``) is the
        one the target produced after it (None: unknown, or nothing was cut); the online step's ``next_label``
        makes it a label when every drafted token was accepted.
        """
        if session_id is None or (self.learning_rate <= 0 and self.shared_rate <= 0) or drafted <= 0:
            return
        if self._next_label and next_accepted is not None and accepted == drafted:
            drafted, accepted = drafted + 1, accepted + int(next_accepted)  # position `drafted` is labelled too
        observed = min(accepted + 1, drafted)  # positions whose outcome is known
        labels = (np.arange(observed) < accepted).astype(np.float64)  # [n]
        if hazards is None or len(hazards) < observed:
            hazards = self.hazards(features, observed, session_id)
        residual = float((labels - hazards[:observed]).sum())
        if not self._per_position:
            residual /= observed  # the mean: each draft weighs the same
        gradient = residual * draft_row(features) * self._online_mask  # [F]
        if self.shared_rate > 0:
            self._shared *= 1.0 - self.l2
            self._shared += self.shared_rate * gradient
        offset = self._offsets.pop(session_id, None)
        if offset is None:
            offset = np.zeros(NUM_FEATURES)
        offset *= 1.0 - self.l2
        offset += self.learning_rate * gradient
        self._offsets[session_id] = offset
        while len(self._offsets) > MAX_SESSIONS:
            self._offsets.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """Drop a session's online offset."""
        self._offsets.pop(session_id, None)

    def _logits(self, features: CacheDraftFeatures, length: int, session_id: str | None) -> np.ndarray:
        """The hazard's logit for ``i < length`` (``[L]``): the network's where it is shipped and the draft's text
        is known, else ``w . x_i`` (without building the ``[L, F]`` matrix) plus, where the weights read the text
        and it is known, ``t . text_i``; plus the session's offset."""
        weights = self.weights.weights
        offset = self._offsets.get(session_id) if session_id is not None else None
        if self.shared_rate > 0:
            offset = self._shared if offset is None else offset + self._shared
        mlp = self.weights.mlp
        row = draft_row(features)  # [F]
        if mlp is not None and len(features.text):
            logits = mlp.logits(_network_rows(features, row, length))  # [L]
            return logits if offset is None else logits + float(row @ offset)
        if offset is not None:
            weights = weights + offset
        base = float(row @ weights)
        logits = base + weights[:NUM_POSITION_FEATURES] @ position_columns(features, length)  # [L]
        text_weights = self.weights.text_weights
        if text_weights is not None and len(features.text):
            logits += text_columns(features.text, length) @ text_weights
        return logits


def median_accepted(survival: np.ndarray | Sequence[float]) -> float:
    """The predicted median accepted length of a draft whose survivals are ``survival`` (``S_i``, the chance that
    its first ``i + 1`` tokens are accepted, nonincreasing): where the survival curve, ``S = 1`` at 0 tokens and 0
    one token past the draft, crosses 1/2, linear between whole lengths. It exceeds ``n`` exactly when the
    predictor gives the first ``n`` tokens more than an even chance, which makes it the point prediction for the
    question "does this draft keep ``n`` tokens?" (the expected length, the survivals' sum, can exceed ``n`` on a
    long tail when keeping ``n`` is unlikely).

    Example: survivals ``[0.9, 0.6, 0.3]`` cross 1/2 between 2 and 3 tokens, at ``2 + 0.1 / 0.3 = 2.33``.
    """
    curve = np.concatenate(([1.0], np.asarray(survival, dtype=float), [0.0]))  # S at 0 .. L + 1 tokens
    below = int(np.argmax(curve < 0.5))  # the first length whose survival is under 1/2 (exists: the last is 0)
    before, after = curve[below - 1], curve[below]
    return float(below - 1 + (before - 0.5) / (before - after))


def online_mask(moves: tuple[str, ...] | list[str]) -> np.ndarray:
    """``[F]``: 1 for the draft-level features that ``moves`` names (names or ``fnmatch`` patterns), else 0.

    Raises:
        PayoffWeightsError: a name or pattern that matches no draft-level feature.
    """
    mask = np.zeros(NUM_FEATURES)
    for pattern in moves:
        hits = [i for i, name in enumerate(FEATURE_NAMES) if name in DRAFT_FEATURES and fnmatch.fnmatchcase(name,
                                                                                                          pattern)]
        if not hits:
            raise PayoffWeightsError(f"the online step moves {pattern!r}, which names no draft-level feature")
        mask[hits] = 1.0
    return mask


def _network_rows(features: CacheDraftFeatures, row: np.ndarray, length: int) -> np.ndarray:
    """The hazard network's ``[L, len(MLP_INPUTS)]`` inputs (the rows of :func:`~hvd_agents.policy.features.feature_matrix`, then the text
    columns), laid out in one array: ``row`` is the draft's :func:`draft_row`."""
    rows = np.empty((length, NUM_FEATURES + len(TEXT_COLUMNS)))  # [L, D]
    feature_matrix(features, length, row=row, out=rows[:, :NUM_FEATURES])
    text_columns(features.text, length, out=rows[:, NUM_FEATURES:])
    return rows


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.minimum(np.maximum(z, -30.0), 30.0)))  # clipped to [-30, 30]
