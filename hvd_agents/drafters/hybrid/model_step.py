"""Phase 3 of an ``hvd`` step: whether the model drafter is asked, and its draft when it drafts.

Where no cache draft pays, a drafter that gates its first token on its own confidence
may be asked (one drafter forward buys a per-step judgement instead of the running average
acceptance) while asking pays (:class:`~.ask.Gate`); it drafts iff its confidence ``p`` in
its first token makes the step beat the best other choice (``1 + p - R * verify(1) > best``),
then goes on while further tokens pay. Any other drafter runs only where its running
per-token acceptance in the request says its best length beats the best draft so far,
the context it must catch up on included. Every ask is timed into :mod:`.pricing`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from hvd_agents.drafters.base import DraftContext
from hvd_agents.drafters.hybrid.ask import Gate
from hvd_agents.drafters.hybrid.pricing import StepPrices, StepPricing
from hvd_agents.drafters.hybrid.step import Candidate, ModelStep
from hvd_agents.drafters.model.protocol import ModelDrafter
from hvd_agents.policy.selection import Choice, best_length


def model_survival(acceptance: float, n: int) -> np.ndarray:
    """``[n]``: the chance a model draft survives its first 1..n tokens at a running per-token ``acceptance``."""
    return np.cumprod(np.full(n, acceptance))


def ask_model(model: ModelDrafter | None, ctx: DraftContext, k: int, best: Candidate, prices: StepPrices, *,
              acceptance: float, caught_up: bool, ask: Gate, pricing: StepPricing,
              clock: Callable[[], float]) -> ModelStep:
    """The step's best candidate once the model drafter (None: there is none) was asked or passed over (see the
    module docstring): its draft where it drafted, else ``best`` (the cache's or a plain step's), with the seconds it
    took and a gated ask's cost. ``acceptance``: the drafter's running per-token acceptance in the request;
    ``caught_up``: it drafted at the step before; ``ask``: the gate of asking a gated drafter with nothing better
    to verify; ``pricing``: where the ask is timed, by ``clock``."""
    if model is None:
        return ModelStep(best)
    rate = prices.rate
    gated = model.gates_first_token and best.source == "none"
    if gated and prices.batched and 2.0 - rate * float(prices.model_cost.verify(1)) <= best.choice.value:
        return ModelStep(best)  # in a batch whose rows are dear, not even a certain first token would pay
    choice = None
    if not gated:
        choice = best_length(model_survival(acceptance, k), prices.model_cost, rate)
        if choice.length <= 0:
            return ModelStep(best)
    pending = model.pending(ctx)
    catch_up = pending * prices.ingest / prices.share  # the context to ingest first
    if choice is not None and choice.value - rate * catch_up <= best.choice.value:
        return ModelStep(best)
    ask_cost = None
    if gated:  # the forward and the catch-up are spent whether or not it drafts: ask only where asking pays
        # the reply's tokens that piled up while the drafter was not asked are not charged to the ask: each
        # skipped step would raise the next ask's price about as fast as the gain recovers, locking the drafter
        # out for the rest of the reply, and they are few and cheap (the prompt's part, a one-time debt, is charged)
        prompt_pending = max(0, ctx.num_prompt_tokens - (len(ctx.token_ids) - pending))
        ask_cost = prices.draft_token + prompt_pending * prices.ingest / prices.share
        if not ask.pays(rate, ask_cost):
            ask.skipped()
            return ModelStep(best)
    # a further token is worth its cost iff S > R * marginal (whether to draft at all was decided above, so the
    # first token's dearer share of the cost is not charged to the tokens after it)
    min_survival = rate * float(prices.model_cost.marginal(2)[-1])
    drafting = clock()
    if model.gates_first_token:
        # by its first token the drafter's forward is spent: the token is drafted iff, at the drafter's
        # confidence p, the step beats the best other choice: 1 + p - R * verify(1) > best
        min_first = best.choice.value - 1.0 + rate * float(prices.cost.verify(1))
        proposed = model.propose(ctx, k, min_survival=min_survival, min_first=min_first)
    else:
        proposed = model.propose(ctx, choice.length, min_survival=min_survival)
    draft_s = clock() - drafting
    pricing.observe_model_draft(draft_s, proposed.main_length, pending, caught_up=caught_up)
    if not proposed.token_ids:
        return ModelStep(best, draft_s, ask_cost)
    survival = model_survival(acceptance, proposed.main_length)
    expected = 1.0 + float(survival.sum())
    step_cost = float(prices.model_cost.verify(len(proposed))) + catch_up
    choice = Choice(len(proposed), expected, step_cost, expected - rate * step_cost)
    draft = replace(proposed, survival=tuple(float(p) for p in survival))
    return ModelStep(Candidate("model", choice, draft), draft_s, ask_cost)
