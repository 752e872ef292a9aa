"""The grammar as a drafter: the text a request's constraint forces, drafted in the tokenizer's own tokens.

Where a constraint leaves only one way to go on (a call's opening, a schema's next key and
its punctuation, the rest of an enum value, closing brackets), that text is a draft the
target accepts almost surely: it is the target's own choice under the mask wherever the
tokenizer would write the text that way. :class:`ForcedText` wraps a request's drafter:

* a step where the grammar forces tokens drafts them (source ``"grammar"``); the next step's
  context ends with them, so the wrapped drafter then drafts what follows (a cache drafter
  copies an earlier call's argument values from there);
* otherwise the wrapped drafter drafts as it would.

The forced tokens come from :meth:`~hvd_agents.drafters.base.GrammarView.forced_tokens`:
the tokenizer's canonical tokenization of the forced text, less the last tokens that could
merge with what follows (a forced *string* is rarely a forced *token* sequence). A step
drafted from the grammar reaches the wrapped drafter's ``observe`` as a step it did not
draft (an empty draft and the emitted tokens), so its own statistics stay its own. Drafts
never decide what is emitted: the engine verifies them under the grammar like any other.

Example::

    forced = ForcedText(drafter)   # per request, when it has a constraint
    forced.start(req_id, prompt_ids, structure)
    draft = forced.propose(ctx, k) # ctx.grammar forces '{"name": "' -> Draft(those tokens, source="grammar")
"""

from __future__ import annotations

from collections.abc import Sequence

from hvd_agents.drafters.base import Draft, DraftContext, Drafter, DraftOutcome, uses_hidden_states
from hvd_agents.structure import PromptStructure

GRAMMAR_SOURCE = "grammar"


class ForcedText:
    """A request's drafter with the grammar's forced text drafted first (see the module docstring).

    Args:
        inner: the drafter of the request's method.
    """

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.uses_hidden_states = uses_hidden_states(inner)
        self._ours: set[str] = set()  # requests whose current step's draft is the grammar's

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        self.inner.start(req_id, prompt_ids, structure)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        forced = tuple(ctx.grammar.forced_tokens()[:k]) if ctx.grammar is not None else ()
        self._ours.discard(ctx.req_id)
        if not forced:
            return self.inner.propose(ctx, k)
        self._ours.add(ctx.req_id)
        return Draft(forced, score=float(len(forced)), source=GRAMMAR_SOURCE)

    def observe(self, outcome: DraftOutcome) -> None:
        if outcome.req_id in self._ours:
            outcome = DraftOutcome(outcome.req_id, Draft(), 0, outcome.new_token_ids, outcome.target_logprob,
                                   outcome.target_entropy, outcome.verify_s)
        self.inner.observe(outcome)

    def stop(self, req_id: str) -> None:
        self._ours.discard(req_id)
        self.inner.stop(req_id)
