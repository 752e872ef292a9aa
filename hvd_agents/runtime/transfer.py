"""Host values to the device without a synchronisation.

A plain ``torch.tensor(values, device="cuda")`` copies from pageable memory, which makes
the host wait for the GPU's queue: one stall per call, several per decode step. Here the
values go through page-locked memory and an asynchronous copy on the current stream, so
the host returns at once and the copy is ordered before the kernels that read it. On the
CPU (and other devices) it is an ordinary tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: Sequence[int] | Sequence[float], device: torch.device,
              dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``values`` as a ``[len(values)]`` tensor on ``device``, copied asynchronously to a GPU.

    >>> to_device([1, 2, 3], torch.device("cpu")).tolist()
    [1, 2, 3]
    """
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    # The caching host allocator keeps the pinned block alive until the copy's stream has passed it.
    return host.pin_memory().to(device, non_blocking=True)
