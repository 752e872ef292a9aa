"""What the vLLM proposer is configured with, read from the environment of the vLLM process.

vLLM builds a custom proposer from its ``VllmConfig`` alone, and its speculative
config accepts no keys of ours, so the proposer's own settings come from environment
variables of the process that runs ``vllm serve`` (inherited by vLLM's engine process):

* ``HVD_VLLM_VERIFY_COST``: what verifying draft tokens costs the target, either a
  number ``c`` (a step verifying ``d`` draft tokens costs ``1 + c d`` plain steps) or
  the path of a cost profile (JSON, :meth:`~hvd_agents.policy.cost.CostModel.to_dict`,
  as ``hvd-agents`` measures one). Default: :data:`GPU_VERIFY_COST`. The proposer prices
  each step by its share of the batch (:func:`~hvd_agents.policy.cost.request_cost`).
* ``HVD_VLLM_STRUCTURE``: the file clients register prompt structure in
  (:mod:`.structure_file`). Default: none.
* ``HVD_VLLM_STORE_TOKENS``: the cross-request store's token budget. Default: 1,000,000.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel

# c of 1 + c d for one request on a GPU: verifying a few more rows of a small batch costs about nothing
# next to reading the weights once (the same order as the profiles measured on GPUs, a few hundredths).
GPU_VERIFY_COST = 0.02
DEFAULT_STORE_TOKENS = 1_000_000


@dataclass(frozen=True)
class ProposerSettings:
    """The proposer's settings (see the module docstring for the variables that set them).

    Attributes:
        cost: the target's verification cost at one request per step.
        structure_file: where clients register prompt structure (None: nowhere).
        store_tokens: the cross-request store's token budget.
    """

    cost: CostModel = field(default_factory=lambda: CostModel.linear(GPU_VERIFY_COST))
    structure_file: Path | None = None
    store_tokens: int = DEFAULT_STORE_TOKENS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProposerSettings:
        """Settings from ``HVD_VLLM_*`` variables (``os.environ`` when ``env`` is None).

        Raises:
            InvalidRequestError: a variable's value is unusable; the message names the variable.
        """
        env = os.environ if env is None else env
        cost = _cost(env.get("HVD_VLLM_VERIFY_COST", ""))
        structure = env.get("HVD_VLLM_STRUCTURE") or None
        budget = env.get("HVD_VLLM_STORE_TOKENS", "")
        try:
            tokens = int(budget) if budget else DEFAULT_STORE_TOKENS
        except ValueError:
            raise InvalidRequestError(f"HVD_VLLM_STORE_TOKENS must be an integer, got {budget!r}") from None
        if tokens <= 0:
            raise InvalidRequestError(f"HVD_VLLM_STORE_TOKENS must be positive, got {tokens}")
        return cls(cost, None if structure is None else Path(structure), tokens)


def _cost(value: str) -> CostModel:
    if not value:
        return CostModel.linear(GPU_VERIFY_COST)
    try:
        return CostModel.linear(float(value))
    except ValueError:
        pass
    path = Path(value)
    try:
        model = CostModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError(
            f"HVD_VLLM_VERIFY_COST={value!r} is neither a number nor a readable cost profile (JSON): {exc}"
        ) from None
    return model
