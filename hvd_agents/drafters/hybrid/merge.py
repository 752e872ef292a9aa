"""Merge baselines: one draft made of model and cache tokens, by the rules others ship.

* :class:`ChainDrafter` (method ``hvd-chain``; FastDeploy's ``mtp_strategy:
  with_ngram``): the model drafter drafts ``model_tokens`` tokens, then the cache
  drafter continues from the context extended by them, up to ``k`` tokens in all.
  Without a model draft, the cache draft alone.
* :class:`GraftDrafter` (method ``hvd-graft``; SGLang's hybrid MTP + n-gram retrieval):
  the model drafter's confident prefix (its draft while its own survival, the product
  of its confidences, stays at or above ``confidence``); the cache draft is grafted
  on when it agrees with that prefix and goes further (the draft is then the cache
  draft, whose first tokens are the prefix); otherwise the prefix alone. Without a
  confident model token, the cache draft alone. (SGLang keeps the model's whole chain
  when the retrieval disagrees; here the model drafter stops at its confident prefix.)

Both merge only under greedy decoding. Under sampling a model draft's tokens are
drawn from its ``q``, and a merged draft would need ``q`` to describe every drafted
token as drawn given the ones before it; the model draft is verified alone there.
Either way verification accepts exactly what the target would have produced.

Worked example (greedy): the model drafts ``[5, 9]`` confidently and the cache drafter
proposes ``[5, 9, 4, 4, 7]``: the graft verifies ``[5, 9, 4, 4, 7]``; the chain
looks up what followed ``... 5 9`` in the cache and appends it to ``[5, 9]``.
"""

from __future__ import annotations

from dataclasses import replace

from hvd_agents.drafters.base import Draft, DraftContext, Drafter
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.combined import CombinedDrafter
from hvd_agents.drafters.hybrid.probe import CacheProbe

CHAIN_MODEL_TOKENS = 2  # FastDeploy's example: two MTP tokens, then n-gram tokens
GRAFT_MODEL_TOKENS = 6
GRAFT_CONFIDENCE = 0.5


def _arm(draft: Draft, default: str) -> str:
    return default if draft.token_ids else "none"


class ChainDrafter(CombinedDrafter):
    """Model draft, then the cache drafter's continuation of it (see the module docstring)."""

    def __init__(self, cache: SuffixDrafter, model: Drafter | None = None, *,
                 model_tokens: int = CHAIN_MODEL_TOKENS) -> None:
        super().__init__(cache, model, name="hvd-chain")
        self.model_tokens = model_tokens

    def choose(self, ctx: DraftContext, k: int) -> tuple[Draft, CacheProbe]:
        cached = self.cache.propose(ctx, k)
        drafted = self.model_draft(ctx, min(k, self.model_tokens), min_survival=0.0)
        if not drafted.token_ids:
            return cached, CacheProbe(cached.token_ids, None, _arm(cached, "cache"))
        if ctx.temperature > 0.0 or len(drafted) >= k:
            return drafted, CacheProbe(cached.token_ids, None, "model")
        extended = replace(ctx, token_ids=[*ctx.token_ids, *drafted.token_ids], hidden_states=None)
        continued = self.cache.propose(extended, k - len(drafted))
        if not continued.token_ids:
            return drafted, CacheProbe(cached.token_ids, None, "model")
        merged = Draft(drafted.token_ids + continued.token_ids, None, drafted.score, "chain:model+cache")
        return merged, CacheProbe(cached.token_ids, None, "merged")


class GraftDrafter(CombinedDrafter):
    """The model's confident prefix with the agreeing cache draft grafted on (see the module docstring)."""

    def __init__(self, cache: SuffixDrafter, model: Drafter | None = None, *,
                 model_tokens: int = GRAFT_MODEL_TOKENS, confidence: float = GRAFT_CONFIDENCE) -> None:
        super().__init__(cache, model, name="hvd-graft")
        self.model_tokens = model_tokens
        self.confidence = confidence

    def choose(self, ctx: DraftContext, k: int) -> tuple[Draft, CacheProbe]:
        cached = self.cache.propose(ctx, k)
        prefix = self.model_draft(ctx, min(k, self.model_tokens), min_survival=self.confidence)
        if not prefix.token_ids:
            return cached, CacheProbe(cached.token_ids, None, _arm(cached, "cache"))
        if ctx.temperature > 0.0:
            return prefix, CacheProbe(cached.token_ids, None, "model")
        n = len(prefix)
        if len(cached) > n and cached.token_ids[:n] == prefix.token_ids:
            grafted = Draft(cached.token_ids, None, cached.score, "graft:model+cache")
            return grafted, CacheProbe(cached.token_ids, None, "merged")
        return prefix, CacheProbe(cached.token_ids, None, "model")
