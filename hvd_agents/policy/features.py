"""Payoff features: what is known about a cache draft BEFORE the target verifies it.

The payoff predictor is a hazard model: for draft position ``i`` (0-based) it
estimates ``h_i = P(token i accepted | tokens 0..i-1 accepted)``. Its input is one
row of :data:`FEATURE_NAMES` per position, built from a :class:`CacheDraftFeatures`:

* the draft's own features (:class:`~hvd_agents.drafters.cache.suffix.SuffixDrafter`):
  match length (and whether it covers the whole output so far), candidate count,
  branch probability and support at each position, provenance kind, distance,
  store or live context;
* at each position, how the few tokens before it went on wherever they occurred
  before (in the context and the store): the share of those occurrences followed by
  the drafted token (``share``) and how many there were (``log_seen``; ``split`` is
  ``(1 - share) * log_seen``). The longest match has one or a few candidates, which
  agree with each other; the same four tokens seen many times with many successors
  mark where copied text forks (a tool call's name, an argument's value);
* the decoding state: position in the output, this request's acceptance history
  (:class:`HistoryFeatures`), this session's acceptance rate for the draft's
  provenance kind (:mod:`hvd_agents.drafters.cache.history`);
* the target's own signal from the previous verification (:class:`TargetSignal`,
  free: it is read off logits the engine computed anyway): log-probability of the
  last emitted token and the entropy of its distribution. Replays of logs have no
  target, so these are 0 with ``has_target = 0`` there.

The file is over 500 lines for one reason: every feature column is named once, here, and the typed records,
the predictor's rows built from them and the checked reading of their JSON records all use those names; split,
each part would import the others' private name tables.

Inside the process features are these typed records; feature names exist only at
the JSON boundaries: the payoff weights file (one weight per :data:`FEATURE_NAMES`
column, :mod:`hvd_agents.policy.payoff`) and the step records that ``hvd-agents
analyze --steps`` and the engine write and ``hvd-agents train-payoff`` reads
(:meth:`CacheDraftFeatures.to_record` / :meth:`CacheDraftFeatures.from_record`,
and :func:`feature_record` for any draft's features). Reading a record checks
every name: an unknown or misspelt one raises :class:`FeatureRecordError` instead
of leaving its feature at the default. A record may leave features out (they take
the defaults of the dataclass fields: branch probabilities 1, support the
candidate count, no kind, no history, no target).

Worked example: a draft with ``match_len = 3`` whose branch probabilities are
``[1.0, 0.5]`` gives two rows; row 1 has ``log_pos = log(2)``, ``prob = 0.5``,
``log_path = log(0.5)`` and ``beyond_match = 0`` (position 1 is within the match
length), the draft-level columns being the same in both rows::

    feature_matrix(CacheDraftFeatures(match_len=3, probs=[1.0, 0.5], support=[1, 1]), 2)  # [2, NUM_FEATURES]
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from hvd_agents.errors import HVDError
from hvd_agents.policy.token_text import BEFORE
from hvd_agents.structure import SPAN_KINDS, SpanKind

# Columns that vary with the position in the draft (filled per row).
POSITION_FEATURES: tuple[str, ...] = ("log_pos", "prob", "log_path", "beyond_match", "log_support", "share",
                                      "log_seen", "split")
# Columns shared by every row of a draft.
DRAFT_FEATURES: tuple[str, ...] = (
    "bias",
    "log_match",
    "log_candidates",
    "from_store",
    "covers_output",
    "log_distance",
    "log_out_pos",
    "no_history",
    "last_frac",
    "last_full",
    "ema_frac",
    "kind_rate",
    "has_target",
    "target_logp",
    "target_entropy",
    *(f"kind={kind.value}" for kind in SPAN_KINDS),
)
FEATURE_NAMES: tuple[str, ...] = POSITION_FEATURES + DRAFT_FEATURES
NUM_FEATURES = len(FEATURE_NAMES)
_FIRST_DRAFT_COLUMN = len(POSITION_FEATURES)
_KIND_COLUMNS: dict[SpanKind, int] = {kind: FEATURE_NAMES.index(f"kind={kind.value}") for kind in SPAN_KINDS}

PRIOR_RATE = 0.5  # an accepted fraction not observed yet (history and kind rates start here)


class FeatureRecordError(HVDError, ValueError):
    """A step record's features name an unknown feature or hold a value it cannot have."""


@runtime_checkable
class DraftFeatures(Protocol):
    """What a drafter tells about its draft, typed; step records carry it by name (:meth:`to_record`)."""

    def to_record(self) -> dict[str, float]:
        """The features by name, as step records write them."""


@dataclass(frozen=True)
class HistoryFeatures:
    """How the drafts of this request fared so far (a snapshot of
    :class:`~hvd_agents.drafters.cache.history.AcceptanceHistory`).

    Attributes:
        drafts: verified drafts so far (0: none, the other fields are priors).
        last_frac: accepted fraction of the last draft.
        last_full: whether the last draft was accepted whole.
        ema_frac: moving average of the accepted fraction.
    """

    drafts: int = 0
    last_frac: float = PRIOR_RATE
    last_full: bool = False
    ema_frac: float = PRIOR_RATE

    def __post_init__(self) -> None:
        if self.drafts < 0:
            raise ValueError(f"drafts must be >= 0, got {self.drafts}")


@dataclass(frozen=True)
class TargetSignal:
    """The target's signal at the last token it emitted (read off the verification logits).

    Attributes:
        logp: log-probability of that token.
        entropy: entropy (nats) of the target's distribution there.
    """

    logp: float
    entropy: float


def _no_positions() -> np.ndarray:
    return np.zeros(0)


def _no_masks() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class CacheDraftFeatures:
    """What is known about a cache draft before verification (see the module docstring).

    Attributes:
        match_len: length of the context suffix the draft's candidates matched.
        candidates: candidates (matches of that length) the draft was walked from.
        distance: to the source: tokens back from the end of the context, or store
            registrations ago.
        from_store: whether the chosen source is in the cross-request store.
        kind: provenance kind of the chosen source (None: not known).
        out_pos: output tokens emitted before the draft.
        covers_output: whether the match covers the whole output so far.
        kind_rate: this session's accepted fraction for drafts of ``kind``.
        history: this request's acceptance history.
        probs: ``[n]`` branch probability of each drafted position (share of the
            still agreeing candidates that continue with the drafted token).
        support: ``[n]`` candidates continuing with the drafted token at each position.
        share: ``[n]`` share of the earlier occurrences of the tokens before each position that the drafted
            token followed (1 where there were none).
        seen: ``[n]`` how many such occurrences were counted.
        target: the target's signal from the previous verification (None: none reported).
        text: ``[BEFORE + n]`` the classes (:mod:`hvd_agents.policy.token_text` bitmasks) of the last
            :data:`~hvd_agents.policy.token_text.BEFORE` context tokens, then of each draft token (empty: not
            known, the drafter has no tokenizer's text).

    ``probs``, ``support``, ``share`` and ``seen`` take any float sequences and are kept as read-only
    float64 arrays of one length ``n`` (``share`` and ``seen`` may be empty: not known); rows past ``n``
    (a record that left positions out) take branch probability 1, support ``candidates``, share 1 and
    seen 0.
    """

    match_len: int = 0
    candidates: int = 1
    distance: float = 0.0
    from_store: bool = False
    kind: SpanKind | None = None
    out_pos: int = 0
    covers_output: bool = False
    kind_rate: float = PRIOR_RATE
    history: HistoryFeatures = field(default_factory=HistoryFeatures)
    probs: np.ndarray = field(default_factory=_no_positions)  # [n]
    support: np.ndarray = field(default_factory=_no_positions)  # [n]
    target: TargetSignal | None = None
    share: np.ndarray = field(default_factory=_no_positions)  # [n] or [0]
    seen: np.ndarray = field(default_factory=_no_positions)  # [n] or [0]
    text: np.ndarray = field(default_factory=_no_masks)  # [BEFORE + n] or [0]

    def __post_init__(self) -> None:
        probs, support = _positions(self.probs, "probs"), _positions(self.support, "support")
        if probs.shape != support.shape:
            raise ValueError(f"probs and support must have one length, got {len(probs)} and {len(support)}")
        share, seen = _positions(self.share, "share"), _positions(self.seen, "seen")
        if share.shape != seen.shape or (len(share) and share.shape != probs.shape):
            raise ValueError(f"share and seen must be empty or as long as probs, got {len(share)} and {len(seen)}")
        if min(self.match_len, self.candidates, self.out_pos) < 0:
            raise ValueError("match_len, candidates and out_pos must be >= 0")
        object.__setattr__(self, "probs", probs)
        object.__setattr__(self, "support", support)
        object.__setattr__(self, "share", share)
        object.__setattr__(self, "seen", seen)
        text = _masks(self.text)
        if len(text) and len(text) != BEFORE + len(probs):
            raise ValueError(f"text must be empty or {BEFORE} + {len(probs)} classes long, got {len(text)}")
        object.__setattr__(self, "text", text)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheDraftFeatures):
            return NotImplemented
        return all(
            np.array_equal(mine, theirs) if isinstance(mine, np.ndarray) else mine == theirs
            for mine, theirs in ((getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays

    def with_target(self, target: TargetSignal | None) -> CacheDraftFeatures:
        """These features with the target's signal from the previous verification."""
        return self if target is self.target else replace(self, target=target)

    def to_record(self) -> dict[str, float]:
        """The features by name, as step records carry them (the names and order of the JSON lines).

        Besides the inputs of the feature rows, a record carries ``branch_prob``
        (the first position's), ``path_prob`` (their product) and ``draft_len``
        (``n``) for reading; :meth:`from_record` recomputes those.
        """
        probs = self.probs.tolist()
        path_prob = 1.0
        for p in probs:
            path_prob *= p
        history = self.history
        record = {
            "match_len": float(self.match_len),
            "num_candidates": float(self.candidates),
            "branch_prob": probs[0] if probs else 1.0,
            "path_prob": path_prob,
            "draft_len": float(len(probs)),
            "distance": float(self.distance),
            "from_store": float(self.from_store),
        }
        if self.kind is not None:
            record[f"kind={self.kind.value}"] = 1.0
        record.update(
            {
                "pos": float(self.out_pos),
                "covers_output": float(self.covers_output),
                "kind_rate": float(self.kind_rate),
                "hist_drafts": float(history.drafts),
                "last_frac": float(history.last_frac),
                "last_full": float(history.last_full),
                "ema_frac": float(history.ema_frac),
            }
        )
        record.update(zip(_position_names("prob", len(probs)), probs))
        record.update(zip(_position_names("support", len(probs)), self.support.tolist()))
        record.update(zip(_position_names("share", len(self.share)), self.share.tolist()))
        record.update(zip(_position_names("seen", len(self.seen)), self.seen.tolist()))
        if len(self.text):
            record.update(zip(_BEFORE_NAMES, map(float, self.text[BEFORE - 1 :: -1].tolist())))
            record.update(zip(_position_names("text", len(self.text) - BEFORE), map(float, self.text[BEFORE:].tolist())))
        if self.target is not None:
            record.update(
                {"has_target": 1.0, "target_logp": float(self.target.logp), "target_entropy": float(self.target.entropy)}
            )
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CacheDraftFeatures:
        """Read the features of a step record (what :meth:`to_record` and :func:`feature_record` write).

        Names a record may leave out take the field defaults. Besides the
        features, the names :meth:`to_record` derives, the ``hvd`` policy's
        annotations (:class:`ChosenDraftFeatures`) and other drafters' records
        (:class:`PromptLookupFeatures`, :class:`ModelDraftFeatures`) are known and
        ignored: a record of another drafter reads as a draft with no feature known.

        Raises:
            FeatureRecordError: a name that is none of these (the message lists
                the unknown names, with the known ones closest to them), or a
                value that is not a finite number of the feature's kind (flags 0
                or 1, counts whole and >= 0, probabilities in [0, 1]).
        """
        unknown = [name for name in record if not _is_known(name)]
        if unknown:
            raise FeatureRecordError(_unknown_message(unknown))
        values = {name: _number(name, value) for name, value in record.items()}
        get = values.get
        candidates = _count(values, "num_candidates", 1)
        positions: dict[str, dict[int, float]] = {"prob": {}, "support": {}, "share": {}, "seen": {}, "text": {}}
        before = {BEFORE - int(name.rsplit("_", 1)[1]): _whole(name, value) for name, value in values.items()
                  if name in _BEFORE_NAMES}
        kinds = []
        for name, value in values.items():
            indexed = _POSITION_NAME.fullmatch(name)
            if indexed is not None:
                positions[indexed[1]][int(indexed[2])] = value
            elif name in _KIND_NAMES:
                if value != 1.0:
                    raise FeatureRecordError(f"{name} must be 1 (it marks the draft's kind), got {value}")
                kinds.append(_KIND_NAMES[name])
        if len(kinds) > 1:
            raise FeatureRecordError(f"a draft has one provenance kind, the record names {len(kinds)}")
        n = 1 + max([-1, *(i for indexed in positions.values() for i in indexed)])
        probs = np.ones(n)  # [n]
        support = np.full(n, float(candidates))  # [n]
        for i, p in positions["prob"].items():
            probs[i] = _fraction(f"prob_{i}", p)
        for i, s in positions["support"].items():
            support[i] = _whole(f"support_{i}", s)
        share, seen = np.zeros(0), np.zeros(0)
        if positions["share"] or positions["seen"]:
            share, seen = np.ones(n), np.zeros(n)  # [n]: positions a record leaves out were not counted
            for i, p in positions["share"].items():
                share[i] = _fraction(f"share_{i}", p)
            for i, c in positions["seen"].items():
                seen[i] = _whole(f"seen_{i}", c)
        text = np.zeros(0, dtype=np.int64)
        if positions["text"] or before:
            text = np.zeros(BEFORE + n, dtype=np.int64)  # [BEFORE + n]: tokens a record leaves out have no class
            for i, mask in before.items():
                text[i] = mask
            for i, mask in positions["text"].items():
                text[BEFORE + i] = _whole(f"text_{i}", mask)
        history = HistoryFeatures(
            drafts=_count(values, "hist_drafts", 0),
            last_frac=get("last_frac", PRIOR_RATE),
            last_full=_flag(values, "last_full"),
            ema_frac=get("ema_frac", PRIOR_RATE),
        )
        return cls(
            match_len=_count(values, "match_len", 0),
            candidates=candidates,
            distance=get("distance", 0.0),
            from_store=_flag(values, "from_store"),
            kind=kinds[0] if kinds else None,
            out_pos=_count(values, "pos", 0),
            covers_output=_flag(values, "covers_output"),
            kind_rate=get("kind_rate", PRIOR_RATE),
            history=history,
            probs=probs,
            support=support,
            target=_target(values),
            share=share,
            seen=seen,
            text=text,
        )


@dataclass(frozen=True)
class ChosenDraftFeatures:
    """A cache draft as the ``hvd`` policy chose it: the features it was judged on, and the judgement.

    Attributes:
        features: the cache draft's features (with the target's signal the prediction used).
        full_len: tokens the cache drafter proposed, before the policy cut the draft.
        pred_accepted: draft tokens the policy expects accepted (alternatives included).
        rate: the running tokens per unit of cost the choice was made at.
    """

    features: CacheDraftFeatures
    full_len: int
    pred_accepted: float
    rate: float

    NAMES: ClassVar[tuple[str, ...]] = ("full_len", "pred_accepted", "rate")

    def to_record(self) -> dict[str, float]:
        """The cache draft's record followed by ``full_len``, ``pred_accepted`` and ``rate``."""
        judgement = (float(self.full_len), float(self.pred_accepted), float(self.rate))
        return {**self.features.to_record(), **dict(zip(self.NAMES, judgement))}


@dataclass(frozen=True)
class PromptLookupFeatures:
    """A prompt-lookup draft: the n-gram length it matched."""

    ngram: int

    NAMES: ClassVar[tuple[str, ...]] = ("ngram",)

    def to_record(self) -> dict[str, float]:
        return {"ngram": float(self.ngram)}


@dataclass(frozen=True)
class ModelDraftFeatures:
    """A model draft: the drafter's own estimate that the draft survives whole, and its chain's length."""

    survival: float
    tokens: int

    NAMES: ClassVar[tuple[str, ...]] = ("model_survival", "model_tokens")

    def to_record(self) -> dict[str, float]:
        return {"model_survival": float(self.survival), "model_tokens": float(self.tokens)}


def feature_record(features: DraftFeatures | Mapping[str, float]) -> dict[str, float]:
    """A draft's features by name, as step records carry them.

    ``Draft.features`` is a typed record (:class:`DraftFeatures`), or a name ->
    value mapping from a drafter that has none (taken as it is).
    """
    if isinstance(features, Mapping):
        return dict(features)
    return features.to_record()


def draft_row(features: CacheDraftFeatures) -> np.ndarray:
    """The draft-level columns (position columns left 0) as a ``[NUM_FEATURES]`` vector."""
    row = np.zeros(NUM_FEATURES)  # [F]
    history, target = features.history, features.target
    values = (
        1.0,
        math.log1p(features.match_len),
        math.log1p(features.candidates),
        float(features.from_store),
        float(features.covers_output),
        math.log1p(max(features.distance, 0.0)),
        math.log1p(features.out_pos),
        float(history.drafts == 0),
        history.last_frac,
        float(history.last_full),
        history.ema_frac,
        features.kind_rate,
        float(target is not None),
        target.logp if target is not None else 0.0,
        target.entropy if target is not None else 0.0,
    )
    row[_FIRST_DRAFT_COLUMN : _FIRST_DRAFT_COLUMN + len(values)] = values  # the numeric draft columns, in order
    if features.kind is not None:
        row[_KIND_COLUMNS[features.kind]] = 1.0
    return row


def position_columns(features: CacheDraftFeatures, length: int) -> np.ndarray:
    """The position-dependent columns of a draft's first ``length`` positions, ``[len(POSITION_FEATURES), L]``.

    Positions past the features' own ``n`` take branch probability 1 and support ``candidates``.
    """
    columns = np.empty((len(POSITION_FEATURES), length))  # [P, L]
    columns[0] = _LOG_POSITIONS[:length] if length <= MAX_POSITIONS else np.log1p(np.arange(length))
    columns[1] = _padded(features.probs, length, 1.0)
    columns[2] = np.cumsum(np.log(np.minimum(np.maximum(columns[1], 1e-6), 1.0)))  # clipped to [1e-6, 1]
    columns[3] = np.maximum(columns[0] - math.log1p(features.match_len), 0.0)
    columns[4] = np.log1p(_padded(features.support, length, float(features.candidates)))
    columns[5] = _padded(features.share, length, 1.0)
    columns[6] = np.log1p(_padded(features.seen, length, 0.0))
    columns[7] = (1.0 - columns[5]) * columns[6]
    return columns


def feature_matrix(features: CacheDraftFeatures, length: int, *, row: np.ndarray | None = None,
                   out: np.ndarray | None = None) -> np.ndarray:
    """The ``[length, NUM_FEATURES]`` rows of a draft's first ``length`` positions.

    ``row``: the draft's :func:`draft_row`, when the caller has it; ``out``: a float ``[length, NUM_FEATURES]``
    array (a view into a wider one) written in place of a new one."""
    if out is None:
        out = np.empty((length, NUM_FEATURES))  # [L, F]
    out[:] = draft_row(features) if row is None else row
    out[:, :_FIRST_DRAFT_COLUMN] = position_columns(features, length).T
    return out


MAX_POSITIONS = 256  # record names and log-positions precomputed up to here (longer drafts compute them)
_LOG_POSITIONS = np.log1p(np.arange(MAX_POSITIONS, dtype=np.float64))
_POSITION_PREFIXES = ("prob", "support", "share", "seen", "text")
_POSITION_NAMES = {prefix: tuple(f"{prefix}_{i}" for i in range(MAX_POSITIONS)) for prefix in _POSITION_PREFIXES}
_POSITION_NAME = re.compile(r"(prob|support|share|seen|text)_(0|[1-9][0-9]*)")
_BEFORE_NAMES = tuple(f"before_{i}" for i in range(1, BEFORE + 1))  # before_1: the last context token's classes
_KIND_NAMES = {f"kind={kind.value}": kind for kind in SPAN_KINDS}
_FLAGS = ("from_store", "covers_output", "last_full", "has_target")
_COUNTS = ("match_len", "num_candidates", "pos", "hist_drafts")
_TARGET_NAMES = ("has_target", "target_logp", "target_entropy")
# every name a record may hold that is not per position: what the rows read, then what is only written for reading
_KNOWN_NAMES = frozenset(
    (*_FLAGS, *_COUNTS, *_TARGET_NAMES, *_BEFORE_NAMES, "distance", "kind_rate", "last_frac", "ema_frac", *_KIND_NAMES,
     "branch_prob", "path_prob", "draft_len",
     *ChosenDraftFeatures.NAMES, *PromptLookupFeatures.NAMES, *ModelDraftFeatures.NAMES)
)


def _position_names(prefix: str, length: int) -> Sequence[str]:
    cached = _POSITION_NAMES[prefix]
    return cached[:length] if length <= MAX_POSITIONS else [f"{prefix}_{i}" for i in range(length)]


def _positions(values: Any, name: str) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == np.float64 and values.ndim == 1 and not values.flags.writeable:
        return values  # already a read-only vector (another CacheDraftFeatures')
    array = np.array(values, dtype=np.float64)  # [n], a copy: the features own it
    if array.ndim != 1:
        raise ValueError(f"{name} must be one value per position, got shape {array.shape}")
    array.setflags(write=False)
    return array


def _masks(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and values.ndim == 1 and not values.flags.writeable:
        return values
    array = np.array(values, dtype=np.int64)  # [m], a copy: the features own it
    if array.ndim != 1 or (len(array) and array.min() < 0):
        raise ValueError(f"text must be non-negative class masks, one per token, got {array!r}")
    array.setflags(write=False)
    return array


def _padded(values: np.ndarray, length: int, default: float) -> np.ndarray:
    """``values`` cut or padded with ``default`` to ``[length]``."""
    if length <= len(values):
        return values[:length]
    return np.concatenate([values, np.full(length - len(values), default)])


def _is_known(name: str) -> bool:
    return name in _KNOWN_NAMES or _POSITION_NAME.fullmatch(name) is not None


def _unknown_message(unknown: Sequence[str]) -> str:
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, [*_KNOWN_NAMES, "prob_0", "support_0", "share_0", "seen_0"], n=1, cutoff=0.6)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return f"unknown feature name{'s' if len(unknown) > 1 else ''} in a step record: {', '.join(hints)}"


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FeatureRecordError(f"feature {name} must be a finite number, got {value!r}")
    return float(value)


def _fraction(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise FeatureRecordError(f"{name} must be in [0, 1], got {value}")
    return value


def _whole(name: str, value: float) -> int:
    if value < 0 or value != int(value):
        raise FeatureRecordError(f"feature {name} must be a whole number >= 0, got {value}")
    return int(value)


def _count(values: Mapping[str, float], name: str, default: int) -> int:
    return _whole(name, values[name]) if name in values else default


def _flag(values: Mapping[str, float], name: str) -> bool:
    value = values.get(name, 0.0)
    if value not in (0.0, 1.0):
        raise FeatureRecordError(f"feature {name} must be 0 or 1, got {value}")
    return value == 1.0


def _target(values: Mapping[str, float]) -> TargetSignal | None:
    if _flag(values, "has_target"):
        return TargetSignal(values.get("target_logp", 0.0), values.get("target_entropy", 0.0))
    if values.get("target_logp", 0.0) or values.get("target_entropy", 0.0):
        raise FeatureRecordError("target_logp / target_entropy given without has_target = 1")
    return None
