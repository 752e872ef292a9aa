"""Which runner a model's forwards go through.

* a model with a native CPU forward attached (GGUF weights, int8/int4 on the CPU):
  :class:`~hvd_agents.runtime.quant_runner.QuantRunner`;
* a supported model (:func:`~hvd_agents.runtime.static.decoder.supports`) on CUDA:
  :class:`~hvd_agents.runtime.static.runner.StaticRunner`, the static KV cache and
  captured decode steps;
* anything else: :class:`~hvd_agents.runtime.runner.HFRunner`, the model's own forward.

``HVD_AGENTS_RUNNER=hf`` keeps the HF runner on CUDA (for comparison, or for a model
the static decoder runs differently from its own forward).
"""

from __future__ import annotations

import logging
import os

import torch

from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.quant_runner import QuantRunner, attached
from hvd_agents.runtime.runner import HFRunner, Runner
from hvd_agents.runtime.static.decoder import supports
from hvd_agents.runtime.static.runner import StaticRunner

logger = logging.getLogger(__name__)
RUNNER_ENV = "HVD_AGENTS_RUNNER"


def runner_for(model: torch.nn.Module, *, context_window: int | None = None,
               cost_model: CostModel | None = None) -> Runner:
    """The runner for ``model`` (see the module docstring)."""
    if attached(model) is not None:
        return QuantRunner(model, context_window=context_window, cost_model=cost_model)
    device = next(model.parameters()).device
    if device.type == "cuda" and os.environ.get(RUNNER_ENV, "").lower() != "hf":
        reason = supports(model)
        if reason is None:
            return StaticRunner(model, context_window=context_window, cost_model=cost_model)
        logger.info("the static GPU runner does not run this model (%s); using its own forward", reason)
    return HFRunner(model, context_window=context_window, cost_model=cost_model)
