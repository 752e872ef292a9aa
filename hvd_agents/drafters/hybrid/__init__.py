"""The ``hvd`` method: payoff-guided choice between a cache draft, a model draft or none.

Read in this order (one step of the policy):

* :mod:`.drafter`: :class:`HybridDrafter`, whose ``propose`` is four named phases
  (cache draft and its payoff, tree growth, the model drafter, the record) and
  whose ``observe`` feeds the outcome back; the policy's overview and a worked
  example are its module docstring.
* :mod:`.pricing`: a proposal's prices, decided once at its start (:class:`~.pricing.StepPrices`),
  from :mod:`hvd_agents.policy.cost` (the one home of what a step costs) and the engine's step timings.
* :mod:`.cache_step` (phases 1-2), :mod:`.model_step` (phase 3) and :mod:`.step` (each phase's
  record, and the decision built from them).
* :mod:`.ask`: the gates: optional host work done only while it pays.
* :mod:`.tree`: growing the cache draft into a tree of alternatives (pure functions).
* :mod:`.config`: every prior, running-estimate weight and limit, in one frozen record.
* :mod:`.probe`: what a combining drafter tells a trace replay about its step.

Beside ``hvd``, the rules others ship, as drafters over the same parts
(:mod:`.combined` is their shared lifecycle): :mod:`.paper` (method ``hvd-paper``, the
HVD paper's predicted-length threshold) and :mod:`.merge` (methods ``hvd-chain`` and
``hvd-graft``: model and cache tokens merged into one draft).

What the policy needs of a model drafter is declared in
:mod:`hvd_agents.drafters.model.protocol`.
"""

from hvd_agents.drafters.hybrid.combined import CombinedDrafter
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.hybrid.drafter import HybridDrafter
from hvd_agents.drafters.hybrid.merge import ChainDrafter, GraftDrafter
from hvd_agents.drafters.hybrid.paper import PaperDrafter
from hvd_agents.drafters.hybrid.pricing import StepPricing
from hvd_agents.drafters.hybrid.probe import CacheProbe
from hvd_agents.drafters.hybrid.step import StepDecision

__all__ = ["CacheProbe", "ChainDrafter", "CombinedDrafter", "GraftDrafter", "HybridConfig", "HybridDrafter",
           "PaperDrafter", "StepDecision", "StepPricing"]
