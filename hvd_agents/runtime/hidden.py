"""The target's last-layer hidden states of a request, for drafters that draft from them.

A model drafter in the EAGLE style (:mod:`hvd_agents.drafters.model.head`) needs
the target's final hidden state of every token the target has processed. The
engine asks the model for them only when the request's drafter says
``uses_hidden_states``; the rows of the prefilled prompt and of every accepted
token are appended here (rejected draft positions never are), so row ``i`` is
position ``start + i`` of the request's tokens. Positions before ``start`` came
from a reused prefix KV cache and have no hidden state.
"""

from __future__ import annotations

import torch


class HiddenStateBuffer:
    """Append-only ``[length, hidden]`` rows, grown by doubling (amortised O(1) per row).

    Example:
        >>> buf = HiddenStateBuffer(start=3)
        >>> buf.extend(torch.ones(2, 4)); buf.extend(torch.zeros(1, 4))
        >>> buf.view().shape, buf.start
        (torch.Size([3, 4]), 3)
    """

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self._data: torch.Tensor | None = None
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def extend(self, rows: torch.Tensor) -> None:
        """Append ``rows`` (``[n, hidden]``)."""
        n = rows.shape[0]
        if n == 0:
            return
        if self._data is None or self._length + n > self._data.shape[0]:
            capacity = max(64, 2 * (self._length + n))
            grown = torch.empty(capacity, rows.shape[1], dtype=rows.dtype, device=rows.device)
            if self._data is not None:
                grown[: self._length] = self._data[: self._length]
            self._data = grown
        self._data[self._length : self._length + n] = rows
        self._length += n

    def view(self) -> torch.Tensor | None:
        """The rows so far (a view; do not write), or None when empty."""
        return None if self._data is None else self._data[: self._length]
