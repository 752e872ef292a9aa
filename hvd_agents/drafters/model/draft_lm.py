"""The draft-LM drafter (method ``model`` with ``draft_model=``): a smaller causal LM drafts.

Any HuggingFace causal LM that shares the target's tokenizer (the common setup:
a 0.5B model drafting for a 7B of the same family). It keeps its own KV cache
and the tokens that cache covers; each ``propose`` keeps the cache up to the
longest common prefix with the context (so accepted draft tokens are not
recomputed, rejected ones are dropped, and a new request that extends the last
one's conversation costs only its new tokens), feeds the rest, and drafts.
Tokens outside the target's vocabulary are masked, so the reported ``q`` is a
distribution over the target's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from hvd_agents.drafters.base import Draft, DraftContext, DraftOutcome
from hvd_agents.drafters.model.loop import DEFAULT_MIN_SURVIVAL, RequestPrefix, common_prefix, draft_loop
from hvd_agents.drafters.model.protocol import DEFAULT_INGEST_COST_PRIOR, DEFAULT_TOKEN_COST_PRIOR
from hvd_agents.runtime.kv import cache_argument, new_cache, truncate
from hvd_agents.structure import PromptStructure


class DraftModelDrafter:
    """Drafts with a smaller causal LM (see the module docstring).

    A :class:`~hvd_agents.drafters.model.protocol.ModelDrafter` with no acceptance
    prior of its own (the policy's applies).

    Args:
        model: the draft model, in eval mode.
        target_vocab: the target's vocabulary size.
        min_survival: when ``propose`` is not given one (method ``model`` alone),
            drafting stops once the product of the draft model's confidences falls below it.

    Example: its cache covers ``1 2 3 4 5 6`` and the context is ``1 2 3 4 9`` (the
    draft ``5 6`` was rejected, the target chose ``9``): ``pending`` is 1, and
    ``propose`` keeps ``1 2 3 4``, feeds ``9`` for the next logits and drafts from
    there. Had the target accepted both (context ``1 2 3 4 5 6``), it would keep
    five tokens and feed ``6`` again: the last token is always fed for its logits.
    """

    uses_hidden_states = False
    gates_first_token = True  # propose honours min_first (draft_loop)
    acceptance_prior: float | None = None
    cost_prior = DEFAULT_TOKEN_COST_PRIOR
    ingest_cost_prior = DEFAULT_INGEST_COST_PRIOR
    source = "draft-lm"

    def __init__(self, model: PreTrainedModel, target_vocab: int, min_survival: float = DEFAULT_MIN_SURVIVAL) -> None:
        self.min_survival = min_survival
        self.model = model
        self.target_vocab = target_vocab
        self.device = next(model.parameters()).device
        self.context_window = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.cache: DynamicCache = new_cache(model.config)
        self._cache_arg = cache_argument(model)
        self._tokens: list[int] = []  # tokens the cache covers
        self._context = 0  # context length at the last propose (the cache's tokens before it are verified)
        self._fresh = True
        self._shared = RequestPrefix()  # the context's common prefix with the cached tokens

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        del req_id, prompt_ids, structure
        self._fresh = True
        self._shared.reset()

    def _keep(self, tokens: Sequence[int]) -> int:
        """How many of the cache's tokens ``tokens`` keeps: their common prefix, less the last token (fed
        again for its logits). Until the drafter drafts in a request the whole context is compared (once,
        :class:`RequestPrefix`); after that only the last draft's tokens can differ."""
        if self._fresh:
            shared = self._shared(self._tokens, tokens)
        else:
            base = min(self._context, len(self._tokens))
            shared = base + common_prefix(self._tokens[base:], tokens[base : len(self._tokens)])
        return min(shared, len(tokens) - 1)

    def pending(self, ctx: DraftContext) -> int:
        """Context tokens the next ``propose`` would feed before drafting (what catching up costs): the
        cache survives between requests, so an agent loop's next turn costs only its new tokens."""
        return len(ctx.token_ids) - self._keep(ctx.token_ids)

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        tokens = ctx.token_ids
        if k <= 0 or len(tokens) + k > self.context_window:
            return Draft()
        keep = self._keep(tokens)
        self._fresh = False
        truncate(self.cache, keep)
        del self._tokens[keep:]
        logits = self._feed(tokens[keep:])
        self._context = len(tokens)

        return draft_loop(
            logits,
            lambda token: self._feed([token]),
            k,
            temperature=ctx.temperature,
            generator=ctx.generator,
            min_survival=self.min_survival if min_survival is None else min_survival,
            min_first=min_first,
            to_target=None,
            target_vocab=self.target_vocab,
            source=self.source,
        )

    def _feed(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Run ``token_ids`` through the draft model; returns the last position's logits over the target vocabulary."""
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, **{self._cache_arg: self.cache}, use_cache=True, logits_to_keep=1)
        self._tokens.extend(int(t) for t in token_ids)
        logits = out.logits[0, -1, : self.target_vocab]
        if logits.shape[0] < self.target_vocab:  # a smaller draft vocabulary: the rest has q = 0
            logits = torch.cat([logits, logits.new_full((self.target_vocab - logits.shape[0],), float("-inf"))])
        return logits

    def observe(self, outcome: DraftOutcome) -> None:
        del outcome  # the context arrives with the next propose

    def stop(self, req_id: str) -> None:
        del req_id
