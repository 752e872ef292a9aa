"""The hvd policy: cost model, length selection, and the hybrid drafter's choices (hand-made arrays)."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hvd_agents.drafters import CacheStore, Draft, DraftContext, DraftOutcome, HybridDrafter, SuffixDrafter
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.model.protocol import ModelDrafter, PlainModelDrafter
from hvd_agents.policy import CostModel, PayoffPredictor, PayoffWeights, RateEstimate, best_length
from hvd_agents.policy.features import FEATURE_NAMES, NUM_FEATURES
from hvd_agents.runtime import profile as cost_module
from tests.clocks import FakeClock, TickingClock
from tests.tiny import make_tiny_llama


def constant_predictor(logit: float) -> PayoffPredictor:
    """Every position has hazard sigmoid(logit), whatever the features."""
    w = np.zeros(NUM_FEATURES)
    w[FEATURE_NAMES.index("bias")] = logit
    return PayoffPredictor(PayoffWeights(w), learning_rate=0.0)


# ---------------------------------------------------------------- cost model and selection


def test_cost_model_interpolates_and_extrapolates() -> None:
    model = CostModel(((0, 1.0), (8, 1.16), (16, 1.4)))
    assert model.verify(0) == 1.0 and model.verify(8) == pytest.approx(1.16)
    assert model.verify(4) == pytest.approx(1.08) and model.verify(12) == pytest.approx(1.28)
    assert model.verify(24) == pytest.approx(1.64)  # the last segment's slope continues
    assert model.marginal(3).tolist() == pytest.approx([0.02, 0.02, 0.02])
    assert CostModel.linear(0.05).verify(10) == pytest.approx(1.5)
    assert CostModel.from_dict(model.to_dict()) == model
    drafting = CostModel(((0, 1.0), (8, 1.16)), draft_cost=0.5)  # a model drafter's own forwards
    assert drafting.verify(0) == 1.0 and drafting.verify(8) == pytest.approx(1.66)
    assert drafting.verify_curve(300)[299] == pytest.approx(1.5 + 0.02 * 299)  # past the precomputed range
    with pytest.raises(ValueError, match="point at 0"):
        CostModel(((1, 1.0),))
    with pytest.raises(ValueError, match="increasing"):
        CostModel(((0, 1.0), (8, 1.2), (4, 1.1)))
    with pytest.raises(ValueError, match=">= 0"):
        CostModel.linear(-0.1)


def test_best_length_worked_example() -> None:
    # cost 1 + 0.1 d at rate R = 2: token i is worth verifying iff S_i > 0.2
    choice = best_length(np.array([0.9, 0.5, 0.15]), CostModel.linear(0.1), rate=2.0)
    assert choice.length == 2
    assert choice.expected_tokens == pytest.approx(2.4) and choice.cost == pytest.approx(1.2)
    assert choice.value == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("survival", "c", "rate", "length"),
    [
        ([0.01, 0.001], 0.02, 1.0, 0),  # hopeless: no draft
        ([0.99] * 16, 0.02, 5.0, 16),  # near-certain: everything
        ([0.9, 0.8, 0.5, 0.3, 0.2, 0.1], 0.02, 1.0, 6),  # cheap verification: keep all above 0.02
        ([0.9, 0.8, 0.5, 0.3, 0.2, 0.1], 0.02, 12.0, 4),  # high rate: keep only S_i > 0.24
        ([0.9, 0.8, 0.5, 0.3, 0.2, 0.1], 1.0, 1.0, 0),  # verification as dear as a step: never pays
    ],
)
def test_best_length_table(survival, c, rate, length) -> None:
    assert best_length(np.array(survival), CostModel.linear(c), rate).length == length


def test_rate_estimate_moves_towards_observed_rate() -> None:
    rate = RateEstimate()
    for _ in range(100):
        rate.observe(tokens=6, cost=1.2)
    assert rate.rate == pytest.approx(5.0, rel=1e-3)


def test_robust_fit_ignores_one_disturbed_timing() -> None:
    # 100 ms per step and 0.5 ms per draft token, but the d=8 timing was hit by other load
    profile = cost_module._robust_profile([0, 4, 8, 16, 32], [0.100, 0.102, 0.300, 0.108, 0.116], 512)
    assert profile.verify(8) == pytest.approx(1.08)  # bounded by the longer draft's timing, not 3.0
    assert profile.verify(4) == pytest.approx(1.02) and profile.verify(32) == pytest.approx(1.16)
    assert profile.per_token == pytest.approx(0.005)
    assert all(b >= a for a, b in zip(profile.verify_curve(40), profile.verify_curve(40)[1:]))


def test_profile_keeps_a_cheap_first_draft_token_and_a_kernel_step() -> None:
    # a row-streaming kernel: the first draft tokens cost little, then about 6% of a step each,
    # and past 32 rows the layers fall back to a matrix-matrix kernel (a jump); d=12 was disturbed
    lengths = [0, 1, 2, 4, 8, 12, 16, 24, 32]
    seconds = [0.049, 0.052, 0.055, 0.062, 0.070, 0.140, 0.095, 0.123, 0.192]
    profile = cost_module._robust_profile(lengths, seconds, 512)
    assert profile.verify(1) == pytest.approx(0.052 / 0.049)
    assert profile.verify(8) == pytest.approx(0.070 / 0.049)
    assert profile.verify(12) == pytest.approx(0.095 / 0.049)  # the disturbed timing is bounded by d=16's
    assert profile.verify(32) == pytest.approx(0.192 / 0.049)  # the jump is kept
    assert profile.verify(28) == pytest.approx((0.123 + 0.192) / 2 / 0.049)
    assert profile.marginal(2)[0] < 0.1  # an affine fit through all points would charge the first token ~0.4


def test_profile_keeps_the_jump_of_the_first_draft_token() -> None:
    # a CPU: one token runs matrix-vector kernels (56 ms), two or more matrix-matrix ones (92 ms and up)
    profile = cost_module._robust_profile([0, 1, 2, 4, 8, 16, 32],
                                          [0.056, 0.092, 0.0925, 0.093, 0.094, 0.096, 0.100], 300)
    assert profile.verify(0) == 1.0
    assert profile.verify(1) == pytest.approx(0.092 / 0.056, rel=0.01)
    assert profile.verify(32) == pytest.approx(0.100 / 0.056, rel=0.01)
    assert profile.marginal(2)[0] > 0.5 > profile.marginal(2)[1]  # the first draft token costs the most
    assert profile.plausible


_MEASURE = """
import sys
from pathlib import Path

import torch

from hvd_agents.runtime import profile
from tests.tiny import make_tiny_llama

profile.cached_cost_model(make_tiny_llama(64, dtype=torch.float32), Path(sys.argv[1]))
"""


def test_measured_and_cached_cost_profile(tmp_path, monkeypatch, caplog) -> None:
    # Measured in a fresh process: once other threads of this one have run OpenMP regions (the
    # batching tests do), libgomp throttles its spin-waits and small forwards time differently.
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)], cwd=root, check=True,
                   env={**os.environ, "PYTHONPATH": str(root)})
    model = make_tiny_llama(64, dtype=torch.float32)

    def refuse_first(*args, **kwargs):
        raise AssertionError("the profile measured by the other process must be read from the cache")

    monkeypatch.setattr(cost_module, "measure_cost_model", refuse_first)
    profile = cost_module.cached_cost_model(model, tmp_path)
    monkeypatch.undo()
    assert profile.points[0] == (0, 1.0) and profile.points[-1][0] == 32 and profile.points[-1][1] >= 1.0
    assert profile.plausible and profile.source.startswith("measured")
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("the cached profile must be reused")

    monkeypatch.setattr(cost_module, "measure_cost_model", refuse)
    assert cost_module.cached_cost_model(model, tmp_path) == profile

    files[0].write_text("{broken")
    monkeypatch.setattr(cost_module, "measure_cost_model", lambda m: CostModel(((0, 1.0), (4, 6.2))))
    with caplog.at_level(logging.WARNING):  # disturbed timings: never cached, the linear default is used
        assert cost_module.cached_cost_model(model, tmp_path) == CostModel.linear(0.02)
    assert "implausible" in caplog.text and files[0].read_text() == "{broken"

    monkeypatch.setattr(cost_module, "measure_cost_model", lambda m: CostModel.linear(0.5))
    with caplog.at_level(logging.WARNING):
        assert cost_module.cached_cost_model(model, tmp_path) == CostModel.linear(0.5)
    assert "unreadable" in caplog.text
    assert json.loads(files[0].read_text())["source"] == "linear c=0.5"  # rewritten


def test_a_profile_to_measure_is_measured_when_the_first_request_starts_not_in_its_steps() -> None:
    calls = []

    def measure() -> CostModel:
        calls.append(1)
        return CostModel.linear(0.02)

    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(2.0), measure)
    assert not calls  # nothing is measured until a request needs it
    drafter.start("r", [1, 2, 3, 1, 2])
    assert calls == [1]
    draft = drafter.propose(DraftContext("r", [1, 2, 3, 1, 2], 5), 4)
    drafter.observe(DraftOutcome("r", draft, 0, (7,)))
    drafter.stop("r")
    drafter.start("s", [4, 5])
    assert calls == [1] and drafter.profile == CostModel.linear(0.02)  # once, then kept


def test_the_first_hvd_request_of_an_engine_measures_the_profile_before_its_first_forward(monkeypatch) -> None:
    # one-time work is not decoding: where the first hvd request measures the target's profile, it does so when the
    # request starts, before its first forward (its prefill): never inside its timed prefill or decoding
    from hvd_agents.engine import Engine, GenerationParams

    engine = Engine(make_tiny_llama(64, dtype=torch.float32), eos_token_ids=())
    events = []
    forward = engine.runner.forward

    def recorded_forward(*args, **kwargs):
        events.append("forward")
        return forward(*args, **kwargs)

    def profile() -> CostModel:
        events.append("profile")
        return CostModel.linear(0.02)

    monkeypatch.setattr(engine.runner, "forward", recorded_forward)
    monkeypatch.setattr(engine.runner, "profile", profile)
    result = engine.generate([3, 17, 42, 5, 9, 3, 17, 42], GenerationParams(max_new_tokens=8, method="hvd"))
    assert result.stats.new_tokens == 8 and "forward" in events
    assert events[0] == "profile" and events.count("profile") == 1


# ---------------------------------------------------------------- the hybrid drafter


def start(drafter: HybridDrafter, prompt: list[int]) -> DraftContext:
    drafter.start("r", prompt)
    return DraftContext("r", list(prompt), len(prompt))


def test_confident_cache_draft_is_verified_whole() -> None:
    # "10 11" occurred before, followed by 12 13 20 21
    prompt = [10, 11, 12, 13, 20, 21, 5, 10, 11]
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02))
    draft = drafter.propose(start(drafter, prompt), 4)
    assert draft.token_ids == (12, 13, 20, 21)
    assert draft.source.startswith("suffix:") and draft.features.full_len == 4.0
    assert 3.5 < draft.features.pred_accepted <= 4.0


def test_doubtful_cache_draft_is_cut_or_dropped() -> None:
    prompt = [10, 11, 12, 13, 20, 21, 5, 10, 11]
    # hazard 0.5 at rate 1 and c = 0.2: S = 0.5, 0.25, 0.125 ... keep while S_i > 0.2 -> 2 tokens
    cut = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.2))
    assert cut.propose(start(cut, prompt), 4).token_ids == (12, 13)
    dropped = HybridDrafter(SuffixDrafter(None), constant_predictor(-4.0), CostModel.linear(0.2))
    assert dropped.propose(start(dropped, prompt), 4) == Draft()


class CountingDrafter:
    """A plain drafter (no ModelDrafter declarations): proposes [7, 7, ...] with a q and counts its calls."""

    def __init__(self) -> None:
        self.proposed = 0
        self.observed: list[DraftOutcome] = []

    def start(self, req_id, prompt_ids, structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.proposed += 1
        probs = torch.zeros(k, 16)  # [k, vocab]
        probs[:, 7] = 1.0
        return Draft((7,) * k, probs, source="model")

    def observe(self, outcome: DraftOutcome) -> None:
        self.observed.append(outcome)

    def stop(self, req_id) -> None:
        pass


class CountingModelDrafter(CountingDrafter):
    """The same as a declared ModelDrafter: drafts the k tokens it is asked for (no stopping, no gate), and
    its pending context is what arrived since it last drafted."""

    uses_hidden_states = False
    acceptance_prior: float | None = None
    cost_prior = 0.1
    ingest_cost_prior = 0.002
    gates_first_token = False

    def __init__(self) -> None:
        super().__init__()
        self.drafted_at: dict[str, int] = {}

    def pending(self, ctx: DraftContext) -> int:
        return len(ctx.token_ids) - self.drafted_at.get(ctx.req_id, 0)

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        self.drafted_at[ctx.req_id] = len(ctx.token_ids)
        return super().propose(ctx, k)


def test_model_draft_where_the_cache_has_nothing_and_not_where_it_is_confident() -> None:
    model = CountingModelDrafter()
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02), model=model)
    ctx = start(drafter, [1, 2, 3, 4])  # no repeat: the cache has no draft
    draft = drafter.propose(ctx, 4)
    assert draft.source == "model" and model.proposed == 1
    drafter.observe(DraftOutcome("r", draft, 0, (9,)))  # rejected at once
    assert model.observed[-1].draft is draft

    confident = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02), model=model)
    ctx = start(confident, [10, 11, 12, 13, 20, 21, 5, 10, 11])
    assert confident.propose(ctx, 4).source.startswith("suffix:")
    assert model.proposed == 1  # the model drafter was not even run


class ThresholdRecordingDrafter(CountingModelDrafter):
    """Records the ``min_survival`` the hybrid policy asks a model draft to stop at."""

    def __init__(self) -> None:
        super().__init__()
        self.min_survival: list[float] = []

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        self.min_survival.append(min_survival)
        return super().propose(ctx, k)


def test_model_draft_continues_while_a_further_token_pays_for_itself() -> None:
    # the first draft token costs 0.4 of a step to verify, each further one 0.05, drafting 0.1 per token:
    # whether to draft at all is the value comparison; the draft continues while S > R * (0.05 + 0.1)
    model = ThresholdRecordingDrafter()
    model.acceptance_prior = 0.9
    cost = CostModel(((0, 1.0), (1, 1.4), (9, 1.8)))
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), cost, model=model,
                            model_cost=cost.with_drafting(0.1))
    draft = drafter.propose(start(drafter, [1, 2, 3, 4]), 4)
    assert draft.source == "model"
    assert model.min_survival == [pytest.approx(drafter.rate.rate * 0.15)]


class GatedModelDrafter(ThresholdRecordingDrafter):
    """Also gates its first token: drafts only when its first token's reach (``reach``) clears ``min_first``."""

    gates_first_token = True

    def __init__(self, reach: float) -> None:
        super().__init__()
        self.reach = reach
        self.min_first: list[float] = []

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        self.min_first.append(min_first)
        draft = super().propose(ctx, k, min_survival)
        return draft if self.reach >= min_first else Draft()


def test_a_gated_model_drafter_is_asked_where_no_cache_draft_pays_and_its_first_token_decides() -> None:
    cost = CostModel(((0, 1.0), (1, 1.2), (9, 1.6)))
    # its running acceptance (0.05) says a model draft never pays, yet it is asked: its confidence decides
    sure = GatedModelDrafter(reach=0.9)
    sure.acceptance_prior = 0.05
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), cost, model=sure,
                            model_cost=cost.with_drafting(0.1))
    ctx = start(drafter, [1, 2, 3, 4])
    draft = drafter.propose(ctx, 4)
    rate = drafter.rate.rate
    # a plain step is worth 1 - R; one drafted token 1 + p - R * verify(1): the first token needs p > 0.2 R
    assert sure.min_first == [pytest.approx(rate * 0.2)]
    assert draft.source == "model" and len(draft) == 4
    drafter.observe(DraftOutcome("r", draft, 4, (7, 7, 7, 7, 9)))
    # unsure of its first token: it was asked, drafted nothing, and the step is a plain one
    unsure = GatedModelDrafter(reach=0.1)
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), cost, model=unsure,
                            model_cost=cost.with_drafting(0.1))
    assert drafter.propose(start(drafter, [1, 2, 3, 4]), 4) == Draft() and unsure.proposed == 1
    # where the cache draft pays and the running acceptance says the model cannot beat it, it is not asked
    confident = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), cost, model=sure,
                              model_cost=cost.with_drafting(0.1))
    assert confident.propose(start(confident, [10, 11, 12, 13, 20, 21, 5, 10, 11]), 4).source.startswith("suffix:")
    assert sure.proposed == 1


def test_in_a_batch_the_step_cost_of_the_batch_prices_drafts_and_the_model_drafter() -> None:
    from dataclasses import replace

    prompt = [10, 11, 12, 13, 20, 21, 5, 10, 11]
    cost = CostModel(((0, 1.0), (1, 1.2), (9, 1.6)))
    sure = GatedModelDrafter(reach=0.9)
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), cost, model=sure,
                            model_cost=cost.with_drafting(0.1))
    ctx = start(drafter, prompt)
    # rows nearly free in this batch: the whole cache draft, with the predictor's survival for the batcher
    free = drafter.propose(replace(ctx, step_cost=CostModel.linear(0.01), step_share=0.5), 4)
    assert free.token_ids == (12, 13, 20, 21) and free.survival is not None and len(free.survival) == 4
    assert all(a >= b for a, b in zip(free.survival, free.survival[1:]))
    # each row costs a whole share (16 requests on two cores): no draft, and the gated model drafter is not
    # asked (its forward could not pay even for a certain first token)
    dear = drafter.propose(replace(ctx, step_cost=CostModel.linear(1.0), step_share=0.37), 4)
    assert dear == Draft() and sure.proposed == 0
    # alone, the same drafter asks it where no cache draft pays
    alone = start(drafter, [1, 2, 3, 4])
    assert drafter.propose(alone, 4).source == "model" and sure.proposed == 1


def test_model_rejections_make_the_model_drafter_give_way() -> None:
    model = CountingModelDrafter()
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.3), model=model)
    ctx = start(drafter, [1, 2, 3, 4])
    for step in range(12):
        draft = drafter.propose(ctx, 4)
        token = 50 + step
        drafter.observe(DraftOutcome("r", draft, 0, (token,)))
        ctx.token_ids.append(token)
    assert model.proposed < 12  # after repeated rejections, plain steps are cheaper


def test_cache_history_only_learns_from_its_own_drafts() -> None:
    cache = SuffixDrafter(None)
    model = CountingModelDrafter()
    drafter = HybridDrafter(cache, constant_predictor(6.0), CostModel.linear(0.02), model=model)
    ctx = start(drafter, [1, 2, 3, 4])
    draft = drafter.propose(ctx, 4)
    assert draft.source == "model"
    drafter.observe(DraftOutcome("r", draft, 0, (9,)))
    state = cache._requests["r"]
    assert state.history.drafts == 0  # the model's rejection is not the cache's
    assert state.index.tokens.tolist()[-1] == 9  # but the cache follows the context


def test_store_drafts_and_stop_release_state() -> None:
    store = CacheStore()
    first = HybridDrafter(SuffixDrafter(store), constant_predictor(6.0), CostModel.linear(0.02))
    ctx = start(first, [1, 2, 3])
    out = [40, 41, 42, 43, 44, 45]
    for token in out:
        first.observe(DraftOutcome("r", Draft(), 0, (token,)))
        ctx.token_ids.append(token)
    first.stop("r")
    assert first._requests == {}
    ctx = start(first, [9, 9, 40, 41])  # the earlier output is in the store now
    assert first.propose(ctx, 3).token_ids == (42, 43, 44)


def test_disagreeing_candidates_grow_a_tree_and_its_outcome_teaches_the_alternative_rates() -> None:
    prompt = [5, 1, 2, 3, 3, 6, 1, 2, 4, 9, 7, 1, 2, 3, 3, 8, 1, 2]  # after "1 2": 3 3 6, 4 9 7 or 3 3 8
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.01))
    drafter.alternatives.taken = 0.9
    draft = drafter.propose(start(drafter, prompt), 10)
    assert draft.is_tree and draft.token_ids[: draft.main_length][:3] == (3, 3, 8)
    roots = [draft.token_ids[i] for i, parent in enumerate(draft.parents) if parent == -1]
    assert roots == [3, 4]
    taken = drafter.alternatives.taken
    drafter.observe(DraftOutcome("r", draft, 3, (4, 9, 7, 5)))  # the target took the alternative for 3 tokens
    assert drafter.alternatives.taken > taken
    # at the prior (t = 0.35) the alternative's first token survives 0.5 * 0.35 < 0.2: it does not pay at c = 0.2
    plain = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.2),
                          config=HybridConfig(judge_alternatives=False))
    chain = plain.propose(start(plain, prompt), 10)
    assert chain.token_ids == (3, 3) and not chain.is_tree
    # judged, it survives the mean of that and the predictor's 0.5 (the path 4 9 7 as a proposal of its own):
    # 0.34 pays, and its next token survives the predictor's hazard 0.5 times that, 0.17, which does not
    judged = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.2))
    tree = judged.propose(start(judged, prompt), 10)
    assert tree.is_tree and tree.token_ids == (3, 3, 4)
    assert judged.decision("r").main == 2 and tree.parents == (-1, 0, -1)


def test_a_tree_of_alternatives_alone_where_no_main_token_pays() -> None:
    prompt = [5, 1, 2, 3, 3, 6, 1, 2, 4, 9, 7, 1, 2, 3, 3, 8, 1, 2]
    # hazard 0.1: the main branch's first token survives 0.1; its alternative 0.9 * 0.9 = 0.81
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(-math.log(9.0)), CostModel.linear(0.2))
    drafter.alternatives.taken = 0.9
    draft = drafter.propose(start(drafter, prompt), 10)
    assert draft.token_ids[:1] == (4,) and drafter.decision("r").main == 0
    drafter.observe(DraftOutcome("r", draft, 3, (4, 9, 7, 5)))  # the main token was rejected, the alternative taken
    assert drafter.alternatives.taken > 0.9


def test_hvd_without_branches_drafts_chains() -> None:
    prompt = [5, 1, 2, 3, 3, 6, 1, 2, 4, 9, 7, 1, 2, 3, 3, 8, 1, 2]
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(0.0), CostModel.linear(0.01), branches=0)
    drafter.alternatives.taken = 0.9
    assert not drafter.propose(start(drafter, prompt), 10).is_tree


def test_hvd_calibrates_a_measured_profile_to_the_engine_step_timings(monkeypatch) -> None:
    from hvd_agents.drafters.hybrid import drafter as hybrid

    clock = FakeClock()
    monkeypatch.setattr(hybrid, "time", clock)
    profile = CostModel(((0, 1.0), (1, 1.5), (16, 2.0)))
    measured = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), lambda: profile, branches=0)
    given = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), profile, branches=0)
    assert measured.calibrate and not given.calibrate
    cycle = [1, 2, 3, 4, 5, 6]
    for drafter in (measured, given):
        ctx = start(drafter, cycle + [1])
        fresh = 1000
        for _ in range(120):
            draft = drafter.propose(ctx, 4)
            # the engine's step: 0.1 s, plus 0.4 of what the profile says the draft adds
            verify_s = 0.1 * (1.0 + 0.4 * (profile.verify(len(draft)) - 1.0))
            if draft.token_ids:  # the cycle continues: all accepted, then a token nobody has seen
                emitted = draft.token_ids + (fresh,)
                fresh += 1
            else:  # after a fresh token the cycle starts again
                emitted = (1,)
            drafter.observe(DraftOutcome("r", draft, len(draft), emitted, verify_s=verify_s))
            ctx.token_ids.extend(emitted)
        assert drafter.calibration.plain_s == pytest.approx(0.1)
    assert measured.calibration.steps > 30
    assert measured.calibration.alpha == pytest.approx(0.4, abs=0.03)
    assert measured.cost.verify(1) == pytest.approx(1.0 + measured.calibration.alpha * 0.5, abs=0.01)
    assert given.cost is profile  # a given cost model is taken as is


class TimedModelDrafter(CountingModelDrafter):
    """A model drafter whose drafts take ``seconds[i]`` of the fake clock."""

    def __init__(self, clock: FakeClock, seconds: list[float]) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        self.clock.now += self.seconds[self.proposed]
        return super().propose(ctx, k)


def test_model_drafting_is_timed_only_once_the_drafter_is_caught_up(monkeypatch) -> None:
    # the first draft of a request ingests the whole prompt (1 s here): charging that to its 4 tokens would
    # price the drafter out; the next draft, right after a model step, is its cost per token
    from hvd_agents.drafters.hybrid import drafter as hybrid

    clock = FakeClock()
    monkeypatch.setattr(hybrid, "time", clock)
    model = TimedModelDrafter(clock, [1.0, 0.02, 0.02])
    model.acceptance_prior = 0.9
    profile = CostModel.linear(0.02)
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), profile, model=model)
    ctx = start(drafter, [1, 2, 3, 4])
    for step in range(2):
        draft = drafter.propose(ctx, 4)
        assert draft.source == "model"
        # the target's step, as the engine times it
        drafter.observe(DraftOutcome("r", draft, 4, (7, 7, 7, 7, 60 + step), verify_s=0.1 * profile.verify(4)))
        ctx.token_ids.extend((7, 7, 7, 7, 60 + step))
        if step == 0:
            assert drafter.model_cost().verify(4) == pytest.approx(profile.verify(4) + 4 * 0.1)  # still the prior
    drafter.propose(ctx, 4)  # caught up again: this draft is timed too
    # 0.02 s for 4 tokens against 0.1 s plain steps: 0.05 of a step per drafted token
    assert drafter.model_cost().verify(4) == pytest.approx(profile.verify(4) + 4 * 0.05, abs=1e-3)


def test_the_first_timed_catch_up_prices_the_next_ones(monkeypatch) -> None:
    # a drafter whose catch-up is dear (a draft head in float32 on a CPU: a tenth of a plain step per ingested
    # token here) must not be priced at the prior until a running mean catches up: one timed catch-up is enough
    from hvd_agents.drafters.hybrid import drafter as hybrid

    clock = FakeClock()
    monkeypatch.setattr(hybrid, "time", clock)
    asked = []
    for timed_first in (True, False):
        model = TimedModelDrafter(clock, [40 * 0.01 + 4 * 0.01, 0.05])  # 40 tokens at 0.01 s, 4 drafted at 0.01 s
        model.acceptance_prior = 0.9
        drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02), model=model)
        for _ in range(3):
            drafter.calibration.observe(0.1, 0.0)  # the engine's plain steps: 0.1 s
        if timed_first:
            ctx = start(drafter, list(range(100, 140)))  # no repeat: no cache draft; 40 tokens to catch up on
            draft = drafter.propose(ctx, 4)
            assert draft.source == "model"  # at the prior, 40 tokens cost 0.08 of a step
            drafter.observe(DraftOutcome("r", draft, 4, (7, 7, 7, 7, 60), verify_s=0.1))
            # 0.44 s less the 4 drafted tokens at the prior (0.1 of a 0.1 s step each): 0.01 s a token
            assert drafter.pricing.ingest_cost() == pytest.approx(0.1)
        drafter.start("r2", list(range(1000, 1300)))  # a new request: 300 tokens to catch up on
        before = model.proposed
        drafter.propose(DraftContext("r2", list(range(1000, 1300)), 300), 4)
        asked.append(model.proposed > before)
    assert asked == [False, True]  # 30 plain steps of catching up against a prior 0.6


class CaughtUpModelDrafter(CountingModelDrafter):
    """Says it has nothing to ingest (a draft head that kept its entries from an earlier request)."""

    def pending(self, ctx: DraftContext) -> int:
        return 0


@pytest.mark.parametrize(("drafter_class", "length", "drafts"), [
    (CountingModelDrafter, 8, True),
    (CountingModelDrafter, 3000, False),  # ingesting 3,000 tokens first costs more than a draft can gain
    (CaughtUpModelDrafter, 3000, True),  # ... unless the drafter has them already
])
def test_model_drafter_is_charged_for_the_context_it_must_catch_up_on(drafter_class, length, drafts) -> None:
    model = drafter_class()
    model.acceptance_prior = 0.6
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02), model=model)
    draft = drafter.propose(start(drafter, list(range(100, 100 + length))), 4)  # no repeat: no cache draft
    assert (draft.source == "model") is drafts and model.proposed == int(drafts)


def test_sampled_requests_decide_from_the_profile_not_from_step_timings() -> None:
    # under sampling the drafts decide which random numbers are drawn: a seeded request's output must not depend
    # on how long steps took, so only greedy requests use the calibration
    profile = CostModel(((0, 1.0), (1, 1.5), (16, 2.0)))
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(-1.0), lambda: profile, branches=0)
    for _ in range(300):  # the engine's steps: a draft costs 0.4 of what the profile says
        drafter.calibration.observe(0.1, 0.0)
        drafter.calibration.observe(0.1 * (1.0 + 0.4 * 0.5), 0.5)
    prompt = [10, 11, 12, 13, 20, 21, 5, 10, 11]
    drafter.start("greedy", prompt)
    drafter.start("sampled", prompt)
    # S = 0.27, 0.07, 0.02, ...: worth 3 tokens at the calibrated 1.2 + 0.013 per further token, none at the
    # profile's 1.5 + 0.033
    assert drafter.propose(DraftContext("greedy", list(prompt), len(prompt)), 4).token_ids == (12, 13, 20)
    assert drafter.propose(DraftContext("sampled", list(prompt), len(prompt), temperature=0.9), 4) == Draft()


def test_calibration_times_verification_and_the_policy_not_the_streams_consumer(monkeypatch) -> None:
    # a consumer that takes seconds between two events (a UI, a tool call parser) must not make the engine's
    # steps look dear: a step is the engine's verification plus the policy's own time in propose
    from hvd_agents.drafters.hybrid import drafter as hybrid

    clock = FakeClock()
    monkeypatch.setattr(hybrid, "time", clock)
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(-6.0), lambda: CostModel.linear(0.02))
    ctx = start(drafter, [1, 2, 3, 4])
    for step in range(5):
        draft = drafter.propose(ctx, 4)
        assert draft == Draft()  # plain steps
        drafter.observe(DraftOutcome("r", draft, 0, (50 + step,), verify_s=0.1))
        ctx.token_ids.append(50 + step)
        clock.now += 3.0  # the consumer's time
    assert drafter.calibration.plain_s == pytest.approx(0.1)
    drafter.observe(DraftOutcome("r", Draft(), 0, (60,)))  # a step the engine did not time (verify_s 0) is not folded
    assert drafter.calibration.plain_s == pytest.approx(0.1)


def test_propose_and_observe_outside_a_started_request_raise() -> None:
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02))
    with pytest.raises(ValueError, match="'never'"):
        drafter.propose(DraftContext("never", [1, 2, 3], 3), 4)
    with pytest.raises(ValueError, match="'never'"):
        drafter.observe(DraftOutcome("never", Draft(), 0, (4,)))
    ctx = start(drafter, [1, 2, 3])
    drafter.propose(ctx, 4)
    drafter.observe(DraftOutcome("r", Draft(), 0, (4,)))
    drafter.stop("r")
    drafter.stop("r")  # safe twice
    with pytest.raises(ValueError, match="'r'.*not started"):
        drafter.propose(ctx, 4)
    with pytest.raises(ValueError, match="'r'"):
        drafter.observe(DraftOutcome("r", Draft(), 0, (5,)))


def test_a_plain_drafter_is_wrapped_with_what_it_does_not_declare() -> None:
    # a Drafter that declares nothing drafts the k tokens it is asked for, and pays for the context since it
    # last drafted: here the whole prompt (3,000 tokens) at first, which no draft can repay
    for length, drafts in ((8, True), (3000, False)):
        plain = CountingDrafter()
        drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02),
                                model=PlainModelDrafter(plain, acceptance_prior=0.6))
        draft = drafter.propose(start(drafter, list(range(100, 100 + length))), 4)
        assert (draft.source == "model") is drafts and plain.proposed == int(drafts)
    wrapped = HybridDrafter(SuffixDrafter(None), model=CountingDrafter()).model
    assert isinstance(wrapped, PlainModelDrafter) and isinstance(wrapped, ModelDrafter)
    assert not wrapped.gates_first_token and wrapped.acceptance_prior is None
    ctx = DraftContext("r", [1, 2, 3, 4, 5], 5)
    wrapped.start("r", ctx.token_ids)
    assert wrapped.pending(ctx) == 5  # nothing drafted yet
    assert len(wrapped.propose(ctx, 3, min_survival=0.9)) == 3  # what it was asked for, whatever the threshold
    assert wrapped.pending(DraftContext("r", [1, 2, 3, 4, 5, 9, 8], 5)) == 2  # the tokens since


def test_a_half_declared_model_drafter_is_refused() -> None:
    # a drafter that says its acceptance but not the rest would be priced by defaults it did not choose
    half = CountingDrafter()
    half.acceptance_prior = 0.9
    with pytest.raises(TypeError, match="acceptance_prior.*but not.*pending"):
        HybridDrafter(SuffixDrafter(None), model=half)
    assert isinstance(HybridDrafter(SuffixDrafter(None), model=CountingModelDrafter()).model, CountingModelDrafter)


def test_decisions_are_kept_per_request() -> None:
    # two requests proposed before either is observed (as a batch would): each observe learns from its own step
    model = CountingModelDrafter()
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02), model=model)
    cached_prompt = [10, 11, 12, 13, 20, 21, 5, 10, 11]
    drafter.start("cache", cached_prompt)
    drafter.start("model", [1, 2, 3, 4])
    from_cache = drafter.propose(DraftContext("cache", list(cached_prompt), len(cached_prompt)), 4)
    from_model = drafter.propose(DraftContext("model", [1, 2, 3, 4], 4), 4)
    assert from_cache.source.startswith("suffix:") and from_model.source == "model"
    before = drafter.model_acceptance
    drafter.observe(DraftOutcome("cache", from_cache, 4, (12, 13, 20, 21, 5)))
    assert drafter.model_acceptance == before  # the cache step did not move the model's acceptance
    drafter.observe(DraftOutcome("model", from_model, 0, (9,)))
    assert drafter.model_acceptance < before  # the model step did


def test_the_step_predicts_the_proposals_median_accepted_length() -> None:
    """What the paper's measures read (``StepDecision.predicted``, the replay's probe) is the survival curve's
    median, not its sum: hazards of sigmoid(3) give the 6 tokens proposed a 0.75 chance together, so the median
    is past 6 where the sum (5.1) is not."""
    from hvd_agents.policy.payoff import median_accepted

    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(3.0), CostModel.linear(0.02))
    prompt = [10, 11, 12, 13, 20, 21, 22, 23, 5, 10, 11]
    drafter.start("r", prompt)
    drafter.propose(DraftContext("r", list(prompt), len(prompt)), 6)
    decision = drafter.decision("r")
    survival = np.cumprod(np.full(len(decision.cache_tokens), 1 / (1 + math.exp(-3.0))))
    assert len(decision.cache_tokens) == 6 and decision.predicted == pytest.approx(median_accepted(survival))
    assert survival.sum() < 6 < decision.predicted < 7


class DecliningTimedDrafter(CountingModelDrafter):
    """A gated model drafter whose every ask takes ``seconds`` of the fake clock and drafts nothing (its first
    token's reach never clears the bar)."""

    gates_first_token = True

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None,
                min_first: float | None = None) -> Draft:
        self.clock.now += self.seconds
        super().propose(ctx, k)
        return Draft()


@pytest.mark.parametrize(("seconds", "asked"), [(0.05, (2, 4)), (0.001, (40, 60))])
def test_a_gated_drafter_is_asked_only_while_its_measured_ask_pays(monkeypatch, seconds, asked) -> None:
    # with no cache draft, a gated drafter may be asked at every step; its forward is spent whether or not it
    # drafts. Asks that take half a plain step and never draft stop at once; asks that cost almost nothing go on
    from hvd_agents.drafters.hybrid import drafter as hybrid

    clock = FakeClock()
    monkeypatch.setattr(hybrid, "time", clock)
    model = DecliningTimedDrafter(clock, seconds)
    drafter = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02), model=model)
    ctx = start(drafter, [1, 2, 3, 4])
    for step in range(60):  # fresh tokens only: the cache never has a draft
        assert drafter.propose(ctx, 4) == Draft()
        drafter.observe(DraftOutcome("r", Draft(), 0, (100 + step,), verify_s=0.1))
        ctx.token_ids.append(100 + step)
    assert asked[0] <= model.proposed <= asked[1]
    # the declined asks were timed: a drafter forward at its measured share of a plain step
    assert drafter.pricing.draft_token_cost() == pytest.approx(seconds / 0.1, rel=0.05)



@pytest.mark.parametrize(("prompt", "asked"), [
    (4, True),  # 40 of the reply's tokens piled up while it was not asked: not charged to the ask
    (44, False),  # 40 of the prompt's: a debt the ask pays, more than the gate's running gain
])
def test_an_ask_is_charged_for_the_prompt_it_must_ingest_not_the_reply_it_missed(prompt, asked) -> None:
    # charged for the reply's tokens too, each step the gate skips raises the next ask's price about as fast as the
    # gain recovers towards its prior: a drafter passed over a few times was never asked again in the reply
    from hvd_agents.drafters.hybrid.ask import AskGain, Ema, Gate
    from hvd_agents.drafters.hybrid.model_step import ask_model
    from hvd_agents.drafters.hybrid.pricing import StepPrices
    from hvd_agents.drafters.hybrid.step import Candidate
    from hvd_agents.policy.selection import no_draft

    model = GatedModelDrafter(reach=0.9)
    ctx = DraftContext("r", list(range(100, 144)), prompt)  # 44 tokens, the drafter last saw none of them
    model.drafted_at["r"] = 0 if prompt == 44 else 4
    assert model.pending(ctx) == 44 - model.drafted_at["r"]
    cost = CostModel.linear(0.02)
    prices = StepPrices(rate=1.0, cost=cost, model_cost=cost.with_drafting(0.1), draft_token=0.1, ingest=0.01)
    gate = Gate(Ema(0.1), AskGain(prior=0.5, ema=0.2, explore=0.02, value=0.3))  # above 0.1, below 0.1 + 0.44
    step = ask_model(model, ctx, 4, Candidate("none", no_draft(cost, 1.0)), prices, acceptance=0.5, caught_up=False,
                     ask=gate, pricing=_NoPricing(), clock=lambda: 0.0)
    assert (model.proposed == 1) is asked and (step.ask_cost is not None) is asked
    if asked:
        assert step.ask_cost == pytest.approx(0.1)  # the forward alone
        assert step.best.source == "model" and step.best.choice.cost > float(cost.with_drafting(0.1).verify(4)) - 1e-9


class _NoPricing:
    """Takes the timings an ask reports and keeps none."""

    def observe_model_draft(self, seconds: float, drafted: int, pending: int, caught_up: bool) -> None:
        pass


class MatchCountingSuffix(SuffixDrafter):
    """The cache drafter, counting the proposals whose features it computed and those a gate cut short."""

    def __init__(self) -> None:
        super().__init__(None)
        self.computed = self.cut = 0

    def propose(self, ctx: DraftContext, k: int, min_match: int = 1, *, described: bool = True) -> Draft:
        draft = super().propose(ctx, k, min_match, described=described)
        self.computed += bool(draft.token_ids)
        self.cut += not draft.token_ids and draft.score > 0
        return draft


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_proposals_of_one_token_matches_are_computed_only_while_they_pay(monkeypatch, temperature) -> None:
    # every step's context ends in a token seen once before, after another token: a one-token match, whose
    # continuation the (confident) predictor drafts and the target always rejects. Greedy requests stop computing
    # such proposals; sampled ones (whose drafts must not depend on timings) compute every one
    from hvd_agents.drafters.hybrid import drafter as hybrid

    monkeypatch.setattr(hybrid, "time", FakeClock())
    cache = MatchCountingSuffix()
    drafter = HybridDrafter(cache, constant_predictor(6.0), CostModel.linear(0.05))
    prompt = list(range(1, 48))
    drafter.start("r", prompt)
    context = list(prompt)
    steps = 40
    for i in range(steps):  # each new token follows one it never followed before
        ctx = DraftContext("r", list(context), len(prompt), temperature=temperature)
        draft = drafter.propose(ctx, 4)
        token = (7 * (i + 1)) % 47 + 1
        drafter.observe(DraftOutcome("r", draft, 0, (token,), verify_s=0.01))
        context.append(token)
    matched = steps - 1  # the first step's last token (47) was seen nowhere before
    if temperature > 0:
        assert (cache.computed, cache.cut) == (matched, 0)
    else:
        # a dozen to learn that they do not pay, then one now and then as the running gain drifts back
        assert cache.computed + cache.cut == matched
        assert cache.computed <= 20 and cache.cut >= 19


class DescribeCountingSuffix(SuffixDrafter):
    """The cache drafter, counting the alternatives it described for the predictor."""

    def __init__(self) -> None:
        super().__init__(None)
        self.described_count = 0

    def described(self, ctx, proposal, alternative):
        self.described_count += 1
        return super().described(ctx, proposal, alternative)


@pytest.mark.parametrize(("temperature", "calibrate"), [(0.0, True), (0.8, True), (0.0, False)])
def test_alternatives_are_judged_only_while_what_they_bring_pays_for_judging_them(monkeypatch, temperature,
                                                                                  calibrate) -> None:
    # after "1 2" the candidates went on 3 3 6, 4 9 7 and 3 3 8, and the target always emits a fresh token instead:
    # the judged alternatives bring nothing. Greedy requests stop judging them after a few steps (a judged
    # alternative costs a millisecond of a 10 ms step here); sampled ones judge at every step, as does a drafter
    # whose costs are given rather than timed (a trace replay)
    from hvd_agents.drafters.hybrid import drafter as hybrid

    monkeypatch.setattr(hybrid, "time", TickingClock())
    cache = DescribeCountingSuffix()
    drafter = HybridDrafter(cache, constant_predictor(0.0), CostModel.linear(0.01), calibrate=calibrate,
                            config=HybridConfig(whole_proposals=False))  # every proposal planned
    prompt = [5, 1, 2, 3, 3, 6, 1, 2, 4, 9, 7, 1, 2, 3, 3, 8, 1, 2]
    drafter.start("r", prompt)
    context = list(prompt)
    judged_steps = []
    steps = 40
    for i in range(steps):
        before = cache.described_count
        draft = drafter.propose(DraftContext("r", list(context), len(prompt), temperature=temperature), 6)
        judged_steps.append(cache.described_count > before)
        emitted = (100 + i, 1, 2)  # rejected at once; the context ends in "1 2" again
        drafter.observe(DraftOutcome("r", draft, 0, emitted, verify_s=0.01))
        context.extend(emitted)
    if temperature > 0 or not calibrate:
        assert all(judged_steps)
    else:
        assert all(judged_steps[:2]) and sum(judged_steps) <= 10 and not any(judged_steps[-10:])
        assert drafter.judging.value < drafter.config.judge_gain_prior


def test_an_ask_that_drafts_is_credited_with_what_its_draft_brought() -> None:
    from hvd_agents.drafters.hybrid.ask import AskGain, ask_gain

    gain = AskGain(prior=0.5, ema=0.5, explore=0.1)
    assert gain.pays(1.0, 0.4) and not gain.pays(2.0, 0.4)
    # 3 tokens accepted from a step priced 1.6 (the ask's 0.1 included), at R = 2: 3 - 1.2 + 0.2
    assert ask_gain(3, 1.6, 0.1, 2.0) == pytest.approx(2.0)
    gain.observe(0.0)
    assert gain.value == pytest.approx(0.25)
    gain.skipped()
    assert gain.value == pytest.approx(0.275)


def test_survival_calibration_starts_as_the_predictor_and_learns_where_it_is_overconfident() -> None:
    from hvd_agents.policy.survival_calibration import SurvivalCalibration

    calibration = SurvivalCalibration()
    survival = np.array([0.95, 0.9, 0.7, 0.4, 0.12, 0.03])
    assert np.allclose(calibration.apply(survival), survival)  # the identity before any outcome
    for i in range(200):  # drafts given S = 0.9 at every position: half rejected at once, half accepted whole
        calibration.observe(np.full(8, 0.9), 0 if i % 2 else 8)
    calibrated = calibration.apply(survival)
    assert calibrated[1] == pytest.approx(0.5, abs=0.1)
    assert np.all(np.diff(calibrated) <= 0)  # a survival never rises along a draft
    assert calibration.apply(np.zeros(0)).shape == (0,)


def test_a_given_cost_model_keeps_the_predictor_as_it_is() -> None:
    # trace replays price with a given CostModel: their decisions are the predictor's, uncalibrated
    given = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), CostModel.linear(0.02))
    measured = HybridDrafter(SuffixDrafter(None), constant_predictor(6.0), lambda: CostModel.linear(0.02))
    assert given.survival_calibration is None and measured.survival_calibration is not None


class SlowPredictor(PayoffPredictor):
    """A confident predictor whose every prediction takes ``seconds`` of the fake clock."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        constant = constant_predictor(2.0)
        super().__init__(constant.weights, learning_rate=0.0)
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def hazards(self, *args, **kwargs):
        self.calls += 1
        self.clock.now += self.seconds
        return super().hazards(*args, **kwargs)


FLAT = CostModel(((0, 1.0), (1, 1.01), (32, 1.05)))


@pytest.mark.parametrize(("profile", "temperature", "measured", "whole"), [
    (FLAT, 0.0, True, True),  # a GPU's flat profile, measured: planning cannot pay
    (CostModel.linear(0.2), 0.0, True, False),  # a CPU's: a cut saves far more than the planning costs
    (FLAT, 0.8, True, False),  # sampled requests never decide from timings
    (FLAT, 0.0, False, False),  # a given cost model (tests, replays): decisions that do not depend on timings
])
def test_a_proposal_is_verified_whole_where_planning_it_costs_more_than_verifying_it(monkeypatch, profile,
                                                                                     temperature, measured,
                                                                                     whole) -> None:
    # a repeating cycle the cache drafter proposes at every step; each prediction takes 0.5 ms, a step 1 ms
    from hvd_agents.drafters.hybrid import drafter as hybrid

    clock = FakeClock()
    monkeypatch.setattr(hybrid, "time", clock)
    predictor = SlowPredictor(clock, 0.0005)
    drafter = HybridDrafter(SuffixDrafter(None), predictor, (lambda: profile) if measured else profile, branches=0)
    cycle = list(range(1, 9))
    ctx = start(drafter, cycle * 3)
    ctx = DraftContext("r", ctx.token_ids, ctx.num_prompt_tokens, temperature=temperature)
    plans = []
    for _ in range(30):
        draft = drafter.propose(ctx, 8)
        decision = drafter.decision("r")
        plans.append(decision.plan)
        assert draft.token_ids  # the cycle is always proposed
        emitted = draft.token_ids[:3] + (cycle[(ctx.token_ids.index(draft.token_ids[0]) + 3) % 8],)
        drafter.observe(DraftOutcome("r", draft, 3, emitted, verify_s=0.001))
        ctx.token_ids.extend(emitted)
    if whole:
        assert plans[0] == "planned" and set(plans[2:]) == {"whole"}  # timed once, then taken whole
        assert predictor.calls == 1 and drafter.plan_seconds == pytest.approx(0.0005)
        assert len(draft) == 8 and drafter.decision("r") is None  # the proposal as it is, observed
    else:
        assert "whole" not in plans and predictor.calls == 30


def test_a_cut_draft_accepted_whole_labels_the_proposals_next_token_by_the_targets() -> None:
    from hvd_agents.drafters.hybrid.cache_step import next_accepted
    from hvd_agents.drafters.hybrid.step import StepDecision

    step = StepDecision(source="cache", main=2, cache_tokens=(5, 6, 7, 8))
    assert next_accepted(DraftOutcome("r", Draft((5, 6)), 2, (5, 6, 7)), step) is True  # the target went on with 7
    assert next_accepted(DraftOutcome("r", Draft((5, 6)), 2, (5, 6, 9)), step) is False
    assert next_accepted(DraftOutcome("r", Draft((5, 6)), 1, (5, 9)), step) is None  # rejected inside the cut
    whole = StepDecision(source="cache", main=4, cache_tokens=(5, 6, 7, 8))
    assert next_accepted(DraftOutcome("r", Draft((5, 6, 7, 8)), 4, (5, 6, 7, 8, 1)), whole) is None  # nothing cut


def test_the_hybrid_drafter_feeds_the_next_label_to_its_predictor() -> None:
    from hvd_agents.policy.features import CacheDraftFeatures
    from hvd_agents.structure import PromptStructure

    w = np.zeros(NUM_FEATURES)
    w[FEATURE_NAMES.index("bias")] = 1.0
    online = {"learning_rate": 0.5, "moves": ["bias"], "weighting": "position"}
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    probe = CacheDraftFeatures(match_len=3)
    moved = []
    for next_label in (False, True):
        predictor = PayoffPredictor(PayoffWeights(w, {"online": online | {"next_label": next_label}}))
        drafter = HybridDrafter(SuffixDrafter(None), predictor, CostModel.linear(0.6))
        drafter.start("r", prompt, PromptStructure(tuple(prompt), (), "s"))
        draft = drafter.propose(DraftContext("r", list(prompt), len(prompt)), 6)
        assert 0 < len(draft.token_ids) < 6 and draft.source.startswith("suffix")  # 4 5 6 7 8 9, cut at this c
        before = predictor.expected_accepted(probe, 4, "s")
        drafter.observe(DraftOutcome("r", draft, len(draft.token_ids), (*draft.token_ids, 0)))  # then not the copy
        moved.append(predictor.expected_accepted(probe, 4, "s") - before)
    assert moved[0] > 0  # accepted whole: the intercept rises
    assert moved[1] < moved[0]  # but the target's next token was not the proposal's: a rejection label too
