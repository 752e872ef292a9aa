"""Verification functions on hand-made distributions."""

from __future__ import annotations

import pytest
import torch

from hvd_agents.engine.sampling import SamplingParams, target_probs
from hvd_agents.engine.verify import verify_greedy, verify_sampling, verify_tree


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


# ---------------------------------------------------------------- trees


def test_tree_draft_structure() -> None:
    from hvd_agents.drafters import Draft

    tree = Draft((7, 8, 9, 5, 6), parents=(-1, 0, 1, 0, -1))  # 7 8 9, 7 5, and 6
    assert tree.is_tree and tree.main_length == 3
    assert tree.depths() == [1, 2, 3, 2, 1]
    assert tree.path([7, 5, 1]) == [0, 3] and tree.path([6]) == [4] and tree.path([7, 8, 9, 4]) == [0, 1, 2]
    assert tree.main_branch() == Draft((7, 8, 9))
    assert tree.truncated(4).parents == (-1, 0, 1, 0)
    chain = Draft((7, 8, 9))
    assert not chain.is_tree and chain.path([7, 8, 1]) == [0, 1] and chain.main_length == 3
    for bad, why in [((-1, 1), "earlier token"), ((-1,), "one parent per token"), ((-1, -1), "repeats a sibling")]:
        with pytest.raises(ValueError, match=why):
            Draft((3, 3) if why == "repeats a sibling" else (3, 4), parents=bad)
    with pytest.raises(ValueError, match="deterministic"):
        Draft((3, 4), probs=torch.ones(2, 5) / 5, parents=(-1, -1))


def test_verify_tree_greedy_follows_the_argmax_path() -> None:
    # tokens: 0:(7) 1:(8 after 7) 2:(5 after 7) 3:(6 at the root); rows: root, 7, 8, 5, 6
    children = {-1: {7: 0, 6: 3}, 0: {8: 1, 5: 2}}
    logits = torch.full((5, 10), -5.0)
    for row, best in enumerate([7, 5, 1, 2, 4]):
        logits[row, best] = 5.0
    result = verify_tree(logits, children)
    assert result.path == (0, 2) and result.token_ids == (7, 5, 2) and result.num_accepted == 2
    logits[0] = -5.0
    logits[0, 3] = 5.0  # the target wants 3 at the root: nothing accepted
    assert verify_tree(logits, children).token_ids == (3,)


def test_verify_tree_sampling_draws_from_the_target_at_each_node() -> None:
    children = {-1: {1: 0, 2: 1}}
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    seen = set()
    for seed in range(40):
        result = verify_tree(probs, children, torch.Generator().manual_seed(seed))
        seen.add(result.token_ids)
        assert result.token_ids in {(1, 0), (2, 3)}  # the row of the accepted branch gives the next token
    assert seen == {(1, 0), (2, 3)}


def test_kv_keep_selects_positions_and_refuses_bad_offsets() -> None:
    from transformers import DynamicCache

    from hvd_agents.runtime.kv import keep, supports_trees

    cache = DynamicCache()
    keys = torch.arange(10, dtype=torch.float64).view(1, 1, 10, 1).expand(1, 2, 10, 3).contiguous()
    cache.update(keys, keys + 100, layer_idx=0)
    assert supports_trees(cache)
    keep(cache, 4, [0, 2, 5])  # keep 0..3, then 4, 6 and 9
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 6, 9]
    assert cache.layers[0].values[0, 1, :, 0].tolist() == [100, 101, 102, 103, 104, 106, 109]
    for bad in ([2, 1], [0, 3]):  # not increasing; past the end
        with pytest.raises(ValueError, match="cannot keep"):
            keep(cache, 4, bad)
