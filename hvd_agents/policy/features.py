"""Payoff features: what is known about a cache draft BEFORE the target verifies it.

The payoff predictor is a hazard model: for draft position ``i`` (0-based) it
estimates ``h_i = P(token i accepted | tokens 0..i-1 accepted)``. Its input is one
row of :data:`FEATURE_NAMES` per position, built from

* the draft's own features (:class:`~hvd_agents.drafters.cache.suffix.SuffixDrafter`):
  match length (and whether it covers the whole output so far), candidate count,
  branch probability and support at each position, provenance kind, distance,
  store or live context;
* the decoding state: position in the output, this request's acceptance history,
  this session's acceptance rate for the draft's provenance kind
  (:mod:`hvd_agents.drafters.cache.history`);
* the target's own signal from the previous verification (free: it is read off
  logits the engine computed anyway): log-probability of the last emitted token
  and the entropy of its distribution. Replays of logs have no target, so these
  are 0 with ``has_target = 0`` there.

Worked example: a draft with ``match_len = 3`` whose branch probabilities are
``[1.0, 0.5]`` gives two rows; row 1 has ``log_pos = log(2)``, ``prob = 0.5``,
``log_path = log(0.5)`` and ``beyond_match = 0`` (position 1 is within the match
length), the draft-level columns being the same in both rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from hvd_agents.structure import SPAN_KINDS

# Columns that vary with the position in the draft (filled per row).
POSITION_FEATURES: tuple[str, ...] = ("log_pos", "prob", "log_path", "beyond_match", "log_support")
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
_KIND_COLUMNS = {name: FEATURE_NAMES.index(name) for name in FEATURE_NAMES if name.startswith("kind=")}


def draft_row(features: Mapping[str, float]) -> np.ndarray:
    """The draft-level columns (position columns left 0) as a ``[NUM_FEATURES]`` vector."""
    row = np.zeros(NUM_FEATURES)  # [F]
    get = features.get
    values = (
        1.0,
        math.log1p(get("match_len", 0.0)),
        math.log1p(get("num_candidates", 1.0)),
        get("from_store", 0.0),
        get("covers_output", 0.0),
        math.log1p(max(get("distance", 0.0), 0.0)),
        math.log1p(get("pos", 0.0)),
        float(get("hist_drafts", 0.0) == 0),
        get("last_frac", 0.5),
        get("last_full", 0.0),
        get("ema_frac", 0.5),
        get("kind_rate", 0.5),
        get("has_target", 0.0),
        get("target_logp", 0.0),
        get("target_entropy", 0.0),
    )
    row[_FIRST_DRAFT_COLUMN : _FIRST_DRAFT_COLUMN + len(values)] = values  # the numeric draft columns, in order
    for name, column in _KIND_COLUMNS.items():
        value = get(name)
        if value is not None:
            row[column] = value
    return row


def position_columns(features: Mapping[str, float], length: int) -> np.ndarray:
    """The position-dependent columns of a draft's first ``length`` positions, ``[len(POSITION_FEATURES), L]``.

    ``prob_<i>`` features (branch probabilities) default to 1 where absent,
    ``support_<i>`` (candidates agreeing at ``i``) to ``num_candidates``.
    """
    get = features.get
    candidates = get("num_candidates", 1.0)
    columns = np.empty((len(POSITION_FEATURES), length))  # [P, L]
    columns[0] = _LOG_POSITIONS[:length] if length <= MAX_POSITIONS else np.log1p(np.arange(length))
    columns[1] = [get(key, 1.0) for key in _keys(_PROB_KEYS, "prob", length)]
    columns[2] = np.cumsum(np.log(np.clip(columns[1], 1e-6, 1.0)))
    columns[3] = np.maximum(columns[0] - math.log1p(get("match_len", 0.0)), 0.0)
    columns[4] = np.log1p([get(key, candidates) for key in _keys(_SUPPORT_KEYS, "support", length)])
    return columns


def feature_matrix(features: Mapping[str, float], length: int) -> np.ndarray:
    """The ``[length, NUM_FEATURES]`` rows of a draft's first ``length`` positions."""
    rows = np.tile(draft_row(features), (length, 1))  # [L, F]
    rows[:, :_FIRST_DRAFT_COLUMN] = position_columns(features, length).T
    return rows


MAX_POSITIONS = 256  # key names and log-positions precomputed up to here (longer drafts compute them)
_LOG_POSITIONS = np.log1p(np.arange(MAX_POSITIONS, dtype=np.float64))
_PROB_KEYS = tuple(f"prob_{i}" for i in range(MAX_POSITIONS))
_SUPPORT_KEYS = tuple(f"support_{i}" for i in range(MAX_POSITIONS))


def _keys(cached: tuple[str, ...], prefix: str, length: int) -> tuple[str, ...] | list[str]:
    return cached[:length] if length <= MAX_POSITIONS else [f"{prefix}_{i}" for i in range(length)]
