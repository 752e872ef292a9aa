"""Linear layers held in oneDNN's packed layout (the ``packed`` CPU kernel), and the float32-CPU check
every CPU kernel makes of its weights and inputs."""

from __future__ import annotations

import torch
from torch import nn


def require_float32_cpu(tensor: torch.Tensor, owner: str, what: str) -> None:
    """Raise ``ValueError`` naming ``owner`` unless ``tensor`` is float32 on the CPU (what the CPU kernels compute)."""
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
        raise ValueError(f"{owner} takes float32 CPU {what}, not {tensor.dtype} on {tensor.device}")


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` held in oneDNN's packed layout (float32, CPU, inference only).

    Attributes:
        in_features, out_features: as for ``nn.Linear``.
        weight: the dense weight, kept only when ``keep_dense`` (else None).
    """

    def __init__(self, linear: nn.Linear, *, keep_dense: bool = False) -> None:
        super().__init__()
        weight = linear.weight.detach()
        require_float32_cpu(weight, "PackedLinear", "weights")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight if keep_dense else None
        self.bias = linear.bias
        self._packed = weight.contiguous().to_mkldnn()
        self._packed_bias = None if linear.bias is None else linear.bias.detach().contiguous().to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_float32_cpu(x, "PackedLinear", "inputs")
        out = torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), self._packed, self._packed_bias)
        return out.to_dense()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed"
