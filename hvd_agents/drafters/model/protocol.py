"""What the ``hvd`` policy needs of a model drafter, declared: :class:`ModelDrafter`.

A model drafter is a :class:`~hvd_agents.drafters.base.Drafter` that also says,
as plain attributes and one method, what the policy prices it by and how it may
be asked::

    drafter.uses_hidden_states   # the engine passes the target's hidden states
    drafter.acceptance_prior     # its per-token acceptance before any outcome (None: unknown)
    drafter.cost_prior           # a drafted token's cost in plain steps, before it is timed
    drafter.ingest_cost_prior    # one context token's catch-up cost in plain steps, before it is timed
    drafter.gates_first_token    # propose honours min_first (the policy may then ask it anywhere)
    drafter.pending(ctx)         # context tokens the next propose ingests before drafting
    drafter.propose(ctx, k, min_survival=None, min_first=None)

``propose`` keeps drafting while the draft's survival, by its own estimate, stays
above ``min_survival``; a drafter with ``gates_first_token`` drafts nothing when
its first token's reach is below ``min_first`` (:mod:`hvd_agents.drafters.model.loop`
implements both). The project's drafters (:class:`~.head.DraftHeadDrafter`,
:class:`~.draft_lm.DraftModelDrafter`) declare all of it.

Any other drafter works through :func:`as_model_drafter`: one that declares none
of these members is wrapped in :class:`PlainModelDrafter`, which drafts exactly
the ``k`` tokens it is asked for and counts as pending the tokens since it last
drafted; one that declares only some of them is refused (a half-declared drafter
would otherwise be priced by defaults it did not mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, DraftOutcome
from hvd_agents.structure import PromptStructure

# A drafted token's cost in the engine's plain steps before it is timed: about one drafter forward per drafted
# token (`hvd-agents bench-model` reports the shipped head's drafting per step against a target step).
DEFAULT_TOKEN_COST_PRIOR = 0.1
# What catching up on one context token costs before it is timed, in plain steps: the new tokens go through the
# drafter in one batch, so each costs a small share of a drafted token's forward.
DEFAULT_INGEST_COST_PRIOR = 0.002

# The members a ModelDrafter adds to the Drafter protocol (``uses_hidden_states`` is the base protocol's own
# optional attribute, so it does not count as declaring this one).
_MODEL_MEMBERS = ("acceptance_prior", "cost_prior", "ingest_cost_prior", "gates_first_token", "pending")


@runtime_checkable
class ModelDrafter(Drafter, Protocol):
    """A drafter the ``hvd`` policy can price and steer (see the module docstring).

    Attributes:
        uses_hidden_states: whether the engine must pass the target's hidden states.
        acceptance_prior: the per-token acceptance the policy assumes before any
            outcome (a trained head's held-out agreement with the target), or None
            when unknown (the policy's own prior is used).
        cost_prior: a drafted token's cost in the engine's plain steps until timed.
        ingest_cost_prior: one context token's catch-up cost in plain steps until timed.
        gates_first_token: ``propose`` drafts nothing when its first token's reach
            is below ``min_first``; the policy then asks it wherever no cache draft
            pays and lets its confidence decide.
    """

    uses_hidden_states: bool
    acceptance_prior: float | None
    cost_prior: float
    ingest_cost_prior: float
    gates_first_token: bool

    def pending(self, ctx: DraftContext) -> int:
        """Context tokens the next ``propose`` would ingest before drafting (what catching up costs)."""

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        """Draft at most ``k`` tokens, stopping once the draft's estimated survival falls below
        ``min_survival`` (the drafter's own default when None); with ``gates_first_token``, nothing
        when the first token's reach is below ``min_first``."""


class PlainModelDrafter:
    """Any :class:`Drafter` as a :class:`ModelDrafter`: drafts the ``k`` tokens it is asked for.

    It neither stops on survival nor gates its first token (``min_survival`` and
    ``min_first`` are ignored), so the policy asks it only where its running
    acceptance says a draft of ``k`` tokens pays. Its pending context is every
    token since it last drafted in the request (all of them before its first draft).

    Args:
        drafter: the drafter wrapped; every call is passed on to it.
        acceptance_prior: see :class:`ModelDrafter` (None: the policy's prior).
        cost_prior: see :class:`ModelDrafter`.
        ingest_cost_prior: see :class:`ModelDrafter`.

    Example (a request whose prompt has 5 tokens)::

        plain = PlainModelDrafter(my_drafter)
        plain.start("r", [1, 2, 3, 4, 5])
        plain.pending(DraftContext("r", [1, 2, 3, 4, 5], 5))   # 5: nothing drafted yet
        plain.propose(DraftContext("r", [1, 2, 3, 4, 5], 5), 3, min_survival=0.2)  # my_drafter.propose(ctx, 3)
        plain.pending(DraftContext("r", [1, 2, 3, 4, 5, 9, 8], 5))  # 2: the tokens since that draft
    """

    gates_first_token = False

    def __init__(self, drafter: Drafter, *, acceptance_prior: float | None = None,
                 cost_prior: float = DEFAULT_TOKEN_COST_PRIOR,
                 ingest_cost_prior: float = DEFAULT_INGEST_COST_PRIOR) -> None:
        self.drafter = drafter
        # the base Drafter protocol's one optional attribute, read the way the engine reads it
        self.uses_hidden_states = bool(getattr(drafter, "uses_hidden_states", False))
        self.acceptance_prior = acceptance_prior
        self.cost_prior = cost_prior
        self.ingest_cost_prior = ingest_cost_prior
        self._drafted_at: dict[str, int] = {}  # context length at the request's last draft

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        self.drafter.start(req_id, prompt_ids, structure)
        self._drafted_at[req_id] = 0

    def pending(self, ctx: DraftContext) -> int:
        return max(len(ctx.token_ids) - self._drafted_at.get(ctx.req_id, 0), 0)

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        del min_survival, min_first  # a plain drafter drafts what it is asked for
        draft = self.drafter.propose(ctx, k)
        self._drafted_at[ctx.req_id] = len(ctx.token_ids)
        return draft

    def observe(self, outcome: DraftOutcome) -> None:
        self.drafter.observe(outcome)

    def stop(self, req_id: str) -> None:
        self.drafter.stop(req_id)
        self._drafted_at.pop(req_id, None)


def as_model_drafter(drafter: Drafter, *, cost_prior: float = DEFAULT_TOKEN_COST_PRIOR,
                     ingest_cost_prior: float = DEFAULT_INGEST_COST_PRIOR) -> ModelDrafter:
    """``drafter`` itself when it is a :class:`ModelDrafter`, else wrapped in :class:`PlainModelDrafter`
    with these priors.

    Raises:
        TypeError: ``drafter`` declares some of :class:`ModelDrafter`'s members but not all of them.
    """
    if isinstance(drafter, ModelDrafter):
        return drafter
    declared = [name for name in _MODEL_MEMBERS if hasattr(drafter, name)]
    if declared:
        missing = [name for name in (*_MODEL_MEMBERS, "uses_hidden_states") if not hasattr(drafter, name)]
        raise TypeError(
            f"{type(drafter).__name__} declares {', '.join(declared)} of the ModelDrafter protocol but not "
            f"{', '.join(missing)}: declare all of it (hvd_agents.drafters.model.protocol), or none of it"
        )
    return PlainModelDrafter(drafter, cost_prior=cost_prior, ingest_cost_prior=ingest_cost_prior)
