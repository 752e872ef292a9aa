"""A drafter wrapped to time its calls, for the benchmarks (its drafts and outputs unchanged).

>>> from hvd_agents.drafters import NoDrafter
>>> timed = TimedDrafter(NoDrafter())
>>> timed.start("r", [1, 2]); len(timed.propose(DraftContext("r", [1, 2], 2), 4)), timed.calls
(0, 1)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from hvd_agents.drafters import Draft, DraftContext, Drafter, DraftOutcome, HybridDrafter, uses_hidden_states
from hvd_agents.structure import PromptStructure


class TimedDrafter:
    """A drafter wrapped to time ``propose`` and ``observe`` and collect each step's accepted length.

    Attributes:
        propose_s: seconds in ``propose`` (drafting and, for ``hvd``, the policy's decision).
        calls: ``propose`` calls.
        observe_s: seconds in ``observe`` (index updates, online learning).
        verify_s: the engine's verification seconds, from the outcomes.
        model_draft_s: seconds ``hvd``'s model drafter took inside ``propose``.
        accepted_lengths: accepted tokens of each step that verified a draft.
    """

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        """Zero every figure."""
        self.propose_s = self.observe_s = self.verify_s = self.model_draft_s = 0.0
        self.calls = 0
        self.accepted_lengths: list[int] = []

    @property
    def uses_hidden_states(self) -> bool:
        return uses_hidden_states(self.inner)

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        self.inner.start(req_id, prompt_ids, structure)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        begun = time.perf_counter()
        draft = self.inner.propose(ctx, k)
        self.propose_s += time.perf_counter() - begun
        self.calls += 1
        if isinstance(self.inner, HybridDrafter):  # hvd's step: the seconds its model drafter took
            decision = self.inner.decision(ctx.req_id)
            self.model_draft_s += decision.draft_s if decision is not None else 0.0
        return draft

    def observe(self, outcome: DraftOutcome) -> None:
        begun = time.perf_counter()
        self.inner.observe(outcome)
        self.observe_s += time.perf_counter() - begun
        self.verify_s += outcome.verify_s
        if outcome.draft.token_ids:
            self.accepted_lengths.append(outcome.num_accepted)

    def stop(self, req_id: str) -> None:
        self.inner.stop(req_id)
