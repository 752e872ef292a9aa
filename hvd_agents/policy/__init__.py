"""The HVD policy: predict a draft's payoff before verifying it, and spend verification where it pays.

* :mod:`~hvd_agents.policy.features`: the feature rows of a draft's positions.
* :mod:`~hvd_agents.policy.payoff`: the payoff predictor (hazard model, shipped
  weights, online per-session adaptation).
* :mod:`~hvd_agents.policy.cost`: the target's cost model (measured per model and
  machine, cached), the fallback ``c`` where none is measured, a request's share of a
  batched step: the one home of what a step costs.
* :mod:`~hvd_agents.policy.calibration`: that profile as the engine pays it,
  calibrated online against the steps' timings (the engine's verification seconds plus the
  policy's own time).
* :mod:`~hvd_agents.policy.selection`: the choice of draft and length that maximises
  expected tokens per unit of cost.
* :mod:`~hvd_agents.policy.train`: offline training and evaluation
  (``hvd-agents train-payoff``).

The drafter that puts them together is :class:`hvd_agents.drafters.hybrid.drafter.HybridDrafter`
(method ``hvd``).
"""

from hvd_agents.policy.cost import FALLBACK_VERIFY_COST, CostModel, request_cost
from hvd_agents.policy.payoff import PayoffPredictor, PayoffWeights, PayoffWeightsError
from hvd_agents.policy.selection import Choice, RateEstimate, best_length

__all__ = ["FALLBACK_VERIFY_COST", "Choice", "CostModel", "PayoffPredictor", "PayoffWeights", "PayoffWeightsError",
           "RateEstimate", "best_length", "request_cost"]
