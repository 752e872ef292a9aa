"""Sampling parameters and the target distribution p they define.

``target_probs(logits, params)`` turns target logits into the distribution the
engine samples from, in the order transformers applies its warpers: temperature,
then top-k, then top-p (nucleus, always keeping at least one token). Plain
autoregressive sampling and speculative verification both draw from this same p,
which is what makes speculative sampling lossless.

Ties are decided by score alone, so p does not depend on how a sort orders equal
values: top-k keeps every token tied with the k-th, and top-p keeps every token tied
with the least likely token it keeps. The nucleus is transformers' (the scores sorted
ascending, their softmax summed from the least likely, a token removed while that sum
is at most ``1 - top_p``); only the sorted values enter it, so on the CPU they come
from NumPy's sort (a tenth of ``torch.sort``'s time on a 49,152-token row, the same
values).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch

from hvd_agents.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits.

    Attributes:
        temperature: 0 for greedy (argmax); > 0 samples from softmax(logits / temperature).
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 disables it.
        seed: seeds the request's torch.Generator; None draws a fresh seed.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            if not _is_number(getattr(self, name), Real):
                raise InvalidRequestError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not _is_number(self.top_k, Integral):
            raise InvalidRequestError(f"top_k must be an int, got {self.top_k!r}")
        if self.seed is not None and not _is_number(self.seed, Integral):
            raise InvalidRequestError(f"seed must be an int, got {self.seed!r}")
        if not (self.temperature >= 0.0) or self.temperature == float("inf"):
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**64:  # what torch.Generator.manual_seed takes
            raise InvalidRequestError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _is_number(value: object, kind: type) -> bool:
    """``value`` is a ``kind`` (Real or Integral) and not a bool."""
    return isinstance(value, kind) and not isinstance(value, bool)


GREEDY = SamplingParams()  # the default: argmax


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target distribution p for each row of ``logits``.

    Args:
        logits: ``[n, vocab]`` raw target logits.
        params: sampling parameters with ``temperature > 0``.

    Returns:
        ``[n, vocab]`` float32 probabilities, each row summing to 1.
    """
    scores = logits.float() / params.temperature  # [n, vocab]
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ascending = _sorted_values(scores)  # [n, vocab]
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)  # from the least likely
        removed = (cumulative <= (1.0 - params.top_p)).sum(dim=-1, keepdim=True)  # [n, 1]: a prefix, as it only grows
        removed = removed.clamp_max(vocab - 1)  # always keep the most likely token
        smallest_kept = ascending.gather(-1, removed)  # [n, 1]
        scores = scores.masked_fill(scores < smallest_kept, float("-inf"))
    return scores.softmax(dim=-1)


def _sorted_values(scores: torch.Tensor) -> torch.Tensor:
    """Each row of ``scores`` sorted ascending: the values only, which every sort gives alike."""
    if scores.device.type == "cpu":
        return torch.from_numpy(np.sort(scores.detach().numpy(), axis=-1))
    return torch.sort(scores, dim=-1).values
