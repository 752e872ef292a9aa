"""Which runner a model's forwards go through.

* a model given with its native CPU forward (a
  :class:`~hvd_agents.runtime.cpu.runner.NativeModel`: GGUF weights, int8/int4 on the CPU):
  :class:`~hvd_agents.runtime.cpu.runner.QuantRunner`;
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
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.runner import HFRunner, Runner
from hvd_agents.runtime.static.decoder import supports
from hvd_agents.runtime.static.runner import StaticRunner

logger = logging.getLogger(__name__)
RUNNER_ENV = "HVD_AGENTS_RUNNER"


def runner_for(model: torch.nn.Module, *, native: NativeModel | None = None, context_window: int | None = None,
               cost_model: CostModel | None = None) -> Runner:
    """The runner for ``model`` (see the module docstring).

    Args:
        model: the target model.
        native: ``model``'s weights in the native CPU forward (``LoadedModel.native``), when it has them.
        context_window: the most tokens a request may hold (default: the model's, or ``native``'s).
        cost_model: the verification cost profile (measured on first use when omitted).

    Raises:
        ValueError: ``native`` holds another model's weights.
    """
    if native is not None:
        if native.model is not model:
            raise ValueError("the native forward given is over another model")
        return QuantRunner(native, context_window=context_window, cost_model=cost_model)
    device = next(model.parameters()).device
    if device.type == "cuda" and os.environ.get(RUNNER_ENV, "").lower() != "hf":
        reason = supports(model)
        if reason is None:
            return StaticRunner(model, context_window=context_window, cost_model=cost_model)
        logger.info("the static GPU runner does not run this model (%s); using its own forward", reason)
    return HFRunner(model, context_window=context_window, cost_model=cost_model)
