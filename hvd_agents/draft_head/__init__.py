"""The EAGLE-style draft head: its model and its weights (training lives in :mod:`hvd_agents.distill`).

See :mod:`hvd_agents.draft_head.model` for the architecture,
:mod:`hvd_agents.distill.train` for ``hvd-agents train-drafter`` and
:class:`hvd_agents.drafters.model.head.DraftHeadDrafter` for drafting with it.
"""

from hvd_agents.draft_head.model import DraftHead, DraftHeadConfig, HeadCache, target_signature
from hvd_agents.draft_head.weights import DraftHeadError, load_head, save_head, shipped_head_for

__all__ = [
    "DraftHead",
    "DraftHeadConfig",
    "DraftHeadError",
    "HeadCache",
    "load_head",
    "save_head",
    "shipped_head_for",
    "target_signature",
]
