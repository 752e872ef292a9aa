"""Verification functions on hand-made distributions."""

from __future__ import annotations

import pytest
import torch

from hvd_agents.engine.sampling import SamplingParams, target_probs
from hvd_agents.engine.verify import verify_greedy, verify_sampling


def one_hot_logits(rows: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(rows), vocab)
    for i, t in enumerate(rows):
        logits[i, t] = 5.0
    return logits


@pytest.mark.parametrize(
    "target_rows, draft, accepted, emitted, intent",
    [
        ([1, 2, 3], [1, 2], 2, (1, 2, 3), "all accepted: the bonus is the argmax of the last row"),
        ([1, 2, 3], [1, 4], 1, (1, 2), "second token wrong: the recovered token is the target's"),
        ([1, 2, 3], [0, 2], 0, (1,), "first token wrong: a later match does not count"),
        ([4], [], 0, (4,), "empty draft is a plain AR step"),
    ],
)
def test_greedy(target_rows, draft, accepted, emitted, intent) -> None:
    result = verify_greedy(one_hot_logits(target_rows), torch.tensor(draft, dtype=torch.long))
    assert (result.num_accepted, result.token_ids) == (accepted, emitted), intent


def test_sampling_never_accepts_zero_probability_token() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])  # p after last: always token 1
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        result = verify_sampling(probs, torch.tensor([0]), None, gen)
        assert result.num_accepted == 0 and result.token_ids == (1,)


def test_sampling_accepts_certain_token_and_adds_bonus() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    result = verify_sampling(probs, torch.tensor([1]), None, torch.Generator().manual_seed(0))
    assert result.token_ids == (1, 2) and result.num_accepted == 1


def test_residual_of_point_mass_excludes_rejected_token() -> None:
    # p = (0.5, 0.5): drafting token 0 is accepted half the time; when rejected, 1 must follow.
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    gen = torch.Generator().manual_seed(1)
    outcomes = [verify_sampling(probs, torch.tensor([0]), None, gen).token_ids for _ in range(400)]
    assert set(outcomes) == {(0, 0), (1,)}
    assert 150 < outcomes.count((1,)) < 250


def test_q_draft_uses_ratio_and_residual() -> None:
    p = torch.tensor([[0.2, 0.8], [1.0, 0.0]])
    q = torch.tensor([[0.8, 0.2]])  # over-proposes token 0: accepted w.p. 0.25
    gen = torch.Generator().manual_seed(2)
    outcomes = [verify_sampling(p, torch.tensor([0]), q, gen).token_ids for _ in range(800)]
    assert set(outcomes) <= {(0, 0), (1,)}
    assert 140 < outcomes.count((0, 0)) < 260  # 0.25 * 800 = 200


def test_target_probs_warpers() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    top2 = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert top2[0, 2:].sum() == 0 and torch.isclose(top2.sum(), torch.tensor(1.0))
    nucleus = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert nucleus[0, 0] == 1.0  # the top token alone already holds more than half the mass
    cold = target_probs(logits, SamplingParams(temperature=0.1))
    assert cold[0, 0] > 0.99
