"""The ``hvd`` method: payoff-guided choice between a cache draft, a model draft or none."""

from hvd_agents.drafters.hybrid.drafter import HybridDrafter

__all__ = ["HybridDrafter"]
