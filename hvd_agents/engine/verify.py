"""Verification of a draft against the target: pure functions.

Notation, fixed once for the project:

* ``d`` draft tokens ``x_1..x_d`` were appended after the last context token and the
  target ran ONE forward pass over ``[last, x_1, ..., x_d]``, giving ``d + 1`` rows
  of logits; row ``i`` is the target's next-token distribution after ``x_i``
  (row 0: after ``last``).
* ``p_i`` is the target distribution at row ``i`` (after temperature/top-k/top-p);
  ``q_i`` is the drafter's distribution for ``x_{i+1}``; a deterministic draft (a
  cache copy, ``q = None``) is a point mass at ``x_{i+1}``.
* **accepted** tokens: the longest prefix of the draft that passes verification
  (``n`` of them, ``0 <= n <= d``).
* **recovered** token: when ``x_{n+1}`` is rejected, a replacement drawn from the
  residual distribution at row ``n``.
* **bonus** token: when all ``d`` are accepted, a token drawn from ``p_d``.

Every step therefore emits ``n + 1`` tokens: accepted, then recovered or bonus.

Greedy: ``x_i`` is accepted iff it equals ``argmax`` of row ``i - 1``; the extra
token is the argmax at row ``n``. The output is exactly plain greedy decoding.

Sampling (Leviathan et al. / Chen et al.): ``x`` is accepted with probability
``min(1, p(x) / q(x))``; on rejection the recovered token is drawn from
``norm(max(p - q, 0))``. With a point-mass q this is: accept with probability
``p(x)``, recover from ``p`` with ``x`` removed and renormalised. Either way each
emitted token is distributed exactly as under plain sampling from p.

Trees (deterministic drafts whose tokens branch, ``Draft.parents``): row ``i + 1``
is the target's distribution after draft token ``i`` and its ancestors (row 0:
after ``last``). From the root, greedy takes the argmax and moves to the child
with that token; sampling draws ``x ~ p`` at the current node and moves to the
child with token ``x``. The walk ends at the first token with no such child,
which is emitted as the extra token. Each emitted token is the argmax of, or a
draw from, the target at its position, so greedy output is plain greedy output
and sampled output has the target's distribution: point-mass drafts never
change what is drawn, only how many positions one forward covers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verification:
    """Outcome of verifying one draft.

    Attributes:
        num_accepted: ``n``, the number of accepted draft tokens.
        token_ids: the ``n + 1`` tokens to append: accepted, then recovered or bonus.
    """

    num_accepted: int
    token_ids: tuple[int, ...]
    path: tuple[int, ...] | None = None  # for a tree: the indices of the accepted draft tokens


def verify_tree(
    scores: torch.Tensor,
    children: dict[int, dict[int, int]],
    generator: torch.Generator | None = None,
) -> Verification:
    """Verify a tree draft: greedy on logits (``generator`` None) or sampling on probabilities.

    Args:
        scores: ``[d + 1, vocab]``: logits for greedy, target distributions p for
            sampling; row ``i + 1`` belongs to draft token ``i``, row 0 to the root.
        children: ``{parent: {token: index}}`` (``Draft.children()``).
        generator: the request's RNG for sampling (one categorical draw per level).

    Returns:
        The :class:`Verification`, with ``path`` set.
    """
    greedy = generator is None
    argmax = scores.argmax(dim=-1).tolist() if greedy else None  # [d + 1]
    path: list[int] = []
    emitted: list[int] = []
    node = -1
    while True:
        row = node + 1
        if greedy:
            token = argmax[row]
        else:
            token = int(torch.multinomial(scores[row], 1, generator=generator).item())
        emitted.append(token)
        child = children.get(node, {}).get(token)
        if child is None:
            return Verification(len(path), tuple(emitted), tuple(path))
        path.append(child)
        node = child


def verify_greedy(logits: torch.Tensor, draft_ids: torch.Tensor) -> Verification:
    """Greedy verification.

    Args:
        logits: ``[d + 1, vocab]`` target logits (see module notation).
        draft_ids: ``[d]`` draft token ids (same device as logits).

    Returns:
        The :class:`Verification`.
    """
    target = logits.argmax(dim=-1)  # [d + 1]
    d = draft_ids.shape[0]
    matches = (target[:d] == draft_ids).to(torch.int64)  # [d]
    n = int(matches.cumprod(dim=0).sum().item()) if d else 0
    emitted = target[: n + 1].tolist()  # accepted tokens equal the target's argmax
    return Verification(n, tuple(emitted))


def verify_sampling(
    probs: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> Verification:
    """Lossless speculative sampling.

    Consumes exactly ``d`` uniform draws and one categorical draw from ``generator``.

    Args:
        probs: ``[d + 1, vocab]`` target distributions p (rows sum to 1).
        draft_ids: ``[d]`` draft token ids.
        draft_probs: ``[d, vocab]`` drafter distributions q, or ``None`` for a
            deterministic draft.
        generator: the request's RNG (on ``probs.device``).

    Returns:
        The :class:`Verification`.
    """
    d = draft_ids.shape[0]
    rows = torch.arange(d, device=probs.device)
    p_x = probs[rows, draft_ids]  # [d]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs[rows, draft_ids]  # [d]
    uniform = torch.rand(d, generator=generator, device=probs.device)  # [d]
    accepted = (uniform * q_x < p_x).to(torch.int64)  # u < p/q without dividing by q = 0
    n = int(accepted.cumprod(dim=0).sum().item()) if d else 0
    if n == d:
        final = probs[d]  # bonus: [vocab]
    else:
        final = _residual(probs[n], draft_ids[n], None if draft_probs is None else draft_probs[n])
    extra = int(torch.multinomial(final, 1, generator=generator).item())
    return Verification(n, tuple(draft_ids[:n].tolist()) + (extra,))


def _residual(p: torch.Tensor, x: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """``norm(max(p - q, 0))`` for a rejected token ``x``; point-mass q when ``q`` is None."""
    if q is None:
        residual = p.clone()  # [vocab]
        residual[x] = 0.0
    else:
        residual = (p - q).clamp_min(0.0)  # [vocab]
    total = residual.sum()
    # total == 0 only if p <= q everywhere, i.e. p == q, where rejection has probability 0.
    return residual / total if total > 0 else p


def target_signal(logits: torch.Tensor, token: int) -> tuple[float, float]:
    """The target's log-probability of ``token`` and the entropy (nats) of its distribution.

    Args:
        logits: ``[vocab]`` target logits at the position that produced ``token``
            (untempered: the model's own distribution).
        token: the token emitted there.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [vocab]
    entropy = -(logp.exp() * logp).sum()
    return float(logp[token]), float(entropy)
