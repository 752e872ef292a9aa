"""Host-side reference verification: the step-by-step walks the device functions are checked against.

These are the engine's former verification functions (a walk with a host read per level):
plain to read, slow on a GPU. ``hvd_agents.engine.verify`` must agree with them exactly for
greedy verification, and in distribution for sampling.
"""

from __future__ import annotations

import torch

from hvd_agents.engine.verify import Verification


def verify_tree(
    scores: torch.Tensor,
    children: dict[int, dict[int, int]],
    generator: torch.Generator | None = None,
) -> Verification:
    """Walk a tree (a chain is one) from the root: greedy on logits (``generator`` None) or sampling on p.

    Args:
        scores: ``[d + 1, vocab]``: logits for greedy, target distributions p for sampling.
        children: ``{parent: {token: index}}`` (``Draft.children()``).
        generator: the RNG for sampling (one categorical draw per level).
    """
    argmax = scores.argmax(dim=-1).tolist() if generator is None else None  # [d + 1]
    path: list[int] = []
    emitted: list[int] = []
    node = -1
    while True:
        row = node + 1
        if argmax is not None:
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
    """Greedy verification of a chain: the longest prefix equal to the argmax, then the argmax."""
    target = logits.argmax(dim=-1)  # [d + 1]
    d = draft_ids.shape[0]
    matches = (target[:d] == draft_ids).to(torch.int64)  # [d]
    n = int(matches.cumprod(dim=0).sum().item()) if d else 0
    return Verification(n, tuple(target[: n + 1].tolist()), tuple(range(n)))


def verify_sampling(
    probs: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> Verification:
    """Speculative sampling of a chain: accept while ``u * q(x) < p(x)``, then the residual (or bonus)."""
    d = draft_ids.shape[0]
    rows = torch.arange(d)
    p_x = probs[rows, draft_ids]  # [d]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs[rows, draft_ids]  # [d]
    uniform = torch.rand(d, generator=generator)  # [d]
    accepted = (uniform * q_x < p_x).to(torch.int64)
    n = int(accepted.cumprod(dim=0).sum().item()) if d else 0
    if n == d:
        final = probs[d]
    elif draft_probs is None:
        final = probs[n].clone()
        final[draft_ids[n]] = 0.0
    else:
        final = (probs[n] - draft_probs[n]).clamp_min(0.0)
    final = final / final.sum() if final.sum() > 0 else probs[n]
    extra = int(torch.multinomial(final, 1, generator=generator).item())
    return Verification(n, tuple(draft_ids[:n].tolist()) + (extra,), tuple(range(n)))


def target_signal(logits: torch.Tensor, token: int) -> tuple[float, float]:
    """The log-probability of ``token`` under ``[vocab]`` logits and the distribution's entropy (nats)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(logp.exp() * logp).sum()
    return float(logp[token]), float(entropy)
