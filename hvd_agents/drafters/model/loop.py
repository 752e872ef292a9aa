"""What every model drafter shares: drawing draft tokens and the draft loop.

A model drafter proposes tokens from its own distribution ``q``. Under greedy
decoding it drafts ``argmax q`` and reports no ``q`` (a deterministic draft is a
point mass, which greedy verification does not read). Under sampling it samples
each token from ``softmax(logits / T)`` with the request's generator and reports
that ``q`` over the target's vocabulary, so speculative sampling keeps the
target's distribution exactly.

The loop stops early when the drafter's own estimate that the whole draft so
far survives, the product of its per-token confidences (each the top
probability of its distribution, decided before the token is drawn: a stop
that depended on the drawn token would change the proposal distribution and
break exactness), falls below ``min_survival`` (the hybrid policy sets it to the marginal cost of a token
times the running rate): model drafts cost forwards, so tokens unlikely to be
accepted are not worth drafting. The forward that would give the next
distribution is itself skipped when the draft could only go on if the next
token were more likely than this one (``survival * confidence <
min_survival``): a forward whose distribution could not be used is not run.

Under greedy decoding the draft also carries the drafter's next most likely
first tokens (up to :data:`FIRST_ALTERNATIVES`, each as likely as
``min_survival``) as alternatives to its first token: a tree draft whose extra
tokens cost the target almost nothing to verify and no drafting forward at all.

Whether to draft at all is decided at the first token, on its *reach*: the
chance that some first token of the draft is the target's (the confidence,
plus under greedy decoding the alternatives' probabilities). The draft is empty
when the reach is below ``min_first`` (the hybrid policy sets it to what a first
token must be worth for the step to beat its other choices; ``min_survival``
when not given). The reach is a property of the distribution, so this too is
decided before any token is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hvd_agents.drafters.base import Draft
from hvd_agents.policy.features import ModelDraftFeatures
from hvd_agents.runtime.greedy_rows import TopProbs, top_probs

# Used by method ``model`` alone and by ``hvd-paper``'s model drafts (no policy to set it): stop once the drafter
# gives the whole draft less than this chance of surviving. About what a drafted token costs against what an
# accepted one saves on the 2-core CPU (a head step is ~0.23 of a target step inside the engine, a verified token
# ~0.1): 0.3 beat 0.1 and 0.5 with the shipped head on chat and agent prompts (docs/drafters.md).
DEFAULT_MIN_SURVIVAL = 0.3
FIRST_ALTERNATIVES = 3  # greedy drafts: other likely first tokens verified alongside the first


def distribution(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, float]:
    """The drafter's sampling distribution over ``[V']`` logits (tempered) and its confidence, the
    probability of its most likely token: a property of the distribution, never of a sample, so
    deciding from it whether to draft keeps sampling exact."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return probs, float(probs.max())


def draft_loop(
    logits: torch.Tensor,
    advance: Callable[[int], torch.Tensor],
    k: int,
    *,
    temperature: float,
    generator: torch.Generator | None,
    min_survival: float,
    min_first: float | None = None,
    to_target: Sequence[int] | torch.Tensor | None,
    target_vocab: int,
    source: str,
    alternatives: int = FIRST_ALTERNATIVES,
    top: TopProbs = top_probs,
) -> Draft:
    """Draft up to ``k`` tokens, starting from the next-token ``logits`` ``[V']``.

    Args:
        advance: feeds a drafted target id to the drafter and returns the next ``[V']`` logits.
        to_target: maps a logits index to a target id (a reduced draft
            vocabulary); None when indices are target ids.
        target_vocab: the target's vocabulary size (the width of reported q rows).
        min_survival: a further token is drafted while the draft's survival stays above it.
        min_first: nothing is drafted when the first token's reach is below it (default ``min_survival``).
        alternatives: greedy only: most other first tokens added as a tree's siblings of the first.
        top: greedy only: reads a distribution's most likely indices and probabilities
            (:func:`~hvd_agents.runtime.greedy_rows.top_probs`'s contract; a drafter on native kernels gives its own).
    """
    greedy = temperature <= 0.0
    tokens: list[int] = []
    q_rows: list[torch.Tensor] = []
    others: list[int] = []
    survival = 1.0
    for i in range(k):
        width = 1 + alternatives if i == 0 and alternatives > 0 and k > 1 else 1
        if greedy:
            indices, values = top(logits, min(width, logits.shape[0]))
            confidence, probs = values[0], None
        else:
            probs, confidence = distribution(logits, temperature)
        if i == 0:
            reach = confidence  # the chance that some first token is the target's
            if greedy and width > 1:
                others = [index for index, p in zip(indices[1:], values[1:]) if p >= min_survival]
                reach += sum(p for p in values[1:] if p >= min_survival)
            if reach < (min_survival if min_first is None else min_first):  # decided before drawing
                others = []
                break
        elif survival * confidence < min_survival:  # decided before drawing: the token drawn must not decide it
            break
        survival *= confidence
        if greedy:  # the argmax: q is a point mass, not reported
            index = indices[0]
        else:
            index = int(torch.multinomial(probs, 1, generator=generator))
            q_rows.append(_to_target_vocab(probs, to_target, target_vocab))
        tokens.append(index if to_target is None else int(to_target[index]))
        if i + 1 < k:
            if survival * confidence < min_survival:  # the next token would have to beat this one's odds
                break
            logits = advance(tokens[-1])
    probs = torch.stack(q_rows) if q_rows else None
    features = ModelDraftFeatures(survival, len(tokens))
    if not others:
        return Draft(tuple(tokens), probs, survival, source, features)
    chain = list(range(-1, len(tokens) - 1))
    extra = [index if to_target is None else int(to_target[index]) for index in others]
    return Draft(tuple(tokens + extra), None, survival, source, features, tuple(chain + [-1] * len(extra)))


def _to_target_vocab(probs: torch.Tensor, to_target: Sequence[int] | torch.Tensor | None, target_vocab: int) -> torch.Tensor:
    """``q`` over the target's vocabulary (zero outside the drafter's)."""
    if to_target is None and probs.shape[0] == target_vocab:
        return probs
    full = probs.new_zeros(target_vocab)
    if to_target is None:
        full[: probs.shape[0]] = probs[:target_vocab]
    else:
        full[torch.as_tensor(to_target, device=probs.device)] = probs
    return full


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    left = torch.as_tensor(list(a[:n]))
    right = torch.as_tensor(list(b[:n]))
    differ = (left != right).nonzero()
    return int(differ[0]) if len(differ) else n


class RequestPrefix:
    """The common prefix of a request's context with the tokens a drafter's cache was built from.

    Compared in full once per request (``reset`` at its start). Within a request the
    context is only appended to, so a prefix that ended before the tokens compared
    cannot grow and is not compared again; one that covered them all is compared
    again when asked with more tokens.
    """

    def __init__(self) -> None:
        self._seen: tuple[int, int] | None = None  # (tokens compared, their common prefix with the cached ones)

    def reset(self) -> None:
        self._seen = None

    def __call__(self, cached: Sequence[int], tokens: Sequence[int]) -> int:
        if self._seen is None or self._seen[1] >= self._seen[0]:
            self._seen = (len(tokens), common_prefix(cached, tokens))
        return self._seen[1]
