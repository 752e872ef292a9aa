"""Method ``hvd-paper``: the HVD paper's rule, a predicted accepted length against a threshold.

Each step the cache drafter proposes its whole draft (up to ``k`` tokens); the paper's
MLP (:class:`~hvd_agents.policy.paper.PaperMLP`) predicts its accepted length from the
pre-verification features (:class:`~hvd_agents.policy.paper.PaperFeatures`); the whole
cache draft is verified when the prediction exceeds the threshold (6), else the model
drafter drafts (at most ``model_tokens``, stopping on its own survival like method
``model``), else the step is plain. No cost model, no length choice: the rule as the
paper states it, beside ``hvd``.

Worked example: a 16-token draft predicted to keep 11 tokens is verified whole; one
predicted to keep 2 is dropped for the draft head's draft.
"""

from __future__ import annotations

from collections.abc import Callable

from hvd_agents.drafters.base import Draft, DraftContext, Drafter
from hvd_agents.drafters.cache.suffix import SuffixDrafter
from hvd_agents.drafters.hybrid.combined import CombinedDrafter
from hvd_agents.drafters.hybrid.probe import CacheProbe
from hvd_agents.policy.paper import PAPER_THRESHOLD, PaperFeatures, PaperMLP, TokenClasses

MODEL_TOKENS = 6  # the model arm's most tokens (method ``model``'s draft length)


class PaperDrafter(CombinedDrafter):
    """The paper's threshold rule over a cache drafter and an optional model drafter.

    Args:
        cache: the cache drafter.
        predictor: the paper's MLP (the packaged weights when None).
        model: the model drafter asked when the cache draft is not predicted to pay.
        threshold: verify the cache draft iff its predicted accepted length exceeds this.
        classes: the tokenizer's punctuation and bracket ids, or a callable giving them on first use
            (none when None: the flags are 0).
        model_tokens: most tokens of a model draft.
    """

    def __init__(self, cache: SuffixDrafter, predictor: PaperMLP | None = None, *, model: Drafter | None = None,
                 threshold: float = PAPER_THRESHOLD, classes: TokenClasses | Callable[[], TokenClasses] | None = None,
                 model_tokens: int = MODEL_TOKENS) -> None:
        super().__init__(cache, model, name="hvd-paper")
        self.predictor = predictor if predictor is not None else PaperMLP.default()
        self.threshold = threshold
        self._classes = classes if classes is not None else TokenClasses()
        self.model_tokens = model_tokens

    @property
    def classes(self) -> TokenClasses:
        """The token classes (built on first use when given as a callable)."""
        if callable(self._classes):
            self._classes = self._classes()
        return self._classes

    def predict(self, ctx: DraftContext, cached: Draft) -> float:
        """The predicted accepted length of the whole cache draft ``cached``."""
        flags = self.classes.flags(ctx.token_ids[-1] if ctx.token_ids else None, cached.token_ids[0])
        return self.predictor.predict_one(PaperFeatures.of(cached.features, cached.score, len(cached), flags))

    def choose(self, ctx: DraftContext, k: int) -> tuple[Draft, CacheProbe]:
        cached = self.cache.propose(ctx, k)
        predicted = self.predict(ctx, cached) if cached.token_ids else None
        if predicted is not None and predicted > self.threshold:
            return cached, CacheProbe(cached.token_ids, predicted, "cache")
        drafted = self.model_draft(ctx, min(k, self.model_tokens))
        return drafted, CacheProbe(cached.token_ids, predicted, "model" if drafted.token_ids else "none")
