"""Verification of a draft against the target, on the logits' device: one host read per step.

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

Trees (``Draft.parents``): draft token ``i`` has a parent, an earlier token or -1 (the
root, ``last``); row ``i + 1`` is the target's distribution after token ``i`` and its
ancestors. A chain is the tree with parents ``(-1, 0, 1, ..., d - 2)``.

Deterministic drafts (chains and trees), greedy or sampled: each row gets a **choice**,
the argmax (greedy) or one exact draw from ``p`` (sampling: an exponential race,
``argmax(p / E)`` with ``E ~ Exp(1)`` per token, which picks token ``t`` with
probability ``p(t)``). Draft token ``i`` matches when it equals the choice at its
parent's row; it is accepted when it and all its ancestors match. The accepted path
ends at the deepest accepted token (siblings differ, so there is one), and the
emitted tokens are the choices at the root's row and along the path. Each emitted
token is the argmax of, or a draw from, the target at its position, so greedy output
is plain greedy output and sampled output has the target's distribution: point-mass
drafts never change what is drawn, only how many positions one forward covers.

Drafts with a distribution q (chains only; Leviathan et al. / Chen et al.): ``x_i``
is accepted with probability ``min(1, p(x_i) / q(x_i))`` (``u * q < p`` with
``u ~ U(0, 1)``), ``n`` is the number accepted before the first rejection, and the
extra token is drawn from ``norm(max(p_n - q_n, 0))`` (``p_d`` when all are accepted,
where ``q_d`` is taken as zero). Each emitted token is distributed exactly as under
plain sampling from p.

Everything here is a fixed-shape tensor operation on the logits' device (no
``.item()``, no shape that depends on the outcome), consuming a fixed amount of the
request's randomness per step. A step's result, with the target's signal at its last
row (log-probability of the emitted extra token under the untempered logits, and the
entropy), is ONE small packed tensor (:func:`verify_step`); the engine reads it to
the host with a single ``.tolist()`` and :meth:`Verification.from_packed` decodes it.

On the CPU, where logits are already on the host and every tensor operation costs a few
microseconds of dispatch, a step is verified on host integers instead (:func:`verify_on_host`):
the rows' argmax (a sampled step: a draw at each row the walk reaches, or speculative sampling's
same draws, with p computed only for the rows it reads), then the same acceptance rule over the
draft's tokens and parents in Python, then the same target signal (read by the runner's own
:class:`~hvd_agents.runtime.greedy_rows.GreedyRows` where it has one: the native CPU runner's kernels). Greedy, or
sampled with a draft carrying q, its result equals the packed path's field for field (property tests compare
them); sampled with a deterministic draft it draws only at the rows it reaches, the same distribution
(chi-square tests) from less randomness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hvd_agents.engine.sampling import GREEDY, SamplingParams, target_probs
from hvd_agents.runtime.greedy_rows import TORCH_GREEDY_ROWS, GreedyRows, log_probs_and_entropy
from hvd_agents.runtime.tree_mask import ancestors

_HEADER = 3  # n, logp, entropy; then d + 1 emitted tokens and d path entries


@dataclass(frozen=True)
class Verification:
    """Outcome of verifying one draft.

    Attributes:
        num_accepted: ``n``, the number of accepted draft tokens.
        token_ids: the ``n + 1`` tokens to append: accepted, then recovered or bonus.
        path: the indices of the accepted draft tokens, root first (``0..n-1`` for a chain).
        target_logprob: the target's log-probability (untempered) of the last emitted token.
        target_entropy: the entropy (nats) of the target's distribution there.
    """

    num_accepted: int
    token_ids: tuple[int, ...]
    path: tuple[int, ...] | None = None
    target_logprob: float | None = None
    target_entropy: float | None = None

    @classmethod
    def from_packed(cls, values: Sequence[float]) -> Verification:
        """Decode :func:`verify_step`'s packed result, read to the host with one ``.tolist()``.

        Layout, for ``d`` draft tokens (``2 d + 4`` values): ``n``, logp, entropy, the
        ``d + 1`` emitted tokens (the first ``n + 1`` are valid), the ``d`` path entries
        (the first ``n`` are valid).

        >>> Verification.from_packed([1.0, -0.5, 2.0, 7.0, 9.0, 0.0, 0.0, -1.0])  # d = 2: x_1 = 7 accepted, then 9
        Verification(num_accepted=1, token_ids=(7, 9), path=(0,), target_logprob=-0.5, target_entropy=2.0)
        """
        d = (len(values) - _HEADER - 1) // 2
        n = int(values[0])
        tokens = tuple(int(t) for t in values[_HEADER : _HEADER + n + 1])
        path = tuple(int(j) for j in values[_HEADER + d + 1 : _HEADER + d + 1 + n])
        return cls(n, tokens, path, float(values[1]), float(values[2]))


def verify_step(
    logits: torch.Tensor,
    draft_ids: torch.Tensor,
    parents: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
    draft_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verify one draft on the logits' device; the packed result (:meth:`Verification.from_packed`).

    Args:
        logits: ``[d + 1, vocab]`` target logits (see the module notation).
        draft_ids: ``[d]`` long draft tokens, on the logits' device.
        parents: ``[d]`` long parents, on the logits' device (a chain's are ``-1, 0, ..., d - 2``).
        sampling: the request's sampling parameters (greedy when ``temperature == 0``).
        generator: the request's RNG, on the logits' device (sampling only).
        draft_probs: ``[d, vocab]`` drafter distributions q for a chain draft, or None
            for a deterministic draft (chain or tree).

    Returns:
        ``[2 d + 4]`` float32: the packed verification and target signal.
    """
    if sampling.greedy or draft_probs is None:
        choice = logits.argmax(dim=-1) if sampling.greedy else race(target_probs(logits, sampling), generator)
        n, path, tokens = accept(choice, draft_ids, parents)
    else:
        probs = target_probs(logits, sampling)
        q = draft_probs.to(device=probs.device, dtype=probs.dtype)
        n, path, tokens = speculative_sampling(probs, draft_ids, q, generator)
    return pack(logits, n, path, tokens)


def verify_on_host(logits: torch.Tensor, draft_ids: Sequence[int], parents: Sequence[int] | None = None,
                   rows: GreedyRows = TORCH_GREEDY_ROWS, sampling: SamplingParams = GREEDY,
                   generator: torch.Generator | None = None, draft_probs: torch.Tensor | None = None) -> Verification:
    """A step's :class:`Verification` computed on host integers (logits on the CPU), without a tensor
    operation per stage. Greedy, or sampled with a draft carrying q, it is what
    ``Verification.from_packed(verify_step(...).tolist())`` gives, field for field (the same draws, p
    computed only for the rows speculative sampling reads). Sampled with a deterministic draft, it draws
    a token only at the rows the walk reaches (:func:`_sampled_walk`): the same distribution, and
    randomness that varies with what is accepted.

    Args:
        logits: ``[d + 1, vocab]`` target logits.
        draft_ids: the ``d`` draft tokens.
        parents: their parents, each -1 or an earlier token (None: a chain).
        rows: what reads a greedy step's argmax and every step's signal (the runner's own, or PyTorch's).
        sampling: the request's sampling parameters (greedy by default).
        generator: the request's RNG (sampling only).
        draft_probs: ``[d, vocab]`` drafter distributions q of a chain draft (sampling only), or None.
    """
    if sampling.greedy:
        n, tokens, path = _walk(rows.choices(logits), draft_ids, parents)
    elif draft_probs is None:
        n, tokens, path = _sampled_walk(logits, draft_ids, parents, sampling, generator)
    else:
        n, extra = _speculative_sampling_on_host(logits, draft_ids, draft_probs, sampling, generator)
        tokens, path = (*(int(t) for t in draft_ids[:n]), extra), tuple(range(n))
    row = 0 if n == 0 else path[-1] + 1
    logp, entropy = rows.signal(logits, row, tokens[n])
    return Verification(n, tuple(tokens), path, logp, entropy)


def _walk(choice: Sequence[int], draft_ids: Sequence[int],
          parents: Sequence[int] | None) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """:func:`accept` on host integers: ``n``, the emitted tokens (``n + 1``) and the path (``n``, root first)."""
    d = len(draft_ids)
    parents = list(range(-1, d - 1)) if parents is None else list(parents)
    depth = [0] * d
    ok = [False] * d
    best, n = -1, 0  # the first deepest accepted token (-1: the root), its depth
    for i in range(d):  # a token's parent comes before it
        parent = parents[i]
        depth[i] = 1 if parent < 0 else depth[parent] + 1
        ok[i] = int(draft_ids[i]) == choice[parent + 1] and (parent < 0 or ok[parent])
        if ok[i] and depth[i] > n:
            best, n = i, depth[i]
    path: list[int] = []
    node = best
    while node >= 0:
        path.append(node)
        node = parents[node]
    path.reverse()  # root first
    return n, (choice[0], *(choice[node + 1] for node in path)), tuple(path)


def _sampled_walk(logits: torch.Tensor, draft_ids: Sequence[int], parents: Sequence[int] | None,
                  sampling: SamplingParams, generator: torch.Generator | None) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """A deterministic draft under sampling, walked from the root: a token drawn from p at the row reached
    (one row's race), the walk moving to the draft's child that holds it, until no child does.

    Each emitted token is an exact draw from the target at its context, as in plain sampling; rows the walk
    never reaches cost neither p nor randomness, where :func:`verify_step` races every row (a step verifying
    ten drafted tokens, of which one is accepted, computes two rows' nucleus and noise instead of eleven).
    """
    d = len(draft_ids)
    parents = range(-1, d - 1) if parents is None else parents
    children: dict[int, dict[int, int]] = {}
    for i, (parent, token) in enumerate(zip(parents, draft_ids)):
        children.setdefault(parent, {}).setdefault(int(token), i)  # siblings differ (Draft checks it)
    node, tokens, path = -1, [], []
    while True:
        token = int(race(target_probs(logits[node + 1 : node + 2], sampling), generator)[0])
        tokens.append(token)
        node = children.get(node, {}).get(token, -1)
        if node < 0:
            return len(path), tuple(tokens), tuple(path)
        path.append(node)


def _speculative_sampling_on_host(logits: torch.Tensor, draft_ids: Sequence[int], draft_probs: torch.Tensor,
                                  sampling: SamplingParams, generator: torch.Generator | None) -> tuple[int, int]:
    """:func:`speculative_sampling`'s draws and float32 arithmetic, with p computed row by row up to the
    first rejection (a row's p is the same alone as among the step's rows): ``n`` and the extra token."""
    d = len(draft_ids)
    q = draft_probs.to(dtype=torch.float32)  # [d, vocab]
    uniform = torch.rand(d, generator=generator, dtype=torch.float32)  # [d]: the same d uniforms
    n = 0
    p_n = target_probs(logits[:1], sampling)  # [1, vocab]
    while n < d and bool(uniform[n] * q[n, draft_ids[n]] < p_n[0, draft_ids[n]]):  # x_{n+1} accepted
        n += 1
        p_n = target_probs(logits[n : n + 1], sampling)
    residual = (p_n - q[n : n + 1]).clamp_min(0.0) if n < d else p_n.clamp_min(0.0)  # [1, vocab]
    if not bool(residual.sum() > 0):  # p_n == q_n: rejection had probability 0
        residual = p_n
    return n, int(race(residual, generator)[0])


def race(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One exact draw per row, proportional to ``weights`` ``[rows, vocab]`` (>= 0): ``argmax(w / E)``.

    ``E ~ Exp(1)`` per entry, so ``w_t / E_t`` is exponential with rate ``1 / w_t`` and the
    largest is token ``t`` with probability ``w_t / sum(w)``. Consumes ``rows * vocab``
    exponentials whatever the weights.
    """
    noise = torch.empty(weights.shape, dtype=torch.float32, device=weights.device)
    noise.exponential_(generator=generator)
    tiny = torch.finfo(torch.float32).tiny  # an E of 0 would make 0 / 0; a weight of 0 must never win
    return (weights.float() / noise.clamp_min(tiny)).argmax(dim=-1)


def accept(choice: torch.Tensor, draft_ids: torch.Tensor,
           parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tree (or chain) acceptance against per-row choices.

    Args:
        choice: ``[d + 1]`` long, the target's token at each row.
        draft_ids: ``[d]`` long draft tokens.
        parents: ``[d]`` long parents (-1: the root).

    Returns:
        ``n`` (0-dim long), the path ``[d]`` (accepted token indices root first, then -1),
        and the emitted tokens ``[d + 1]`` (the first ``n + 1`` are valid).
    """
    d = draft_ids.shape[0]
    anc = ancestors(parents).to(torch.float32)  # [d, d]: ancestor-or-self
    depth = anc.sum(dim=1).to(torch.long)  # [d]
    mismatch = (draft_ids != choice[parents + 1]).to(torch.float32)  # [d]: against the parent row's choice
    ok = (anc @ mismatch) == 0  # [d]: it and every ancestor match
    score = torch.cat([depth.new_zeros(1), depth * ok])  # [d + 1]: the root first, at depth 0
    n, best = score.max(dim=0)  # the deepest accepted depth, and the first node there (0: the root)
    on_path = torch.cat([anc.new_zeros(1, d), anc]).index_select(0, best.view(1))[0] > 0  # [d]
    # token i on the path goes to slot depth - 1; the others to a spare slot d, dropped
    slot = torch.where(on_path, depth - 1, d)
    path = torch.full((d + 1,), -1, dtype=torch.long, device=choice.device)
    path = path.scatter(0, slot, torch.arange(d, device=choice.device))[:d]  # [d]
    rows = torch.cat([path.new_zeros(1), path + 1])  # [d + 1]: the root's row, then the path's (padding: 0)
    return n, path, choice[rows]


def speculative_sampling(probs: torch.Tensor, draft_ids: torch.Tensor, draft_probs: torch.Tensor,
                         generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling of a chain with drafter distributions q.

    Consumes ``d`` uniforms and ``vocab`` exponentials from ``generator``.

    Args:
        probs: ``[d + 1, vocab]`` target distributions p (rows sum to 1).
        draft_ids: ``[d]`` long draft tokens.
        draft_probs: ``[d, vocab]`` drafter distributions q.
        generator: the request's RNG (on ``probs.device``).

    Returns:
        Like :func:`accept`: ``n``, the path ``[d]`` and the emitted tokens ``[d + 1]``.
    """
    d = draft_ids.shape[0]
    index = torch.arange(d, device=probs.device)
    p_x = probs[index, draft_ids]  # [d]
    q_x = draft_probs[index, draft_ids]  # [d]
    uniform = torch.rand(d, generator=generator, device=probs.device, dtype=probs.dtype)  # [d]
    accepted = (uniform * q_x < p_x).to(torch.long)  # u < p / q without dividing by q = 0
    n = accepted.cumprod(dim=0).sum()  # 0-dim
    q = torch.cat([draft_probs, draft_probs.new_zeros(1, draft_probs.shape[1])])  # [d + 1, vocab]: q_d = 0
    p_n = probs.index_select(0, n.view(1))  # [1, vocab]
    residual = (p_n - q.index_select(0, n.view(1))).clamp_min(0.0)  # [1, vocab]: p_d itself when n == d
    # all zero only if p_n <= q_n everywhere, i.e. p_n == q_n, where rejection has probability 0
    residual = torch.where(residual.sum() > 0, residual, p_n)
    extra = race(residual, generator)  # [1]
    path = torch.where(index < n, index, -1)  # [d]
    tokens = torch.cat([draft_ids, extra])  # [d + 1]
    tokens = torch.where(torch.arange(d + 1, device=probs.device) == n, extra, tokens)
    return n, path, tokens


def pack(logits: torch.Tensor, n: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[2 d + 4]`` float32: ``n``, the target signal at the last emitted token, the tokens, the path.

    The signal is the log-probability of the extra token (``tokens[n]``) under the untempered
    logits of its row (the root's, or the last path token's) and that distribution's entropy.
    """
    rows = torch.cat([path.new_zeros(1), path + 1])  # [d + 1]
    row = rows.index_select(0, n.view(1))  # [1]
    logp, entropy = log_probs_and_entropy(logits.index_select(0, row)[0])  # [vocab], 0-dim
    extra = tokens.index_select(0, n.view(1))  # [1]
    head = torch.stack([n.float(), logp.index_select(0, extra)[0], entropy])  # [3]
    return torch.cat([head, tokens.float(), path.float()])  # token ids below 2**24 are exact in float32
