"""Verification on the device, on hand-made distributions and against the host reference walks."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_agents.drafters import Draft
from hvd_agents.engine.sampling import SamplingParams, target_probs
from hvd_agents.engine.verify import (
    Verification,
    accept,
    race,
    speculative_sampling,
    verify_on_host,
    verify_step,
)
from tests import verify_reference as reference
from tests.drafters_for_tests import random_tree
from tests.test_engine_lossless import chi_square

GREEDY = SamplingParams()
SAMPLE = SamplingParams(temperature=1.0)


def one_hot_logits(rows: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(rows), vocab)
    for i, t in enumerate(rows):
        logits[i, t] = 5.0
    return logits


def verify(logits: torch.Tensor, draft: Draft, sampling: SamplingParams = GREEDY,
           generator: torch.Generator | None = None) -> Verification:
    """What the engine does: the draft to tensors, :func:`verify_step`, one ``.tolist()``."""
    d = len(draft)
    parents = draft.parents if draft.parents is not None else tuple(range(-1, d - 1))
    packed = verify_step(logits, torch.tensor(draft.token_ids, dtype=torch.long),
                         torch.tensor(parents, dtype=torch.long), sampling, generator, draft.probs)
    assert packed.shape == (2 * d + 4,)
    return Verification.from_packed(packed.tolist())


def critical(df: int, z: float = 3.09) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty); z=3.09 is a 0.001 test."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def fits(observed: Counter, p: torch.Tensor, n: int) -> bool:
    stat, df = chi_square(observed, {t: float(p[t]) for t in range(p.shape[0])}, n)
    return stat < critical(df)


# ---------------------------------------------------------------- greedy


def test_tree_draft_structure() -> None:
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
    result = verify(one_hot_logits(target_rows), Draft(tuple(draft)))
    assert (result.num_accepted, result.token_ids, result.path) == (accepted, emitted, tuple(range(accepted))), intent


def test_verify_tree_greedy_follows_the_argmax_path() -> None:
    # tokens: 0:(7) 1:(8 after 7) 2:(5 after 7) 3:(6 at the root); rows: root, 7, 8, 5, 6
    draft = Draft((7, 8, 5, 6), parents=(-1, 0, 0, -1))
    logits = torch.full((5, 10), -5.0)
    for row, best in enumerate([7, 5, 1, 2, 4]):
        logits[row, best] = 5.0
    result = verify(logits, draft)
    assert result.path == (0, 2) and result.token_ids == (7, 5, 2) and result.num_accepted == 2
    logits[0] = -5.0
    logits[0, 3] = 5.0  # the target wants 3 at the root: nothing accepted
    assert verify(logits, draft) == Verification(0, (3,), (), *reference.target_signal(logits[0], 3))


def test_device_acceptance_equals_the_host_walk_on_random_trees_and_chains() -> None:
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    vocab = 5  # few tokens: long accepted paths are common
    trees = chains = 0
    for _ in range(300):
        size = rng.randint(0, 24)
        plant = [rng.randrange(vocab) for _ in range(size)]
        draft = random_tree(rng, size, vocab, plant) if size and rng.random() < 0.7 else Draft(tuple(plant))
        d = len(draft)
        logits = torch.randn(d + 1, vocab, generator=gen, dtype=torch.float64)
        if rng.random() < 0.5:  # make the target agree with the draft along a random root-to-leaf walk
            node = -1
            children = draft.children()
            while children.get(node):
                token, child = rng.choice(sorted(children[node].items()))
                logits[node + 1, token] += 10.0
                node = child
        result = verify(logits, draft)
        walk = reference.verify_tree(logits, draft.children())
        assert (result.num_accepted, result.token_ids, result.path) == (walk.num_accepted, walk.token_ids, walk.path)
        row = 0 if not walk.path else walk.path[-1] + 1
        logp, entropy = reference.target_signal(logits[row], walk.token_ids[-1])
        assert result.target_logprob == pytest.approx(logp, abs=1e-5)
        assert result.target_entropy == pytest.approx(entropy, abs=1e-5)
        if draft.is_tree:
            trees += 1
        else:
            chains += 1
            chain = reference.verify_greedy(logits, torch.tensor(draft.token_ids, dtype=torch.long))
            assert (result.num_accepted, result.token_ids) == (chain.num_accepted, chain.token_ids)
    assert trees > 100 and chains > 50


def test_ties_between_equally_deep_nodes_take_the_first() -> None:
    # not a valid Draft (siblings repeat), but the function itself must stay well defined
    choice = torch.tensor([3, 4, 4])
    n, path, tokens = accept(choice, torch.tensor([3, 3]), torch.tensor([-1, -1]))
    assert int(n) == 1 and path.tolist() == [0, -1] and tokens.tolist()[:2] == [3, 4]


# ---------------------------------------------------------------- sampling


def test_target_probs_warpers() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    top2 = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert top2[0, 2:].sum() == 0 and torch.isclose(top2.sum(), torch.tensor(1.0))
    nucleus = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert nucleus[0, 0] == 1.0  # the top token alone already holds more than half the mass
    cold = target_probs(logits, SamplingParams(temperature=0.1))
    assert cold[0, 0] > 0.99


def test_race_draws_from_the_weights() -> None:
    p = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.02, 0.0])
    n = 40_000
    draws = race(p.expand(n, -1), torch.Generator().manual_seed(7)).tolist()
    observed = Counter(draws)
    assert observed[9] == 0  # a zero weight never wins
    assert fits(observed, p, n)
    tv = 0.5 * sum(abs(observed[t] / n - float(p[t])) for t in range(10))
    assert tv < 0.01
    # the same test rejects a distribution a little off the target: it has the power to catch a wrong sampler
    wrong = p.clone()
    wrong[0], wrong[1] = 0.27, 0.23
    assert not fits(observed, wrong, n)
    # and unnormalised weights are drawn in proportion
    assert fits(Counter(race((3 * p).expand(n, -1), torch.Generator().manual_seed(8)).tolist()), p, n)


def test_sampling_randomness_is_fixed_per_step() -> None:
    # whatever is accepted, a step consumes the same randomness: the next draw is the same
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    after = []
    for draft in (Draft((0, 1, 2)), Draft((5, 5, 5)), Draft((0, 1, 2), parents=(-1, -1, 0))):
        gen = torch.Generator().manual_seed(3)
        verify(logits, draft, SAMPLE, gen)
        after.append(torch.rand(1, generator=gen).item())
    assert len(set(after)) == 1


def log_probs(p: list[list[float]]) -> torch.Tensor:
    return torch.tensor(p).log()  # p = 0 gives -inf: never drawn at temperature 1


def test_sampling_never_accepts_zero_probability_token() -> None:
    logits = log_probs([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])  # p after last: always token 1
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        result = verify(logits, Draft((0,)), SAMPLE, gen)
        assert result.num_accepted == 0 and result.token_ids == (1,)


def test_sampling_accepts_certain_token_and_adds_bonus() -> None:
    logits = log_probs([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    result = verify(logits, Draft((1,)), SAMPLE, torch.Generator().manual_seed(0))
    assert result.token_ids == (1, 2) and result.num_accepted == 1


def test_point_mass_draft_is_accepted_with_its_probability() -> None:
    # p = (0.5, 0.5): drafting token 0 is accepted half the time; when rejected, 1 must follow.
    logits = log_probs([[0.5, 0.5], [1.0, 0.0]])
    gen = torch.Generator().manual_seed(1)
    outcomes = [verify(logits, Draft((0,)), SAMPLE, gen).token_ids for _ in range(400)]
    assert set(outcomes) == {(0, 0), (1,)}
    assert 150 < outcomes.count((1,)) < 250


def test_tree_sampling_draws_from_the_target_at_each_node() -> None:
    logits = log_probs([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    draft = Draft((1, 2), parents=(-1, -1))
    seen = Counter(verify(logits, draft, SAMPLE, torch.Generator().manual_seed(s)).token_ids for s in range(40))
    assert set(seen) == {(1, 0), (2, 3)}  # the row of the accepted branch gives the next token


def test_q_draft_uses_ratio_and_residual() -> None:
    logits = log_probs([[0.2, 0.8], [1.0, 0.0]])
    q = torch.tensor([[0.8, 0.2]])  # over-proposes token 0: accepted w.p. 0.25
    gen = torch.Generator().manual_seed(2)
    outcomes = [verify(logits, Draft((0,), probs=q), SAMPLE, gen).token_ids for _ in range(800)]
    assert set(outcomes) <= {(0, 0), (1,)}
    assert 140 < outcomes.count((0, 0)) < 260  # 0.25 * 800 = 200


def test_q_equal_to_p_is_always_accepted() -> None:
    p = torch.tensor([[0.25, 0.75], [0.6, 0.4]])
    for seed in range(20):
        n, path, tokens = speculative_sampling(p, torch.tensor([1]), p[:1], torch.Generator().manual_seed(seed))
        assert int(n) == 1 and path.tolist() == [0] and tokens[0].item() == 1


def q_step_sampler(kind: str):
    if kind == "device":
        def step(p, x, q, gen):
            n, _, tokens = speculative_sampling(p, x, q, gen)
            return tuple(tokens[: int(n) + 1].tolist())
        return step
    return lambda p, x, q, gen: reference.verify_sampling(p, x, q, gen).token_ids


@pytest.mark.parametrize("kind", ["device", "reference"])
def test_speculative_sampling_with_q_keeps_the_target_distribution(kind: str) -> None:
    # x ~ q, then verification: the first emitted token must be ~ p_0, the second (emitted only
    # after x_1 was accepted) ~ p_1, the third ~ p_2 (the rows do not depend on x here)
    gen = torch.Generator().manual_seed(11)
    vocab, d, runs = 6, 2, 6000
    p = torch.softmax(torch.randn(d + 1, vocab, generator=gen), dim=-1)
    q = torch.softmax(torch.randn(d, vocab, generator=gen) * 1.5, dim=-1)
    step = q_step_sampler(kind)
    at: list[Counter] = [Counter() for _ in range(d + 1)]
    for _ in range(runs):
        x = torch.multinomial(q, 1, generator=gen)[:, 0]  # [d]
        for position, token in enumerate(step(p, x, q, gen)):
            at[position][token] += 1
    for position in range(d + 1):
        assert fits(at[position], p[position], sum(at[position].values())), position
    assert min(sum(c.values()) for c in at) > 500


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


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_greedy_step_verified_on_host_integers_equals_the_packed_tensor_path(data) -> None:
    # random trees (each parent earlier), draft tokens that often are the target's choice at their parent's row,
    # and logits with ties: the host path's Verification is the packed path's, field for field
    d = data.draw(st.integers(0, 12))
    vocab = data.draw(st.sampled_from([3, 5, 50]))
    seed = data.draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    ties = data.draw(st.booleans())
    logits = (torch.randint(0, 4, (d + 1, vocab), generator=gen).float() if ties
              else torch.randn(d + 1, vocab, generator=gen))
    choice = logits.argmax(dim=-1).tolist()
    chain = data.draw(st.booleans())
    parents: list[int] = []
    tokens: list[int] = []
    for i in range(d):
        parent = i - 1 if chain else data.draw(st.integers(-1, i - 1))
        taken = {t for p, t in zip(parents, tokens) if p == parent}  # siblings differ
        right = choice[parent + 1]
        options = [t for t in range(vocab) if t not in taken]
        if not options:
            break
        token = right if right in options and data.draw(st.booleans()) else data.draw(st.sampled_from(options))
        parents.append(parent)
        tokens.append(token)
    d = len(tokens)
    logits = logits[: d + 1]
    ids = torch.tensor(tokens, dtype=torch.long)
    packed = verify_step(logits, ids, torch.tensor(parents, dtype=torch.long), SamplingParams())
    expected = Verification.from_packed(packed.tolist())
    assert verify_on_host(logits, tokens, parents) == expected
    if chain:
        assert verify_on_host(logits, tokens) == expected


def test_a_sampled_tree_walked_on_the_host_draws_from_the_target_at_each_row_it_reaches() -> None:
    # root children 1 (node 0) and 2 (node 1); node 0's child 0 (node 2): each emitted token is a draw
    # from p at the row of the path so far, and the step ends at the first token no child holds
    p = torch.tensor([[0.1, 0.4, 0.3, 0.2], [0.5, 0.1, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]])
    logits, draft = p.log(), Draft((1, 2, 0), parents=(-1, -1, 0))
    expected: dict[tuple[int, ...], float] = {(0,): 0.1, (3,): 0.2}
    for t2 in range(4):
        expected[(2, t2)] = 0.3 * float(p[2, t2])
        if t2 != 0:
            expected[(1, t2)] = 0.4 * float(p[1, t2])
    for t3 in range(4):
        expected[(1, 0, t3)] = 0.4 * 0.5 * float(p[3, t3])
    n = 20_000
    gen = torch.Generator().manual_seed(4)
    seen = Counter(verify_on_host(logits, draft.token_ids, draft.parents, sampling=SAMPLE, generator=gen).token_ids
                   for _ in range(n))
    assert set(seen) <= set(expected)
    stat, df = chi_square(seen, expected, n)
    assert stat < critical(df)
    # the same test has the power to catch a walk that draws from the wrong row after node 0
    wrong = {k: (0.4 * 0.5 * float(p[2, k[2]]) if len(k) == 3 else v) for k, v in expected.items()}
    assert chi_square(seen, wrong, n)[0] > critical(df)


def test_a_sampled_step_walked_on_the_host_spends_randomness_on_the_rows_it_reaches_only() -> None:
    # the root's draw can never match (the drafted tokens have p = 0 there): one row's noise, whatever d
    logits = log_probs([[0.0, 0.0, 0.5, 0.5], *[[0.25, 0.25, 0.25, 0.25]] * 6])
    walked, one_row = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    result = verify_on_host(logits, (0, 1, 1, 1, 1, 1), sampling=SAMPLE, generator=walked)
    assert result.num_accepted == 0 and result.token_ids[0] in (2, 3)
    race(torch.ones(1, 4), one_row)
    assert torch.rand(1, generator=walked) == torch.rand(1, generator=one_row)
    # the same seed and draft give the same step
    again = verify_on_host(logits, (0, 1, 1, 1, 1, 1), sampling=SAMPLE, generator=torch.Generator().manual_seed(9))
    assert again == result


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_speculative_sampling_on_host_integers_equals_the_packed_tensor_path(data) -> None:
    # a chain with drafter distributions q: the host path draws the packed path's uniforms and race and
    # computes p only for the rows it reaches, and still gives its Verification field for field (so a
    # row's p alone is bit for bit the row's p among the step's rows), the generators ending alike
    d = data.draw(st.integers(0, 8))
    vocab = data.draw(st.sampled_from([3, 7, 60]))
    seed = data.draw(st.integers(0, 2**16))
    sampling = data.draw(st.sampled_from([SamplingParams(temperature=0.5), SamplingParams(temperature=1.0, top_p=0.8),
                                          SamplingParams(temperature=0.7, top_k=3, top_p=0.95)]))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(d + 1, vocab, generator=gen) * 2
    p = target_probs(logits, sampling)
    # q: near p (long accepted runs), far from it, a point mass, or p itself (a residual of zeros)
    kind = data.draw(st.sampled_from(["near", "far", "point", "same"]))
    if kind == "near":
        q = (p[:d] + 0.05 * torch.rand(d, vocab, generator=gen)).clamp_min(0)
    elif kind == "far":
        q = torch.rand(d, vocab, generator=gen)
    elif kind == "point":
        q = torch.zeros(d, vocab)
    else:
        q = p[:d].clone()
    draft = []
    for i in range(d):
        token = data.draw(st.integers(0, vocab - 1)) if data.draw(st.booleans()) else int(p[i].argmax())
        if kind == "point":
            q[i, token] = 1.0
        draft.append(token)
    q = q / q.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    on_device, on_host = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 1)
    packed = verify_step(logits, torch.tensor(draft, dtype=torch.long), torch.arange(-1, d - 1), sampling,
                         on_device, q)
    expected = Verification.from_packed(packed.tolist())
    assert verify_on_host(logits, draft, sampling=sampling, generator=on_host, draft_probs=q) == expected
    assert torch.rand(1, generator=on_device) == torch.rand(1, generator=on_host)
