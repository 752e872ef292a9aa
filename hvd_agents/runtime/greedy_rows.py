"""What a greedy step reads from logits already on the host: each row's argmax and the target's signal at one row.

A runner may give its own reader (``greedy_rows``, optional in :mod:`hvd_agents.runtime.runner`'s contract): the
native CPU runner's reads each row in one or two passes of its own kernels
(:class:`hvd_agents.runtime.cpu.greedy_rows.NativeGreedyRows`), where PyTorch's reductions spend most of a
millisecond on a verification step's rows. A reader's choices are ``torch.argmax``'s exactly (the first of tied
maxima, a NaN where a row has one), so greedy output never depends on which reader ran; the signal (the
log-probability of a token and the entropy, the policy's features) may differ from PyTorch's by float rounding.
A sampled step verified on the host reads its signal here too (its choices are drawn, not read).

A greedy model draft reads its drafter's distribution the same way (:data:`TopProbs`): its most likely tokens and
their probabilities, PyTorch's :func:`top_probs` or the native kernels' when the drafter runs on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class GreedyRows(Protocol):
    def choices(self, logits: torch.Tensor) -> list[int]:
        """Each row's argmax of ``logits`` ``[rows, vocab]``: ``torch.argmax(logits, dim=-1)``'s indices."""
        ...

    def signal(self, logits: torch.Tensor, row: int, token: int) -> tuple[float, float]:
        """``(log p(token), entropy)`` of ``softmax(logits[row])``."""
        ...


class TorchGreedyRows:
    """:class:`GreedyRows` on PyTorch's operations (any runner's logits on the CPU)."""

    def choices(self, logits: torch.Tensor) -> list[int]:
        return logits.argmax(dim=-1).tolist()

    def signal(self, logits: torch.Tensor, row: int, token: int) -> tuple[float, float]:
        logp, entropy = log_probs_and_entropy(logits[row])
        return float(logp[token]), float(entropy)


def log_probs_and_entropy(row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(row)`` ``[vocab]`` (float32) and its entropy (0-dim), on the row's device without a host read.
    Entries at -inf (a grammar's masked tokens) weigh nothing: ``0 * log 0`` is taken as 0, not NaN."""
    logp = torch.log_softmax(row.float(), dim=-1)
    terms = logp.exp() * logp
    entropy = -torch.where(logp > float("-inf"), terms, terms.new_zeros(())).sum()
    return logp, entropy


TORCH_GREEDY_ROWS = TorchGreedyRows()


TopProbs = Callable[[torch.Tensor, int], tuple[list[int], list[float]]]


def top_probs(logits: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` most likely indices of ``softmax(logits)`` (``[vocab]``), most likely first, and their
    probabilities: what a greedy draft reads of its drafter's distribution (its token, confidence and alternatives)."""
    top = torch.topk(torch.softmax(logits.float(), dim=-1), k)
    return top.indices.tolist(), top.values.tolist()
