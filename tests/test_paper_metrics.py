"""The paper's measures in ``hvd-agents analyze``, the paper's MLP and its offline training."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_agents.cli import main
from hvd_agents.policy.paper import (
    PAPER_FEATURES,
    PaperMLP,
    PaperWeightsError,
    ThresholdQuality,
    TokenClasses,
    fit_mlp,
)
from hvd_agents.trace.loader import load_trace
from hvd_agents.trace.replay import ReplayConfig, replay_trace
from hvd_agents.trace.report import format_table
from hvd_agents.trace.stats import PolicyStats, ReplayStepRecord
from tests.helpers import make_byte_tokenizer
from tests.trace_data import conversations, write_jsonl


def step(arm: str, cache_drafted: int, cache_accepted: int, predicted: float | None, drafted: int = 0,
         accepted: int = 0) -> ReplayStepRecord:
    return ReplayStepRecord("p", "c", 0, 1, 0, "suffix:user", drafted, accepted, {}, arm, cache_drafted, cache_accepted,
                      predicted)


def test_high_payoff_share_precision_recall_and_arms_by_hand() -> None:
    stats = PolicyStats("p", payoff_threshold=6)
    stats.add_request(40)
    for record in (
        step("cache", 16, 9, 7.5, drafted=16, accepted=9),  # high, flagged: a hit
        step("cache", 16, 6, 4.0, drafted=16, accepted=6),  # high (6 >= 6), not flagged (4 <= 6): a miss
        step("model", 16, 0, 6.5, drafted=3, accepted=1),  # flagged, not high: a false alarm
        step("none", 16, 1, 1.0),  # neither
        step("none", 0, 0, None),  # no cache proposal: not counted
    ):
        stats.add_step(record)
    fig = stats.figures(0.02)
    assert fig["cache_drafts"] == 4 and fig["pct_high_payoff"] == pytest.approx(50.0)
    assert fig["precision"] == pytest.approx(0.5) and fig["recall"] == pytest.approx(0.5)
    assert fig["pct_steps_by_arm"] == {"cache": 40.0, "model": 20.0, "merged": 0.0, "none": 40.0}
    assert fig["cycles_per_1k"] == pytest.approx(1000 * 5 / 40)
    assert fig["wasted_tokens"] == (16 - 9) + (16 - 6) + (3 - 1)


def test_a_policy_without_a_predictor_reports_none() -> None:
    stats = PolicyStats("suffix")
    stats.add_request(2)
    stats.add_step(step("cache", 4, 1, None, drafted=4, accepted=1))
    fig = stats.figures(0.02)
    assert fig["precision"] is None and fig["recall"] is None and fig["pct_high_payoff"] == 0.0


@pytest.fixture(scope="module")
def tok():
    return make_byte_tokenizer()


def test_analyze_reports_the_paper_measures_for_every_policy(tok, tmp_path) -> None:
    trace = load_trace(write_jsonl(tmp_path / "t.jsonl", conversations() * 2))
    names = ("suffix", "hvd", "hvd-paper", "hvd-chain", "hvd-graft", "oracle")
    steps: list[ReplayStepRecord] = []
    result = replay_trace(tok, trace, ReplayConfig(names, k=16, payoff_threshold=4), step_sink=steps.append,
                          progress=False)
    for name in names:
        mine = [s for s in steps if s.policy == name]
        fig = result.stats[name].figures(0.02)
        assert sum(fig["pct_steps_by_arm"].values()) == pytest.approx(100.0)
        assert fig["cache_drafts"] == sum(1 for s in mine if s.cache_drafted) > 0
        assert all(0 <= s.cache_accepted <= s.cache_drafted for s in mine)
        assert all(s.arm == ("cache" if s.drafted else "none") for s in mine), name  # no model drafter in a replay
        high = sum(1 for s in mine if s.cache_accepted >= 4)
        assert fig["pct_high_payoff"] == pytest.approx(100 * high / fig["cache_drafts"])
        predicts = name in ("hvd", "hvd-paper")
        assert (fig["precision"] is not None) == predicts
        assert all((s.predicted is not None) == (predicts and s.cache_drafted > 0) for s in mine)
    # the suffix policy verifies its whole proposal: the probe is the draft itself
    suffix = [s for s in steps if s.policy == "suffix"]
    assert all(s.cache_drafted == s.drafted and s.cache_accepted == s.accepted for s in suffix)
    # hvd-paper verifies exactly the proposals predicted above the threshold, whole
    paper = [s for s in steps if s.policy == "hvd-paper" and s.cache_drafted]
    assert all((s.drafted == s.cache_drafted) == (s.predicted > 4) for s in paper)
    text = format_table(result, 0.02)
    assert "the paper's measures" in text and "cyc/1K" in text and "hvd-paper" in text


def test_token_classes_flag_punctuation_and_brackets(tok) -> None:
    classes = TokenClasses.from_tokenizer(tok)
    comma, brace, letter = (tok.convert_tokens_to_ids(t) for t in (",", "{", "a"))
    assert classes.flags(comma, brace) == (1.0, 0.0, 1.0, 1.0)
    assert classes.flags(letter, None) == (0.0, 0.0, 0.0, 0.0)
    assert TokenClasses.from_tokenizer(object()) == TokenClasses()


def test_mlp_learns_a_length_from_its_features_and_round_trips(tmp_path) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(scale=0.1, size=(2000, len(PAPER_FEATURES)))  # the other inputs: small noise
    x[:, 1] = np.sign(x[:, 1]) * (0.5 + 10 * np.abs(x[:, 1]))  # a clear gap between long and short matches
    y = np.where(x[:, 1] > 0, 10.0, 1.0)  # long matches keep 10 tokens, short ones 1
    mlp = fit_mlp(x, y, epochs=15, batch=32, hidden=32)
    quality = ThresholdQuality.of(mlp.predict(x), y, 6.0)
    assert quality.precision > 0.95 and quality.recall > 0.95
    mlp.save(tmp_path / "m.json")
    loaded = PaperMLP.load(tmp_path / "m.json")
    assert np.allclose(loaded.predict(x[:50]), mlp.predict(x[:50]), atol=0.1)  # float16 storage
    (tmp_path / "bad.json").write_text('{"features": ["x"]}')
    with pytest.raises(PaperWeightsError, match="not paper-predictor weights"):
        PaperMLP.load(tmp_path / "bad.json")
    with pytest.raises(PaperWeightsError, match="cannot read"):
        PaperMLP.load(tmp_path / "missing.json")


def test_packaged_paper_weights_load_and_rank_a_long_match_first() -> None:
    from hvd_agents.policy.features import CacheDraftFeatures, HistoryFeatures
    from hvd_agents.policy.paper import PaperFeatures

    mlp = PaperMLP.default()
    assert mlp.meta["train_drafts"] > 0
    long = PaperFeatures.of(CacheDraftFeatures(match_len=40, out_pos=30,
                                               history=HistoryFeatures(5, 1.0, True, 0.9)), 40, 16)
    short = PaperFeatures.of(CacheDraftFeatures(match_len=1, out_pos=3), 1, 16)
    assert mlp.predict_one(long) > 6.0 > mlp.predict_one(short)


def test_train_payoff_paper_on_replayed_steps(tmp_path, capsys) -> None:
    tokenizer = tmp_path / "tok"
    make_byte_tokenizer().save_pretrained(tokenizer)
    trace = write_jsonl(tmp_path / "agent.jsonl", conversations() * 4)
    steps, weights = tmp_path / "steps.jsonl", tmp_path / "paper.json"
    assert main(["analyze", str(trace), "--policy", "suffix,hvd", "--k", "16", "--tokenizer", str(tokenizer),
                 "--steps", str(steps), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train-payoff", "--paper", str(steps), "-o", str(weights), "--held-out", "0.3",
                 "--epochs", "2"]) == 0
    printed = capsys.readouterr().out
    assert "paper MLP" in printed and "hvd hazard" in printed
    loaded = PaperMLP.load(weights)
    assert loaded.meta["train_drafts"] > 0 and loaded.meta["left_out_records"] > 0  # hvd's cut drafts left out
    assert main(["analyze", str(trace), "--policy", "hvd-paper", "--tokenizer", str(tokenizer), "--quiet",
                 "--paper-weights", str(weights), "--verify-cost", "0.02"]) == 0
    assert "hvd-paper" in capsys.readouterr().out
