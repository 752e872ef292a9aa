"""A greedy step's reads of its logits on the native kernels (:class:`~hvd_agents.runtime.greedy_rows.GreedyRows`).

Each row's argmax is one pass for its max and a short one for the first index holding it (``torch.argmax``'s
rule), the signal one more pass of 8-lane ``exp`` (``native/logit_rows.h``), the same bits on every path. A row
holding a NaN is left to PyTorch, whose argmax picks the NaN. Measured on a 2-core AMD EPYC (AVX2) at one thread,
a verification step's two 49,152-wide rows: ``torch.argmax`` 250 us, the signal's ``log_softmax``, ``exp`` and
``sum`` 195 us.

:func:`native_top_probs` reads a drafter's distribution for a greedy draft (:data:`~hvd_agents.runtime.greedy_rows.TopProbs`)
in one pass for the k largest and one for the sum of ``exp``, where PyTorch's ``softmax`` and ``topk`` over a draft
head's 8,192 logits took about 0.2 ms a drafted token; ties go to the lower index.
"""

from __future__ import annotations

from types import ModuleType

import torch

from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.greedy_rows import TORCH_GREEDY_ROWS, top_probs


class NativeGreedyRows:
    """:class:`~hvd_agents.runtime.greedy_rows.GreedyRows` on a native forward module's ``argmax_rows`` and
    ``token_signal``; logits other than float32 on the CPU go to PyTorch's."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def choices(self, logits: torch.Tensor) -> list[int]:
        if not _native(logits):
            return TORCH_GREEDY_ROWS.choices(logits)
        out = self._module.argmax_rows(logits)
        if -1 in out:  # a row holding a NaN: torch.argmax's choice
            return [c if c >= 0 else int(logits[r].argmax()) for r, c in enumerate(out)]
        return out

    def signal(self, logits: torch.Tensor, row: int, token: int) -> tuple[float, float]:
        if not _native(logits):
            return TORCH_GREEDY_ROWS.signal(logits, row, token)
        return self._module.token_signal(logits, row, token)


def _native(logits: torch.Tensor) -> bool:
    return logits.dtype == torch.float32 and logits.dim() == 2 and logits.device.type == "cpu"


def native_top_probs(logits: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """:func:`~hvd_agents.runtime.greedy_rows.top_probs` on the native kernels (this machine's build); a row holding
    a NaN, or logits other than float32 ``[vocab]`` on the CPU, go to PyTorch's."""
    if logits.dtype == torch.float32 and logits.dim() == 1 and logits.device.type == "cpu" and 1 <= k <= 8:
        indices, probs = native_forward.module().top_probs(logits, k)
        if indices:
            return indices, probs
    return top_probs(logits, k)
