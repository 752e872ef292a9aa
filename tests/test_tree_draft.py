"""The cache draft as a tree over disagreeing candidates: which nodes are verified, what the target accepts,
and what the rates learn (hand-made drafts and a synthetic replay, no model)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_agents.drafters import Draft, DraftContext, DraftOutcome, HybridDrafter, SuffixDrafter
from hvd_agents.drafters.cache.suffix import Alternative
from hvd_agents.drafters.hybrid.tree import AlternativeRates, plan_tree
from hvd_agents.policy import CostModel, PayoffPredictor, PayoffWeights
from hvd_agents.policy.features import FEATURE_NAMES, NUM_FEATURES
from hvd_agents.structure import PromptStructure
from hvd_agents.trace.replay import Turn, replay_turn
from hvd_agents.trace.stats import PolicyStats
from hvd_agents.trace.strategies import DrafterPolicy, OraclePolicy, TreeOraclePolicy, common_prefix


def rates(taken: float = 0.35, goes_on: float = 0.8) -> AlternativeRates:
    return AlternativeRates(taken, goes_on, ema=0.05)


def constant_predictor(logit: float) -> PayoffPredictor:
    w = np.zeros(NUM_FEATURES)
    w[FEATURE_NAMES.index("bias")] = logit
    return PayoffPredictor(PayoffWeights(w), learning_rate=0.0)


def test_worked_example_of_the_module_docstring() -> None:
    main = Draft((1, 2))
    plan = plan_tree(main, np.array([0.9, 0.45]), [Alternative(1, 1.0, (7, 8))], rates(0.3, 0.8),
                     CostModel.linear(0.01), 2.0, 16)
    assert plan.draft.token_ids == (1, 2, 7, 8) and plan.draft.parents == (-1, 0, 0, 2) and plan.main == 2
    assert plan.survival == pytest.approx((0.9, 0.45, 0.135, 0.108))
    assert plan.choice.expected_tokens == pytest.approx(1 + 0.9 + 0.45 + 0.135 + 0.108)


def test_a_tree_accepts_the_run_of_the_candidate_the_target_follows() -> None:
    # two candidates agree on 1 2 then disagree; the target follows the less frequent one
    frequent, other = (1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 9, 10, 11, 12, 13, 14)
    target = (*other, 99)
    survival = np.array([0.95, 0.9, 0.5, 0.45, 0.4, 0.36, 0.32, 0.29])
    plan = plan_tree(Draft(frequent), survival, [Alternative(2, 0.4, other[2:])], rates(),
                     CostModel.linear(0.005), 3.0, 16)
    assert plan.draft.is_tree
    accepted = len(plan.draft.path(target))
    assert accepted > common_prefix(frequent, target) == 2  # the single draft the oracle cuts: 2 tokens
    assert accepted == 8  # the other candidate's whole run, in the same step
    assert plan.choice.length <= 16 and plan.main == 8


def test_main_tokens_and_alternatives_share_the_node_budget_best_first() -> None:
    # a doubtful main branch: with room for 6 nodes, its deep tokens give way to the alternative's first ones
    main = Draft(tuple(range(1, 17)))
    survival = 0.6 ** np.arange(1, 17)  # 0.6, 0.36, 0.216, ...
    plan = plan_tree(main, survival, [Alternative(0, 0.5, (40, 41, 42, 43))], rates(1.0, 0.9),
                     CostModel.linear(0.0), 1.0, 6)
    assert len(plan.draft) == 6
    # main 0.6, 0.36 (then 0.216) beside the alternative's 0.4, 0.36, 0.324, 0.2916
    assert plan.draft.token_ids == (1, 2, 40, 41, 42, 43) and plan.draft.parents == (-1, 0, -1, 2, 3, 4)
    assert plan.main == 2 and min(plan.survival) > survival[2]


def test_without_alternatives_the_plan_is_the_best_length_of_the_chain() -> None:
    from hvd_agents.policy import best_length

    survival = np.array([0.97, 0.95, 0.9, 0.3, 0.08])
    for c, rate in ((0.02, 5.0), (0.1, 2.0), (0.3, 4.0)):
        plan = plan_tree(Draft((1, 2, 3, 4, 5)), survival, [], rates(), CostModel.linear(c), rate, 16)
        choice = best_length(survival, CostModel.linear(c), rate)
        assert plan.choice == choice and not plan.draft.is_tree and plan.main == choice.length


def test_alternatives_departing_together_split_the_taken_rate_by_share() -> None:
    main = Draft((1, 2, 3))
    alternatives = [Alternative(0, 0.3, (7,)), Alternative(0, 0.1, (8,)), Alternative(0, 0.0, (9,))]
    plan = plan_tree(main, np.array([0.5, 0.25, 0.125]), alternatives, rates(0.4), CostModel.linear(0.0), 1.0, 16)
    by_token = dict(zip(plan.draft.token_ids, plan.survival))
    # reach 1, main rejected 0.5, taken 0.4, weights 0.3 / 0.1 / 0.1 (a shorter match's backup) of 0.5
    assert by_token[7] == pytest.approx(0.5 * 0.4 * 0.6)
    assert by_token[8] == pytest.approx(by_token[9]) == pytest.approx(0.5 * 0.4 * 0.2)


def test_a_judged_alternative_survives_by_the_mean_of_the_rates_and_the_predictor_then_the_predictors_hazards() -> None:
    main = Draft((1, 2, 3))
    survival = np.array([0.8, 0.4, 0.2])
    alternatives = [Alternative(1, 1.0, (7, 8, 9)), Alternative(1, 0.5, (6,), fork=True)]
    asked: list[int] = []

    def judge(i: int) -> np.ndarray:  # the path 1 7 8 9 as the predictor sees it
        asked.append(i)
        return np.array([0.8, 0.3, 0.15, 0.03])

    plan = plan_tree(main, survival, alternatives, rates(0.5, 0.9), CostModel.linear(0.0), 1.0, 16, judge)
    assert asked == [0]  # the fork's alternative is priced by its share alone
    by_token = dict(zip(plan.draft.token_ids, plan.survival))
    rates_chance = 0.8 * 0.5 * 0.5  # S_0 * (1 - h_1) * t * w / W
    assert by_token[7] == pytest.approx(0.5 * (rates_chance + 0.3))
    assert by_token[8] == pytest.approx(by_token[7] * 0.15 / 0.3)  # the predictor's hazard, not g
    assert by_token[9] == pytest.approx(by_token[8] * 0.03 / 0.15)
    assert by_token[6] == pytest.approx(0.8 * min(0.5, 0.5))
    unjudged = plan_tree(main, survival, alternatives, rates(0.5, 0.9), CostModel.linear(0.0), 1.0, 16)
    assert dict(zip(unjudged.draft.token_ids, unjudged.survival))[8] == pytest.approx(rates_chance * 0.9)


def test_judged_alternatives_departing_together_never_take_more_than_the_main_branch_leaves() -> None:
    main = Draft((1, 2))
    alternatives = [Alternative(0, 0.5, (7,)), Alternative(0, 0.5, (8,))]
    plan = plan_tree(main, np.array([0.6, 0.3]), alternatives, rates(0.2), CostModel.linear(0.0), 1.0, 16,
                     lambda i: np.array([0.9]))  # each as sure as can be: together scaled to the 0.4 left
    by_token = dict(zip(plan.draft.token_ids, plan.survival))
    assert by_token[7] == by_token[8] == pytest.approx(0.5 * (0.4 * 0.2 * 0.5 + 0.2))


def test_alternatives_that_could_not_pay_even_if_judged_sure_are_not_judged() -> None:
    main = Draft((1, 2))
    asked: list[int] = []

    def judge(i: int) -> np.ndarray:
        asked.append(i)
        return np.array([1.0, 1.0])

    # the main token is rejected at most 0.05 of the time: an alternative there survives at most
    # 0.5 * (0.05 * 0.35 + 0.05) < 0.04, which no node pays for at R = 2, c = 0.02
    plan = plan_tree(main, np.array([0.95, 0.9]), [Alternative(0, 1.0, (7, 8))], rates(), CostModel.linear(0.02),
                     2.0, 16, judge)
    assert asked == [] and not plan.draft.is_tree


def test_rates_learn_only_from_alternatives_the_target_could_take() -> None:
    tree = Draft((1, 2, 3, 7, 8), parents=(-1, 0, 1, 0, 3))  # main 1 2 3; alternative 7 8 departing at depth 1
    learned = rates(0.5, 0.5)
    learned.observe(tree, 3, (1, 7, 8, 4), (1, 2, 3))  # main rejected at depth 1, the alternative taken whole
    assert learned.taken > 0.5 and learned.goes_on > 0.5
    untried = rates(0.5, 0.5)
    untried.observe(tree, 3, (1, 2, 3, 4), (1, 2, 3))  # the whole main branch accepted: nothing tried
    assert (untried.taken, untried.goes_on) == (0.5, 0.5)
    missed = rates(0.5, 0.5)
    missed.observe(tree, 3, (1, 5), (1, 2, 3))  # rejected at depth 1 by a token no branch had
    assert missed.taken < 0.5 and missed.goes_on == 0.5
    cut = rates(0.5, 0.5)
    # the main branch cut after 1 token, the alternative departs at depth 1: the target's token at depth 1 is the
    # main branch's own (2, not verified), so the alternative was not tried against it
    cut.observe(Draft((1, 7, 8), parents=(-1, 0, 1)), 1, (1, 2), (1, 2, 3))
    assert cut.taken == 0.5


def _turn(prompt: list[int], target: tuple[int, ...]) -> Turn:
    return Turn("c", 0, 1, PromptStructure(tuple(prompt), session_id="c"), target)


def test_replay_hvd_tree_accepts_more_per_step_than_the_single_draft_oracle() -> None:
    line = [0, 50, 51]  # a line's opening, then its continuation
    common = list(range(10, 22))
    rare = list(range(30, 42))
    prompt = [*line, *common, *line, *common, *line, *rare, *line]
    target = (*rare, 7, 8)
    cost = CostModel.linear(0.005)
    hvd = DrafterPolicy("hvd", HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), cost))
    oracle = OraclePolicy("oracle", SuffixDrafter(None))
    runs: dict[str, list] = {"hvd": [], "oracle": []}
    for policy in (hvd, oracle):
        replay_turn(policy, _turn(prompt, target), 16, runs[policy.name].append)
    # the oracle's single draft is the frequent line (wrong from its first token); hvd's tree carries the rare one
    assert runs["oracle"][0].accepted == 0 and runs["oracle"][0].cache_accepted == 0
    assert runs["hvd"][0].accepted >= 4 and runs["hvd"][0].cache_accepted == 0
    assert len(runs["hvd"]) <= len(runs["oracle"])
    for steps in runs.values():
        assert sum(s.accepted + 1 for s in steps) == len(target)


def test_replay_tree_oracle_takes_the_continuation_the_reply_follows_cut_exactly() -> None:
    line = [0, 50, 51]
    common = list(range(10, 22))
    rare = list(range(30, 42))
    prompt = [*line, *common, *line, *common, *line, *rare, *line]
    target = (*rare, 7, 8)
    hvd = DrafterPolicy("hvd", HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.005)))
    runs: dict[str, list] = {"hvd": [], "oracle": [], "oracle-tree": []}
    for policy in (hvd, OraclePolicy("oracle", SuffixDrafter(None)), TreeOraclePolicy("oracle-tree", SuffixDrafter(None))):
        replay_turn(policy, _turn(prompt, target), 16, runs[policy.name].append)
    first = runs["oracle-tree"][0]
    # the proposal is the frequent line (wrong at its first token); the rare candidate's run is verified, exactly
    assert first.cache_accepted == 0 and first.accepted == first.drafted == len(rare)
    assert all(s.drafted == s.accepted for s in runs["oracle-tree"])
    assert first.accepted >= runs["hvd"][0].accepted and first.accepted > runs["oracle"][0].accepted == 0
    assert len(runs["oracle-tree"]) <= min(len(runs["hvd"]), len(runs["oracle"]))
    assert sum(s.accepted + 1 for s in runs["oracle-tree"]) == len(target)
    stats = {name: PolicyStats(name) for name in runs}
    for name, steps in runs.items():
        for step in steps:
            stats[name].add_step(step)
    # the rare run is taken off the proposal's path; the oracle's cut of the proposal takes nothing off it
    assert stats["oracle-tree"].figures(0.02)["off_path_tokens"] >= len(rare)
    assert stats["oracle"].figures(0.02)["off_path_tokens"] == 0


def test_hvd_tree_step_in_the_drafter_keeps_the_main_branch_first() -> None:
    prompt = [0, 50, 51, 1, 2, 3, 0, 50, 51, 1, 2, 3, 0, 50, 51, 4, 5, 6, 0, 50, 51]
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.005))
    drafter.start("r", prompt)
    draft = drafter.propose(DraftContext("r", prompt, len(prompt)), 8)
    main = drafter.decision("r").main
    assert draft.token_ids[:1] == (1,) and 4 in draft.token_ids[main:]
    drafter.observe(DraftOutcome("r", draft, len(draft.path((4, 5, 6, 0))), (4, 5, 6, 0)))
    assert drafter.alternatives.taken > drafter.config.alternative_taken_prior


def test_a_fork_alternative_survives_by_its_share_within_what_the_main_token_leaves() -> None:
    # main S = [0.5, 0.4] (hazards 0.5, 0.8); a fork at depth 0 seen going on with 7 in 30% of its occurrences, one
    # at depth 1 with 8 in 90%: 7 survives 0.3 (below the 0.5 the main token leaves), 8 survives 0.5 * 0.2 (all that
    # the main token leaves there); a candidate alternative's share is not split with them
    alternatives = [Alternative(0, 0.3, (7,), fork=True), Alternative(1, 0.9, (8,), fork=True),
                    Alternative(0, 0.5, (9,))]
    plan = plan_tree(Draft((1, 2)), np.array([0.5, 0.4]), alternatives, rates(0.4), CostModel.linear(0.0), 1.0, 16)
    by_token = dict(zip(plan.draft.token_ids, plan.survival))
    assert by_token[7] == pytest.approx(0.3)
    assert by_token[8] == pytest.approx(0.5 * 0.2)
    assert by_token[9] == pytest.approx(0.5 * 0.4)  # reach 1, main rejected 0.5, taken 0.4, its share the whole


def test_fork_alternatives_never_taken_lower_their_scale_and_leave_the_candidates_rate_alone() -> None:
    # main 1 2 3 with S = [0.5, 0.4, 0.3] (hazard 0.5 at depth 0); a fork alternative (share 0.4) and a
    # candidate's (share 1) depart at depth 0; the target rejects the main token and takes neither, every time
    learned = rates(0.4)
    alternatives = [Alternative(0, 0.4, (7,), fork=True), Alternative(0, 1.0, (8,))]
    survival = np.array([0.5, 0.4, 0.3])
    first = plan_tree(Draft((1, 2, 3)), survival, alternatives, learned, CostModel.linear(0.0), 1.0, 16)
    node = first.draft.token_ids.index(7)
    assert first.forks == ((node, pytest.approx(0.8)),)  # min(0.4, 0.5) / 0.5: its chance where 1 is rejected
    assert first.survival[node] == pytest.approx(0.4)
    taken_before = learned.taken
    for _ in range(40):
        plan = plan_tree(Draft((1, 2, 3)), survival, alternatives, learned, CostModel.linear(0.0), 1.0, 16)
        learned.observe(plan.draft, plan.main, (9,), (1, 2, 3), plan.forks)
    assert learned.fork_scale < 0.2
    later = plan_tree(Draft((1, 2, 3)), survival, alternatives, learned, CostModel.linear(0.0), 1.0, 16)
    assert later.survival[later.draft.token_ids.index(7)] < 0.1
    assert learned.taken == pytest.approx(taken_before * 0.95**40)  # the candidate's alternative: tried, not taken
    # where the target takes the fork alternative, its scale rises and t, the candidates' rate, still falls
    other = rates(0.4)
    for _ in range(40):
        plan = plan_tree(Draft((1, 2, 3)), survival, alternatives, other, CostModel.linear(0.0), 1.0, 16)
        other.observe(plan.draft, plan.main, (7, 5), (1, 2, 3), plan.forks)
    assert other.fork_scale > 1.1 and other.taken < 0.1


def test_a_taken_alternative_cut_short_learns_its_rate_from_the_targets_next_token() -> None:
    # main 1 2 3; an alternative 7 (8 9 ...) departing at depth 1, cut after its first token: the target's token
    # after 7 says whether 8, not verified, would have been accepted
    alternative = Alternative(1, 1.0, (7, 8, 9))
    plan = plan_tree(Draft((1, 2, 3)), np.array([0.9, 0.5, 0.4]), [alternative], rates(0.4, 0.2),
                     CostModel.linear(0.0), 1.0, 4)
    assert plan.draft.token_ids == (1, 2, 3, 7) and plan.draft.parents == (-1, 0, 1, 0)
    assert plan.beyond == ((3, 8),)
    went_on = rates(0.5, 0.5)
    went_on.observe(plan.draft, plan.main, (1, 7, 8), (1, 2, 3), plan.forks, plan.beyond)
    assert went_on.goes_on > 0.5
    stopped = rates(0.5, 0.5)
    stopped.observe(plan.draft, plan.main, (1, 7, 5), (1, 2, 3), plan.forks, plan.beyond)
    assert stopped.goes_on < 0.5
    # one observation per taken alternative, however many of its tokens were verified: the same outcome gives the
    # same rate whether 8 was verified (and rejected) or cut and compared with the target's own token
    verified = rates(0.5, 0.5)
    verified.observe(Draft((1, 2, 3, 7, 8), parents=(-1, 0, 1, 0, 3)), 3, (1, 7, 5), (1, 2, 3), (), ((4, 9),))
    assert verified.goes_on == stopped.goes_on


def _unpruned_plan(main: tuple[int, ...], survival: np.ndarray, alternatives: list[Alternative],
                   learned: AlternativeRates, cost: CostModel, rate: float, k: int) -> tuple:
    """What the tree planner chooses, every node built: the node values of :func:`plan_tree`'s docstring, taken
    best first and cut at the best value."""
    values, parents, tokens = list(survival), list(range(-1, len(main) - 1)), list(main)
    reach = np.concatenate([[1.0], survival])
    hazard = survival / reach[:-1]
    departing: dict[int, float] = {}
    for a in alternatives:
        if not a.fork and a.depth < len(main):
            departing[a.depth] = departing.get(a.depth, 0.0) + (a.share if a.share > 0 else 0.1)
    for a in alternatives:
        if a.depth >= len(main):
            continue
        left = 1.0 - hazard[a.depth]
        weight = a.share if a.share > 0 else 0.1
        alive = (reach[a.depth] * min(a.share * learned.fork_scale, left) if a.fork
                 else reach[a.depth] * left * learned.taken * weight / departing[a.depth])
        parent = a.depth - 1
        for token in a.tokens[: k - a.depth]:
            values.append(float(alive))
            parents.append(parent)
            tokens.append(token)
            parent = len(values) - 1
            alive *= learned.goes_on
    order: list[int] = []
    frontier = [(-values[i], i) for i in range(len(values)) if parents[i] == -1]
    while frontier and len(order) < k:
        frontier.sort()
        _, node = frontier.pop(0)
        order.append(node)
        frontier += [(-values[i], i) for i in range(len(values)) if parents[i] == node]
    curve = cost.verify_curve(len(order) + 1)
    gains = np.concatenate([[1.0], 1.0 + np.cumsum([values[i] for i in order])])
    length = int(np.argmax(gains - rate * curve))
    return tuple(sorted(tokens[i] for i in order[:length])), length


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_plan_is_the_same_as_with_every_node_built(data) -> None:
    # the planner leaves out nodes that cannot pay (a survival at most the rate times the cheapest node); the
    # chosen tree is the one chosen with every node built
    n = data.draw(st.integers(1, 12))
    hazards = data.draw(st.lists(st.floats(0.05, 1.0), min_size=n, max_size=n))
    survival = np.cumprod(hazards)
    main = tuple(range(1, n + 1))
    alternatives = [Alternative(data.draw(st.integers(0, n - 1)), data.draw(st.floats(0.0, 1.0)),
                                tuple(range(100 * (j + 1), 100 * (j + 1) + data.draw(st.integers(1, 6)))),
                                fork=data.draw(st.booleans()))
                    for j in range(data.draw(st.integers(0, 4)))]
    learned = AlternativeRates(data.draw(st.floats(0.0, 1.0)), data.draw(st.floats(0.0, 1.0)), ema=0.05)
    cost = data.draw(st.sampled_from([CostModel.linear(0.0), CostModel.linear(0.02), CostModel.linear(0.3),
                                      CostModel([(0, 1.0), (1, 1.2), (4, 1.3), (16, 2.5)])]))
    rate, k = data.draw(st.floats(1.0, 8.0)), data.draw(st.integers(1, 16))
    plan = plan_tree(Draft(main), survival, alternatives, learned, cost, rate, k)
    assert (tuple(sorted(plan.draft.token_ids)), plan.choice.length) == _unpruned_plan(
        main, survival, alternatives, learned, cost, rate, k)


def test_rates_skip_forks_the_engine_cut_off() -> None:
    # the engine cuts a tree to a prefix (the budget, a runner's tree limit, a grammar's first refused path): a fork
    # planned at node 4 of a 3-token tree was never verified and must not be read
    rates = AlternativeRates(0.5, 0.5, ema=0.05)
    draft = Draft((7, 8, 5), parents=(-1, 0, 0))  # main 7 8, alternative 5 to 8
    before = (rates.fork_taken, rates.fork_expected)
    rates.observe(draft, 2, (7, 9), (7, 8, 9, 9), forks=[(4, 0.3)])
    assert (rates.fork_taken, rates.fork_expected) == before
