"""The target distribution p (`engine/sampling.py`): transformers' warpers, ties decided by score alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hvd_agents.engine.sampling import SamplingParams, target_probs

VOCAB = 49_152  # the embedded model's


def transformers_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """transformers' warpers in its order, then softmax: what ``target_probs`` follows."""
    scores = TemperatureLogitsWarper(params.temperature)(None, logits.float())
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return scores.softmax(dim=-1)


def distinct_rows(rows: int, vocab: int, seed: int, scale: float) -> torch.Tensor:
    """Normal logit rows with no two values equal in a row, so no sort has a tie to order
    (float32 draws repeat: a 49,152-value row holds dozens of pairs, each moved up a step)."""
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=generator) * scale).numpy()
    for row in logits:
        order = np.argsort(row, kind="stable")
        ascending = row[order]
        for i in np.flatnonzero(np.diff(ascending) <= 0) + 1:  # in order, so a run of ties spreads out
            ascending[i] = max(ascending[i], np.nextafter(ascending[i - 1], np.float32(np.inf)))
        row[order] = ascending
    assert all(np.unique(row).size == vocab for row in logits)
    return torch.from_numpy(logits)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 0.95), (0.7, 0, 0.9), (0.7, 50, 0.95), (1.3, 0, 0.5), (0.5, 0, 0.999), (1.0, 0, 0.01),
    (0.7, 40, 1.0), (1.0, 0, 1.0),
])
@pytest.mark.parametrize("vocab, scale", [(VOCAB, 3.0), (2_000, 1.0), (2_000, 8.0)])
def test_without_ties_it_is_transformers_bit_for_bit(temperature, top_k, top_p, vocab, scale) -> None:
    logits = distinct_rows(3, vocab, seed=vocab + int(scale), scale=scale)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    assert torch.equal(target_probs(logits, params), transformers_probs(logits, params))


def test_a_nucleus_cut_between_tied_tokens_keeps_them_all() -> None:
    # probabilities 0.1, 0.2, 0.4, 0.2, 0.1, summed from the least likely: 0.1, 0.2, 0.4, 0.6, 1.0
    logits = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]]).log()

    def kept(top_p: float) -> list[bool]:
        return (target_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))[0] > 0).tolist()

    # top_p 0.5 removes while the sum is <= 0.5: three tokens, a cut inside the pair at 0.2
    # that transformers splits by its sort's order of the pair; p keeps both, as top-k keeps
    # ties with the k-th
    assert kept(0.5) == [False, True, True, True, False]
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))[0]
    assert torch.allclose(p[1:4], torch.tensor([0.25, 0.5, 0.25]))
    assert kept(0.85) == [True] * 5  # a cut inside the pair at 0.1 keeps both, so every token
    assert kept(0.7) == [False, True, True, True, False]  # a cut after the pair at 0.1 removes both
    assert kept(0.3) == [False, False, True, False, False]


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (0, 0.5), (30, 0.95), (7, 1.0)])
def test_p_depends_on_the_scores_alone_not_on_where_ties_sit(top_k, top_p) -> None:
    """Permuting a row's tokens permutes p: rows of few distinct values (ties at every cut) keep
    the same tokens in every order, which no sort's treatment of ties can move (the softmax's
    sum runs in the row's order, so the probabilities agree to rounding)."""
    generator = torch.Generator().manual_seed(top_k + int(100 * top_p))
    levels = torch.randn(12, generator=generator) * 2
    logits = levels[torch.randint(0, 12, (4, 4_000), generator=generator)]
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p)
    p = target_probs(logits, params)
    for _ in range(5):
        order = torch.randperm(logits.shape[1], generator=generator)
        permuted = target_probs(logits[:, order], params)
        assert torch.equal(permuted > 0, p[:, order] > 0)
        assert torch.allclose(permuted, p[:, order], rtol=1e-5, atol=0)
    for row in range(4):  # tied tokens get equal probabilities: all kept or all removed
        for level in levels:
            assert p[row][logits[row] == level].unique().numel() <= 1


def test_masked_tokens_and_the_most_likely_token() -> None:
    logits = distinct_rows(2, 3_000, seed=5, scale=2.0)
    masked = logits.clone()
    masked[:, ::3] = float("-inf")  # a grammar's mask
    params = SamplingParams(temperature=0.9, top_p=0.8)
    p = target_probs(masked, params)
    assert (p[:, ::3] == 0).all() and torch.allclose(p.sum(dim=-1), torch.ones(2))
    assert torch.equal(p, transformers_probs(masked, params))
    one_left = torch.full((1, 50), float("-inf"))
    one_left[0, 17] = 1.0  # a mask that leaves one token: top-p always keeps it
    assert target_probs(one_left, SamplingParams(temperature=1.0, top_p=1e-6))[0, 17] == 1.0
    certain = torch.tensor([[30.0, 0.0, 0.0]])  # the top token's mass rounds to 1: still kept alone
    assert target_probs(certain, SamplingParams(temperature=1.0, top_p=1e-9)).tolist() == [[1.0, 0.0, 0.0]]
