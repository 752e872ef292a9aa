"""The ``hvd`` policy as a vLLM speculative proposer (``method: custom_class``).

vLLM (V1, the model runner of its GPU and CPU workers) builds this class from its
``VllmConfig`` and, after each step's sampling, calls::

    propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]

* ``sampled_token_ids``: per row of the persistent batch, the tokens this step added
  (the accepted draft prefix and the target's own token); empty for a row still
  prefilling its prompt in chunks.
* ``num_tokens_no_spec``: ``int32 [max_num_reqs]``, each row's context length, this
  step's tokens included.
* ``token_ids_cpu``: ``int32 [max_num_reqs, max_model_len]``, each row's tokens (the
  first ``num_tokens_no_spec[i]`` are its context).

It returns one chain of draft tokens per row (at most ``num_speculative_tokens``,
possibly none), which vLLM verifies in its next forward, greedy or by rejection
sampling: the target's output does not depend on what is drafted.

Per row this runs what the ``hvd`` method runs per request in hvd-agents' own engine
(:class:`~hvd_agents.drafters.hybrid.drafter.HybridDrafter` over a
:class:`~hvd_agents.drafters.cache.suffix.SuffixDrafter`): the suffix drafter over the
live context and a cross-request store, the payoff predictor's survival estimates,
and the length that pays at this step's price, where the price of a draft token is
what it adds to the step of ``n`` rows, in units of the row's share
(:func:`~hvd_agents.policy.cost.request_cost`). No model drafter, no trees (vLLM's
custom proposers return chains).

The call carries no request ids: rows are matched to sequences by content
(:mod:`.sequences`); a row seen for the first time is started with its context
before this step as its prompt (typed when a client registered it,
:mod:`.structure_file`), and each later call first settles the previous draft: its
accepted prefix is the common prefix of the draft and the sampled tokens, less the
last. A sequence that left the batch is stopped, which files its output in the store.

Example (one row, ``k = 4``)::

    tokens[0, :9] = [1, 5, 6, 7, 8, 9, 2, 5, 6]       # the prompt, then 6 sampled at prefill
    proposer.propose([[6]], np.array([9], np.int32), tokens)
    -> [[7, 8, 9, 2]]   # "5 6" occurred before: its continuation, kept as far as it pays
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvd_agents.chat.analyzer import register
from hvd_agents.drafters.base import Draft, DraftContext, DraftOutcome
from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.drafter import HybridDrafter
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel, request_cost
from hvd_agents.structure import SpanKind
from hvd_agents.vllm.sequences import RowMatch, SequenceTable
from hvd_agents.vllm.settings import ProposerSettings
from hvd_agents.vllm.structure_file import StructureFeed

logger = logging.getLogger(__name__)


@dataclass
class ProposerStats:
    """Running totals over the proposer's calls.

    Attributes:
        calls: ``propose`` calls.
        rows: rows that sampled tokens (one per sequence per step).
        drafted: draft tokens proposed.
        accepted: draft tokens the target accepted (of drafts it verified).
        started: sequences started (new rows).
        structures: prompt structures read from the structure file.
    """

    calls: int = 0
    rows: int = 0
    drafted: int = 0
    accepted: int = 0
    started: int = 0
    structures: int = 0


class HVDProposer:
    """A vLLM custom proposer running the ``hvd`` cache policy per sequence (see the module docstring).

    Args:
        vllm_config: vLLM's config; only ``speculative_config.num_speculative_tokens`` and
            ``model_config.max_model_len`` are read.
        settings: cost, structure file, store budget; from ``HVD_VLLM_*`` variables when None
            (:class:`~.settings.ProposerSettings`).

    Raises:
        InvalidRequestError: the config has no speculative token count, or a setting is unusable.
    """

    def __init__(self, vllm_config: Any, settings: ProposerSettings | None = None) -> None:
        spec = vllm_config.speculative_config
        if spec is None or not spec.num_speculative_tokens:
            raise InvalidRequestError("HVDProposer needs speculative_config.num_speculative_tokens (the longest draft)")
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.settings = settings if settings is not None else ProposerSettings.from_env()
        self.store = CacheStore(self.settings.store_tokens)
        self.drafter = HybridDrafter(SuffixDrafter(self.store), cost=self.settings.cost, calibrate=False, branches=0)
        self.sequences = SequenceTable()
        path = self.settings.structure_file
        self.feed = StructureFeed(path) if path is not None else None
        self.stats = ProposerStats()
        self.unregistered: dict[str, list[int]] = {}  # prompts no client registered, filed in the store on release

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load (vLLM calls this on every proposer)."""
        del args, kwargs

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One chain of draft tokens per row (see the module docstring for the arguments).

        Raises:
            ValueError: a row's context is shorter than the tokens it sampled this step.
        """
        del slot_mappings  # vLLM's attention slots: nothing a copied draft needs
        self.stats.calls += 1
        self._read_structures()
        rows = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:
                continue  # still prefilling: no token to follow yet
            n = int(num_tokens_no_spec[i])
            if n < len(sampled):
                raise ValueError(f"row {i} has {n} context tokens but sampled {len(sampled)} this step")
            rows.append((i, token_ids_cpu[i, :n], len(sampled)))
        matches, released = self.sequences.match(rows)
        for tracked in released:
            self._release(tracked.seq_id)
        step_cost = request_cost(self.settings.cost, len(matches))[0] if len(matches) > 1 else None
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        for match, (row, tokens, _) in zip(matches, rows):
            sampled = tuple(int(t) for t in sampled_token_ids[row])
            if match.new:
                self._start(match, tokens)
            self._observe(match, sampled)
            draft = self._draft(match, tokens, step_cost)
            self.sequences.settle(match, tokens, draft)
            drafts[row] = list(draft.token_ids)
        self.stats.rows += len(matches)
        return drafts

    def _read_structures(self) -> None:
        """Registered prompt structure into the store (spans and tool-call skeletons)."""
        if self.feed is None:
            return
        for structure in self.feed.poll():
            register(self.store, structure)
            self.stats.structures += 1

    def _start(self, match: RowMatch, tokens: np.ndarray) -> None:
        """Start a sequence: its prompt is its context before this step's tokens."""
        prompt = tokens[: match.tracked.prompt_len]
        structure = self.feed.structure_of(prompt) if self.feed is not None else None
        prompt_ids = prompt.tolist()
        self.drafter.start(match.tracked.seq_id, prompt_ids, structure)
        if structure is None:
            self.unregistered[match.tracked.seq_id] = prompt_ids
        self.stats.started += 1

    def _release(self, seq_id: str) -> None:
        """A sequence left the batch: its output (by the drafter) and, when no client registered its
        prompt, the prompt as one span go into the store for later requests (agents resend much of it)."""
        self.drafter.stop(seq_id)
        prompt = self.unregistered.pop(seq_id, None)
        if prompt is not None and 2 <= len(prompt) <= self.store.token_budget:
            self.store.add(prompt, SpanKind.PROMPT)

    def _observe(self, match: RowMatch, sampled: tuple[int, ...]) -> None:
        """Settle the sequence's previous draft with this step's tokens."""
        draft = match.tracked.draft
        accepted = 0
        for drafted, token in zip(draft.token_ids, sampled[:-1]):
            if drafted != token:
                break
            accepted += 1
        if accepted != len(sampled) - 1:  # tokens no verification of this draft gives: settle as a plain step
            draft, accepted = Draft(), 0
        self.stats.accepted += accepted
        self.drafter.observe(DraftOutcome(match.tracked.seq_id, draft, accepted, sampled))

    def _draft(self, match: RowMatch, tokens: np.ndarray, step_cost: CostModel | None) -> Draft:
        room = min(self.k, self.max_model_len - len(tokens) - 1)
        if room <= 0:
            return Draft()  # at the length limit: vLLM has no room to verify a draft
        # the row's tokens as they are (a view of vLLM's buffer, read during this call only): the suffix
        # drafter reads the last few dozen, so copying the whole context would cost O(context) per row
        context = DraftContext(match.tracked.seq_id, tokens, match.tracked.prompt_len, step_cost=step_cost)
        draft = self.drafter.propose(context, room)
        self.stats.drafted += len(draft)
        return draft
