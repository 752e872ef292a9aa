"""Per-request generation parameters."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral, Real

from hvd_agents.engine.constraint import Constraint
from hvd_agents.engine.sampling import SamplingParams
from hvd_agents.errors import InvalidRequestError

DEFAULT_METHOD = "hvd"
# Most draft tokens verified per step when a request does not say: fixed-length
# drafters waste what they over-draft, so they keep K small; ``hvd`` chooses each
# step's length itself, so a large K only adds room for long accepted drafts; a model
# drafter pays a forward per drafted token and stops early by its own confidence.
DEFAULT_DRAFT_TOKENS = 10
METHOD_DRAFT_TOKENS = {"hvd": 32, "model": 6}


@dataclass(frozen=True)
class GenerationParams:
    """Everything that shapes one request's decoding.

    Attributes:
        max_new_tokens: upper bound on emitted tokens (an int >= 1); the engine
            also stops at the context window (finish reason ``"length"``), so a
            value larger than the room left is capped there, not refused.
        temperature: 0 for greedy decoding, > 0 to sample.
        top_p: nucleus sampling mass in (0, 1].
        top_k: keep the k most likely tokens; 0 disables.
        seed: seed of the request's RNG (sampling only); None draws a fresh one.
        stop: stop strings (non-empty; a bare string is one, None is none);
            generation ends before the first one, which is not returned.
        stop_token_ids: token ids that end generation; None means the model's
            end-of-sequence / end-of-turn ids.
        method: decoding method, i.e. drafter name (``"ar"``, ``"pld"``, ...).
        num_draft_tokens: the most draft tokens verified per step (K); None means
            the method's default (:data:`METHOD_DRAFT_TOKENS`, else
            :data:`DEFAULT_DRAFT_TOKENS`).
        record_steps: keep a :class:`~hvd_agents.engine.stats.VerifyStepRecord` per step.
        reuse_prefix: start from the KV of the longest prompt prefix an earlier
            request computed, and keep this request's KV for later ones (when the
            engine's prefix cache is enabled); False prefills the whole prompt.
        timeout_s: the most seconds the request may take from the call that makes
            it, waiting for the engine included; past it the request ends, checked
            between steps, with :class:`~hvd_agents.errors.RequestTimeoutError` (what
            was streamed stays streamed). None: no limit.
        constraint: what the output must match (a JSON schema, a regex, a grammar;
            :class:`~hvd_agents.engine.constraint.Constraint`), or None. It masks the
            target's logits at every position, so every method gives the tokens of plain
            constrained decoding (greedy) or its distribution (sampling).

    Raises:
        InvalidRequestError: a value is out of range (raised on construction).
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None
    method: str = DEFAULT_METHOD
    num_draft_tokens: int | None = None
    record_steps: bool = False
    reuse_prefix: bool = True
    timeout_s: float | None = None
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise InvalidRequestError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens <= 0:
            raise InvalidRequestError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_draft_tokens is not None and not _is_int(self.num_draft_tokens):
            raise InvalidRequestError(f"num_draft_tokens must be an int or None, got {self.num_draft_tokens!r}")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 0:
            raise InvalidRequestError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if not isinstance(self.method, str) or not self.method:
            raise InvalidRequestError(f"method must be a non-empty string, got {self.method!r}")
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if self.timeout_s is not None:
            t = self.timeout_s
            if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(t) or t <= 0:
                raise InvalidRequestError(f"timeout_s must be a finite number of seconds > 0 or None, got {t!r}")
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable) or not all(_is_int(t) for t in ids):
                raise InvalidRequestError(f"stop_token_ids must be a list of ints or None, got {ids!r}")
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidRequestError(f"constraint must be a Constraint or None, got {type(self.constraint).__name__}")
        _ = self.sampling  # validates the sampling fields

    @property
    def draft_tokens(self) -> int:
        """K for this request: ``num_draft_tokens``, or the method's default."""
        if self.num_draft_tokens is not None:
            return self.num_draft_tokens
        return METHOD_DRAFT_TOKENS.get(self.method, DEFAULT_DRAFT_TOKENS)

    @property
    def sampling(self) -> SamplingParams:
        """The sampling part of these parameters."""
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _stop_strings(stop: object) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (None: none; a bare string: one).

    Raises:
        InvalidRequestError: not a string or a list of non-empty strings.
    """
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if isinstance(stop, bytes) or not isinstance(stop, Iterable):
        raise InvalidRequestError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    stops = tuple(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise InvalidRequestError(f"stop strings must be non-empty strings, got {stops!r}")
    return stops
