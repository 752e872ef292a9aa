"""The draft-head drafter (method ``model`` with a head): drafts from the target's hidden states.

It keeps the head's KV cache over the verified context, one entry per sequence
index ``t`` (the pair ``(h_t, x_{t+1})``, see :mod:`hvd_agents.draft_head.model`).
Each ``propose``:

1. ingests the indices verified since the last call, with the target's hidden
   states the engine passes in :class:`~hvd_agents.drafters.base.DraftContext`
   (the last one, ``(h_{n-1}, x_n)``, yields the logits of the first draft token);
2. drafts autoregressively at the feature level, feeding its predicted feature
   back with each drafted token;
3. crops its cache back to the verified entries (predicted features are never
   kept, even for tokens the target later accepts: their true hidden states
   arrive with the next call).

The cache survives between requests: an entry depends only on the tokens up to
its index, so the next request keeps every entry inside the longest common
token prefix (an agent loop's growing conversation costs only its new tokens).
Where the engine reused a prefix KV and the head has no entries for it, the
head starts from the first position whose hidden state it is given.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from hvd_agents.draft_head.model import DraftHead, HeadCache
from hvd_agents.drafters.base import Draft, DraftContext, DraftOutcome
from hvd_agents.drafters.model.loop import DEFAULT_MIN_SURVIVAL, FIRST_ALTERNATIVES, RequestPrefix, draft_loop
from hvd_agents.drafters.model.protocol import DEFAULT_INGEST_COST_PRIOR, DEFAULT_TOKEN_COST_PRIOR
from hvd_agents.runtime.cpu.greedy_rows import native_top_probs
from hvd_agents.runtime.greedy_rows import top_probs
from hvd_agents.structure import PromptStructure


class DraftHeadDrafter:
    """Drafts with an attached :class:`~hvd_agents.draft_head.model.DraftHead` (see the module docstring).

    A :class:`~hvd_agents.drafters.model.protocol.ModelDrafter`: its acceptance prior
    is the head's held-out agreement with the target (from its training recipe).

    Args:
        head: the attached head.
        min_survival: when ``propose`` is not given one (method ``model`` alone),
            drafting stops once the product of the head's confidences falls below it.
        alternatives: greedy drafts carry up to this many other likely first tokens
            (see :func:`~hvd_agents.drafters.model.loop.draft_loop`); 0 drafts chains only.

    Example: after a prompt of 7 tokens with their hidden states ``h_0 .. h_5``, the
    first ``propose(ctx, 4)`` ingests indices 0..5 (``pending`` says 6), then drafts
    up to 4 tokens at the feature level; the next step ingests only the tokens the
    target emitted since (their hidden states arrive with it).
    """

    uses_hidden_states = True
    gates_first_token = True  # propose honours min_first (draft_loop)
    cost_prior = DEFAULT_TOKEN_COST_PRIOR
    ingest_cost_prior = DEFAULT_INGEST_COST_PRIOR
    source = "head"

    def __init__(self, head: DraftHead, min_survival: float = DEFAULT_MIN_SURVIVAL,
                 alternatives: int = FIRST_ALTERNATIVES) -> None:
        self.min_survival = min_survival
        self.alternatives = alternatives
        if head.embed is None:
            raise ValueError("the draft head must be attached to its target (DraftHead.attach) first")
        self.head = head
        self.acceptance_prior: float | None = head.acceptance_prior
        self.cache = HeadCache()
        self._tokens: list[int] = []  # tokens the cache's entries were built from
        self._fresh = True  # first propose of a request: compare with the cached tokens
        self._shared = RequestPrefix()  # the context's common prefix with the cached tokens

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        del req_id, prompt_ids, structure
        self._fresh = True
        self._shared.reset()

    def _catch_up(self, ctx: DraftContext) -> tuple[int, int, int]:
        """``(shared, kept, first)``: tokens shared with what the cache was built from, the cache
        entries still valid, and the first index to ingest."""
        shared = self._shared(self._tokens, ctx.token_ids) if self._fresh else len(self._tokens)
        kept = bisect.bisect_left(self.cache.positions, shared - 1)  # entries t <= shared - 2 stay valid
        first = max(self.cache.positions[kept - 1] + 1 if kept else 0, ctx.hidden_start)
        return shared, kept, first

    def pending(self, ctx: DraftContext) -> int:
        """Context indices the next ``propose`` would ingest before drafting (what catching up costs)."""
        return max(len(ctx.token_ids) - 1 - self._catch_up(ctx)[2], 0)

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        hidden = ctx.hidden_states
        tokens = ctx.token_ids
        n = len(tokens) - 1  # verified indices are t <= n - 1 (x_n has no hidden state yet)
        if hidden is None or k <= 0 or n < 1:
            return Draft()
        shared, kept, first = self._catch_up(ctx)
        self._fresh = False
        self.cache.crop(kept)
        if first > n - 1:  # nothing new: run the last verified entry again for its output
            if not kept or self.cache.positions[-1] != n - 1:
                return Draft()
            self.cache.crop(kept - 1)
            first = n - 1
        rows = hidden[first - ctx.hidden_start : n - ctx.hidden_start]  # [n - first, d]: h_first .. h_{n-1}
        if rows.shape[0] != n - first:
            return Draft()
        head = self.head
        device = head.draft_vocab.device
        next_tokens = torch.tensor(list(tokens[first + 1 : n + 1]), device=device)
        predicted, logits = head.step(rows.to(head.fc.weight.dtype), next_tokens, list(range(first, n)), self.cache)
        if shared < len(self._tokens):
            del self._tokens[shared:]
        self._tokens.extend(tokens[len(self._tokens) :])  # within a request only the new tokens are copied
        verified = len(self.cache)
        state = {"feature": predicted[-1:], "position": n}

        def advance(token: int) -> torch.Tensor:
            feature, step_logits = head.step(
                state["feature"], torch.tensor([token], device=device), [state["position"]], self.cache
            )
            state["feature"], state["position"] = feature, state["position"] + 1
            return step_logits

        try:
            return draft_loop(
                logits,
                advance,
                k,
                temperature=ctx.temperature,
                generator=ctx.generator,
                min_survival=self.min_survival if min_survival is None else min_survival,
                min_first=min_first,
                to_target=head.draft_vocab,
                target_vocab=head.config.target_vocab_size,
                source=self.source,
                alternatives=self.alternatives,
                top=native_top_probs if head.lm_matrix is not None else top_probs,  # logits from the native kernels
            )
        finally:
            self.cache.crop(verified)

    def observe(self, outcome: DraftOutcome) -> None:
        del outcome  # the verified tokens and their hidden states arrive with the next propose

    def stop(self, req_id: str) -> None:
        del req_id
