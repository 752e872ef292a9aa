"""hvd-agents' cache drafting and payoff policy inside vLLM, as a custom speculative proposer.

Serve a model with it (see docs/vllm.md)::

    vllm serve MODEL --speculative-config '{"method": "custom_class",
        "model": "hvd_agents.vllm.HVDProposer", "num_speculative_tokens": 16}'

* :class:`HVDProposer` (:mod:`.proposer`): the proposer vLLM builds and calls each step.
* :class:`StructureFile` (:mod:`.structure_file`): where clients register their prompts'
  structure (system prompt, tool schemas, tool-call skeletons) for the proposer.
* :class:`ProposerSettings` (:mod:`.settings`): its settings, from ``HVD_VLLM_*`` variables.

Nothing here imports vLLM: the proposer reads two fields of the config vLLM hands it, and
takes and returns plain arrays and lists.
"""

from hvd_agents.vllm.proposer import HVDProposer, ProposerStats
from hvd_agents.vllm.settings import ProposerSettings
from hvd_agents.vllm.structure_file import StructureFeed, StructureFile, digest

__all__ = ["HVDProposer", "ProposerSettings", "ProposerStats", "StructureFeed", "StructureFile", "digest"]
