"""The lifecycle shared by the drafters that pick or merge a cache draft and a model draft by a fixed rule.

:class:`CombinedDrafter` holds a cache drafter and an optional model drafter, starts,
feeds and stops both, and keeps each request's :class:`~.probe.CacheProbe` from
``propose`` to ``observe``. A subclass only writes :meth:`CombinedDrafter.choose`: the
step's draft and its probe. The paper's threshold rule (:mod:`.paper`) and the merge
baselines (:mod:`.merge`) are such subclasses; ``hvd`` (:mod:`.drafter`) prices its
choices and has its own.

``observe`` gives the cache drafter its own draft's outcome only when the step verified
a pure cache draft (otherwise an empty draft's: it indexes the new tokens without
learning from a draft it did not make), and the model drafter every outcome (it must
follow the context).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, DraftOutcome, started
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.probe import CacheProbe
from hvd_agents.drafters.model.protocol import ModelDrafter, as_model_drafter
from hvd_agents.structure import PromptStructure


@dataclass
class _CombinedRequestState:
    """One request's state between ``start`` and ``stop``."""

    probe: CacheProbe | None = None  # this step's, from propose to observe (None: no propose this step)


class CombinedDrafter:
    """A cache drafter and an optional model drafter behind one Drafter (see the module docstring).

    Args:
        cache: the cache drafter.
        model: the model drafter (None: the model arm drafts nothing).
        name: the method name, for lifecycle errors.
    """

    def __init__(self, cache: SuffixDrafter, model: Drafter | None = None, *, name: str) -> None:
        self.cache = cache
        self.model: ModelDrafter | None = as_model_drafter(model) if model is not None else None
        self.name = name
        self._requests: dict[str, _CombinedRequestState] = {}

    @property
    def uses_hidden_states(self) -> bool:
        """Whether the model drafter drafts from the target's hidden states."""
        return self.model is not None and bool(self.model.uses_hidden_states)

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        self.cache.start(req_id, prompt_ids, structure)
        if self.model is not None:
            self.model.start(req_id, prompt_ids, structure)
        self._requests[req_id] = _CombinedRequestState()

    def stop(self, req_id: str) -> None:
        self.cache.stop(req_id)
        if self.model is not None:
            self.model.stop(req_id)
        self._requests.pop(req_id, None)

    def probe(self, req_id: str) -> CacheProbe | None:
        """The probe of the step ``propose`` made for ``req_id`` and ``observe`` has not consumed (None: none)."""
        request = self._requests.get(req_id)
        return None if request is None else request.probe

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """The step's draft (at most ``k`` tokens) by :meth:`choose`.

        Raises:
            ValueError: ``ctx.req_id`` is not started.
        """
        request = started(self._requests, ctx.req_id, self.name, "propose")
        if k <= 0:
            return Draft()
        draft, request.probe = self.choose(ctx, k)
        return draft.truncated(k)

    def choose(self, ctx: DraftContext, k: int) -> tuple[Draft, CacheProbe]:
        """The draft to verify and its probe (the subclass's rule)."""
        raise NotImplementedError

    def observe(self, outcome: DraftOutcome) -> None:
        """Feed the outcome to both drafters (see the module docstring).

        Raises:
            ValueError: ``outcome.req_id`` is not started.
        """
        request = started(self._requests, outcome.req_id, self.name, "observe")
        probe, request.probe = request.probe, None
        used = probe is not None and probe.arm == "cache" and bool(outcome.draft.token_ids)
        self.cache.observe(outcome if used else DraftOutcome(outcome.req_id, Draft(), 0, outcome.new_token_ids))
        if self.model is not None:
            self.model.observe(outcome)

    def model_draft(self, ctx: DraftContext, k: int, min_survival: float | None = None) -> Draft:
        """The model drafter's chain of at most ``k`` tokens (a tree's main branch; empty without a drafter)."""
        if self.model is None or k <= 0:
            return Draft()
        return self.model.propose(ctx, k, min_survival=min_survival).main_branch()
