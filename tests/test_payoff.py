"""The payoff predictor: features, survival, weights files, online adaptation, offline training."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from hvd_agents.cli import main
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.features import (
    FEATURE_NAMES,
    NUM_FEATURES,
    CacheDraftFeatures,
    ChosenDraftFeatures,
    FeatureRecordError,
    HistoryFeatures,
    TargetSignal,
    feature_matrix,
    feature_record,
)
from hvd_agents.policy.payoff import PayoffPredictor, PayoffWeights, PayoffWeightsError, median_accepted
from hvd_agents.policy.token_text import CLASS_NAMES, TEXT_COLUMNS
from hvd_agents.policy.train import (
    DraftSample,
    FitSettings,
    evaluate,
    fit,
    fit_payoff,
    fit_text,
    read_samples,
    row_weights,
    spearman,
    split,
)
from hvd_agents.structure import SpanKind


def weights_with(**named: float) -> PayoffWeights:
    w = np.zeros(NUM_FEATURES)
    for name, value in named.items():
        w[FEATURE_NAMES.index(name)] = value
    return PayoffWeights(w)


def test_feature_rows_worked_example() -> None:
    features = CacheDraftFeatures(match_len=3, kind=SpanKind.TOOL_SCHEMA, probs=[1.0, 0.5], support=[1, 1])
    rows = feature_matrix(features, 2)
    col = {name: rows[:, i] for i, name in enumerate(FEATURE_NAMES)}
    assert rows.shape == (2, NUM_FEATURES)
    assert col["log_pos"].tolist() == pytest.approx([0.0, math.log(2)])
    assert col["prob"].tolist() == [1.0, 0.5]
    assert col["log_path"].tolist() == pytest.approx([0.0, math.log(0.5)])
    assert col["beyond_match"].tolist() == [0.0, 0.0]  # both positions lie within the match length
    assert col["kind=tool_schema"].tolist() == [1.0, 1.0] and col["kind=tool_output"].tolist() == [0.0, 0.0]
    assert col["bias"].tolist() == [1.0, 1.0] and col["no_history"].tolist() == [1.0, 1.0]
    far = feature_matrix(CacheDraftFeatures(match_len=1), 8)
    assert far[7, FEATURE_NAMES.index("beyond_match")] == pytest.approx(math.log(8) - math.log(2))


def test_records_keep_the_step_record_names_and_read_back() -> None:
    features = CacheDraftFeatures(
        match_len=2, candidates=3, distance=4.0, kind=SpanKind.TOOL_SCHEMA, out_pos=5, kind_rate=0.25,
        history=HistoryFeatures(drafts=1, last_frac=0.5, last_full=False, ema_frac=0.75),
        probs=[2 / 3, 1.0], support=[2, 2],
    )
    record = features.to_record()
    assert list(record) == [
        "match_len", "num_candidates", "branch_prob", "path_prob", "draft_len", "distance", "from_store",
        "kind=tool_schema", "pos", "covers_output", "kind_rate", "hist_drafts", "last_frac", "last_full", "ema_frac",
        "prob_0", "prob_1", "support_0", "support_1",
    ]
    assert record["branch_prob"] == record["path_prob"] == 2 / 3 and record["draft_len"] == 2.0
    assert CacheDraftFeatures.from_record(json.loads(json.dumps(record))) == features
    # a record that leaves positions out reads with today's defaults: probability 1, support = candidates
    assert np.array_equal(feature_matrix(CacheDraftFeatures.from_record(record), 4), feature_matrix(features, 4))
    short = CacheDraftFeatures.from_record({"num_candidates": 3, "prob_1": 0.5})
    assert short.probs.tolist() == [1.0, 0.5] and short.support.tolist() == [3.0, 3.0]
    assert len(short.share) == 0 and len(short.seen) == 0  # not counted: share 1, seen 0 in the rows
    counted = replace(features, share=[0.25, 1.0], seen=[8, 2])
    counted_record = counted.to_record()
    assert list(counted_record)[-4:] == ["share_0", "share_1", "seen_0", "seen_1"]
    assert CacheDraftFeatures.from_record(counted_record) == counted

    seen = features.with_target(TargetSignal(logp=-0.5, entropy=1.25))
    chosen = ChosenDraftFeatures(seen, full_len=4, pred_accepted=1.5, rate=2.0)
    names = list(feature_record(chosen))
    assert names[:len(record)] == list(record)
    assert names[len(record):] == ["has_target", "target_logp", "target_entropy", "full_len", "pred_accepted", "rate"]
    assert CacheDraftFeatures.from_record(feature_record(chosen)) == seen  # the policy's judgement is no feature
    assert CacheDraftFeatures.from_record({"ngram": 2.0}) == CacheDraftFeatures()  # another drafter's record
    assert feature_record({"model_survival": 0.5}) == {"model_survival": 0.5}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"match_length": 3.0}, r"unknown feature name in a step record: 'match_length' \(did you mean 'match_len'\?\)"),
        ({"kind=tool_schemas": 1.0}, r"'kind=tool_schemas' \(did you mean 'kind=tool_schema'\?\)"),
        ({"prob_01": 0.5, "suport_0": 2.0}, r"unknown feature names in a step record: 'prob_01'.*'suport_0'"),
        ({"from_store": 0.5}, "from_store must be 0 or 1"),
        ({"match_len": "3"}, "match_len must be a finite number"),
        ({"match_len": 2.5}, "match_len must be a whole number"),
        ({"prob_0": 1.5}, r"prob_0 must be in \[0, 1\]"),
        ({"kind=user": 1.0, "kind=system": 1.0}, "one provenance kind"),
        ({"target_logp": -1.0}, "without has_target"),
    ],
)
def test_an_unknown_or_misspelt_feature_in_a_record_is_an_error(record, message) -> None:
    with pytest.raises(FeatureRecordError, match=message):
        CacheDraftFeatures.from_record(record)


def test_read_samples_names_the_line_of_a_misspelt_feature(tmp_path) -> None:
    path = tmp_path / "steps.jsonl"
    good = {"policy": "suffix", "conversation": "c", "drafted": 4, "accepted": 2, "features": {"match_len": 3}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "features": {"match_lenn": 3}}) + "\n")
    with pytest.raises(Exception, match=r"steps.jsonl:2: unknown feature name in a step record: 'match_lenn'"):
        read_samples([path])


def test_context_share_columns_and_their_defaults() -> None:
    counted = feature_matrix(CacheDraftFeatures(match_len=9, probs=[1.0, 1.0], support=[1, 1],
                                                share=[0.25, 1.0], seen=[7, 0]), 3)
    col = {name: counted[:, i] for i, name in enumerate(FEATURE_NAMES)}
    assert col["share"].tolist() == [0.25, 1.0, 1.0]  # past the counted positions: share 1, seen 0
    assert col["log_seen"].tolist() == pytest.approx([math.log(8), 0.0, 0.0])
    assert col["split"].tolist() == pytest.approx([0.75 * math.log(8), 0.0, 0.0])
    with pytest.raises(ValueError, match="share and seen"):
        CacheDraftFeatures(probs=[1.0, 1.0], support=[1, 1], share=[0.5], seen=[2])
    with pytest.raises(FeatureRecordError, match=r"share_0 must be in \[0, 1\]"):
        CacheDraftFeatures.from_record({"share_0": 2.0})


def test_weights_written_before_the_share_features_read_them_as_zero(tmp_path) -> None:
    w = weights_with(bias=-1.5, prob=3.0)
    path = tmp_path / "old.json"
    PayoffWeights(w.weights).save(path)
    document = json.loads(path.read_text())
    for name in ("share", "log_seen", "split"):
        del document["weights"][name]
    path.write_text(json.dumps(document))
    loaded = PayoffWeights.load(path)
    assert np.array_equal(loaded.weights, w.weights)
    features = CacheDraftFeatures(match_len=4, probs=[1.0] * 3, support=[1] * 3, share=[0.1] * 3, seen=[50] * 3)
    plain = CacheDraftFeatures(match_len=4, probs=[1.0] * 3, support=[1] * 3)
    old = PayoffPredictor(loaded)
    assert np.array_equal(old.survival(features, 3), old.survival(plain, 3))  # the model it was fitted as


def test_survival_is_the_cumulative_product_of_hazards() -> None:
    # bias 0 -> h = 0.5 where prob = 1; the prob weight lowers h where the branch is uncertain
    predictor = PayoffPredictor(weights_with(prob=2.0, bias=-2.0), learning_rate=0.0)
    s = predictor.survival(CacheDraftFeatures(probs=[1.0, 1.0, 0.0], support=[1, 1, 1]), 3)
    assert s.tolist() == pytest.approx([0.5, 0.25, 0.25 / (1 + math.exp(2.0))])
    assert predictor.expected_accepted(CacheDraftFeatures(), 2) == pytest.approx(0.75)
    assert predictor.survival(CacheDraftFeatures(), 0).shape == (0,)


def test_the_median_accepted_length_is_above_n_exactly_where_n_tokens_have_an_even_chance() -> None:
    """The point prediction the paper's measures read: where the survival curve crosses 1/2 (1 at no tokens, 0
    past the draft), linear between lengths; above ``n`` iff ``S`` at ``n`` tokens is above 1/2, which the
    expected length (the sum) is not: a long tail lifts the sum past 6 when 6 tokens are unlikely."""
    assert median_accepted([0.9, 0.6, 0.3]) == pytest.approx(2 + 0.1 / 0.3)
    assert median_accepted([]) == pytest.approx(0.5)  # nothing drafted: the curve falls from 1 to 0 at one token
    assert median_accepted([0.4]) == pytest.approx(0.5 / 0.6)
    assert median_accepted([0.8] * 3) == pytest.approx(3 + 0.3 / 0.8)  # never below 1/2: past the last token
    rng = np.random.default_rng(0)
    for _ in range(500):
        survival = np.cumprod(rng.uniform(0.3, 1.0, size=rng.integers(1, 20)))
        median = median_accepted(survival)
        for n in range(len(survival) + 1):
            assert (median > n) == (survival[n - 1] > 0.5 if n else True)
    tail = np.cumprod([0.7] + [0.6] + [0.99] * 30)  # S_6 = 0.42 * 0.99^4: under 1/2, yet the sum is ~11
    assert tail.sum() > 6 and median_accepted(tail) < 6


def test_packaged_weights_rank_a_long_schema_match_above_a_one_token_guess() -> None:
    predictor = PayoffPredictor()
    strong = CacheDraftFeatures.from_record(
        {"match_len": 24.0, "num_candidates": 1.0, "kind=assistant_tool_call": 1.0, "hist_drafts": 3.0,
         "last_frac": 1.0, "last_full": 1.0, "ema_frac": 0.9, "kind_rate": 0.9})
    # 2 of its 20 candidates go on with the drafted token (a record without support_0 would claim all 20 do)
    weak = CacheDraftFeatures.from_record(
        {"match_len": 1.0, "num_candidates": 20.0, "prob_0": 0.1, "support_0": 2.0, "kind=template": 1.0,
         "hist_drafts": 3.0, "last_frac": 0.0, "ema_frac": 0.1, "kind_rate": 0.1})
    assert predictor.expected_accepted(strong, 16) > 4 * predictor.expected_accepted(weak, 16)
    assert np.all(np.diff(predictor.survival(strong, 16)) <= 0)


def test_weights_round_trip_and_bad_files(tmp_path) -> None:
    w = weights_with(bias=-1.5, prob=3.0)
    path = tmp_path / "w.json"
    PayoffWeights(w.weights, {"note": "x"}).save(path)
    loaded = PayoffWeights.load(path)
    assert np.array_equal(loaded.weights, w.weights) and loaded.meta == {"note": "x"}

    with pytest.raises(PayoffWeightsError, match="cannot read payoff weights"):
        PayoffWeights.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PayoffWeightsError, match="cannot read payoff weights"):
        PayoffWeights.load(tmp_path / "bad.json")
    document = json.loads(path.read_text())
    del document["weights"]["prob"]
    document["weights"]["warp"] = 1.0
    (tmp_path / "other.json").write_text(json.dumps(document))
    with pytest.raises(PayoffWeightsError, match=r"missing \['prob'\], extra \['warp'\]"):
        PayoffWeights.load(tmp_path / "other.json")
    document = json.loads(path.read_text())
    document["weights"]["bias"] = "high"
    (tmp_path / "nan.json").write_text(json.dumps(document))
    with pytest.raises(PayoffWeightsError, match="not a number"):
        PayoffWeights.load(tmp_path / "nan.json")
    with pytest.raises(PayoffWeightsError, match="expected an object"):
        PayoffWeights.from_document([1, 2])


def test_online_update_learns_a_session_and_leaves_others_alone() -> None:
    predictor = PayoffPredictor(weights_with(bias=0.0), learning_rate=0.5)
    features = CacheDraftFeatures(match_len=4)
    before = predictor.expected_accepted(features, 8, "s1")
    for _ in range(20):  # this session's drafts are always accepted whole
        predictor.update(features, drafted=8, accepted=8, session_id="s1")
    for _ in range(20):  # this one's are always rejected at the first token
        predictor.update(features, drafted=8, accepted=0, session_id="s2")
    assert predictor.expected_accepted(features, 8, "s1") > before + 2
    assert predictor.expected_accepted(features, 8, "s2") < before / 2
    assert predictor.expected_accepted(features, 8, "s3") == pytest.approx(before)  # untouched
    predictor.forget("s1")
    assert predictor.expected_accepted(features, 8, "s1") == pytest.approx(before)


def test_the_online_step_from_the_hazards_predicted_before_verification_is_the_same_step() -> None:
    # the drafter hands the online step the hazards it predicted (for the whole proposal); the step is the one the
    # predictor takes when it computes them again for the labelled positions
    features = CacheDraftFeatures(match_len=4, probs=[1.0, 0.8, 0.6, 0.5], support=[3, 2, 2, 1])
    given, again = (PayoffPredictor(weights_with(bias=0.5, prob=1.0), learning_rate=0.5) for _ in range(2))
    for drafted, accepted in [(4, 1), (3, 3), (4, 0), (2, 2)]:
        given.update(features, drafted, accepted, "s", given.hazards(features, 4, "s"))
        again.update(features, drafted, accepted, "s")
        assert given.survival(features, 4, "s") == pytest.approx(again.survival(features, 4, "s"), abs=1e-12)
    assert given.survival(features, 4, "s") != pytest.approx(given.survival(features, 4, "other"))
    # hazards for fewer positions than the outcome labels are computed again
    short, fresh = (PayoffPredictor(weights_with(bias=0.5, prob=1.0), learning_rate=0.5) for _ in range(2))
    short.update(features, 4, 3, "s", short.hazards(features, 1, "s"))
    fresh.update(features, 4, 3, "s")
    assert short.survival(features, 4, "s") == pytest.approx(fresh.survival(features, 4, "s"), abs=1e-12)
    assert short.survival(features, 4, "s") != pytest.approx(short.survival(features, 4, "other"))


def synthetic_samples(true_w: np.ndarray, n: int, seed: int) -> list[DraftSample]:
    """Drafts whose accepted lengths follow the hazard model with weights ``true_w``."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        features = CacheDraftFeatures.from_record(
            {"match_len": float(rng.integers(1, 30)), "prob_0": float(rng.uniform(0.2, 1.0)),
             "kind=tool_output" if i % 2 else "kind=assistant_tool_call": 1.0})
        drafted = int(rng.integers(1, 17))
        hazard = 1 / (1 + np.exp(-(feature_matrix(features, drafted) @ true_w)))
        accepted = 0
        while accepted < drafted and rng.random() < hazard[accepted]:
            accepted += 1
        samples.append(DraftSample(features, drafted, accepted, f"c{i % 50}"))
    return samples


def test_fit_recovers_a_known_hazard_model() -> None:
    true = weights_with(bias=-1.0, log_match=1.2, prob=1.5, log_pos=-0.5, **{"kind=tool_output": -1.0}).weights
    train = synthetic_samples(true, 3000, seed=1)
    test = synthetic_samples(true, 600, seed=2)
    fitted = PayoffPredictor(PayoffWeights(fit(train, l2=0.1)), learning_rate=0.0)
    truth = PayoffPredictor(PayoffWeights(true), learning_rate=0.0)
    predicted = [fitted.expected_accepted(s.features, s.drafted) for s in test]
    exact = [truth.expected_accepted(s.features, s.drafted) for s in test]
    assert np.max(np.abs(np.array(predicted) - np.array(exact))) < 0.5
    evaluation = evaluate(fitted, test, train)
    assert evaluation.mae < evaluation.baseline_mae  # the features carry signal the rates miss
    assert evaluation.spearman > evaluation.baseline_spearman


def test_spearman_and_split() -> None:
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([4.0, 3, 2, 1])) == pytest.approx(-1.0)
    assert spearman(np.array([1.0, 1, 2]), np.array([5.0, 5, 9])) == pytest.approx(1.0)  # ties share a rank
    assert math.isnan(spearman(np.array([1.0, 1]), np.array([1.0, 2])))
    samples = [DraftSample(CacheDraftFeatures(), 4, 1, f"conv{i}") for i in range(200)]
    train, test = split(samples, 0.25)
    assert 20 < len(test) < 80 and len(train) + len(test) == 200
    assert {s.group for s in train}.isdisjoint({s.group for s in test})
    assert split(samples, 0.25)[1] == test  # stable


def test_read_samples_names_a_bad_line(tmp_path) -> None:
    path = tmp_path / "steps.jsonl"
    good = {"policy": "suffix", "conversation": "c", "drafted": 4, "accepted": 2, "features": {"match_len": 3}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "drafted": 0}) + "\n\n" + "[1, 2]\n")
    with pytest.raises(Exception, match=r"steps.jsonl:4: not a step record"):
        read_samples([path])
    path.write_text(json.dumps({**good, "accepted": 9}) + "\n")
    with pytest.raises(Exception, match=r"steps.jsonl:1: accepted=9 outside"):
        read_samples([path])
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "drafted": 0}) + "\n")
    assert [s.accepted for s in read_samples([path])] == [2]  # undrafted steps carry no label


def test_train_payoff_command_on_replayed_steps(tmp_path, capsys) -> None:
    from tests.helpers import make_byte_tokenizer
    from tests.trace_data import conversations, write_jsonl

    tokenizer = tmp_path / "tok"
    make_byte_tokenizer().save_pretrained(tokenizer)
    trace = write_jsonl(tmp_path / "agent.jsonl", conversations() * 4)
    steps, weights = tmp_path / "steps.jsonl", tmp_path / "w.json"
    assert main(["analyze", str(trace), "--policy", "suffix", "--k", "16", "--tokenizer", str(tokenizer),
                 "--steps", str(steps), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train-payoff", str(steps), "-o", str(weights), "--held-out", "0.3", "--epochs", "2"]) == 0
    printed = capsys.readouterr().out
    # the replay knew the tokenizer, so its records carry the drafts' text and the hazard network is fitted too
    assert "payoff (network, text)" in printed and "payoff (logistic)" in printed and "per-position rates" in printed
    loaded = PayoffWeights.load(weights)
    assert loaded.mlp is not None and loaded.meta["network"] == {"hidden": 64, "epochs": 2, "seed": 0}
    assert loaded.meta["train_drafts"] > 0 and loaded.meta["sources"] == ["steps.jsonl"]
    assert set(loaded.meta["held_out"]) >= {"mae", "spearman", "baseline_mae"}
    assert set(loaded.meta["held_out_logistic"]) >= {"mae", "spearman"}
    assert main(["train-payoff", str(steps), "-o", str(weights), "--hidden", "0"]) == 0
    assert "hazard network: none: --hidden 0" in capsys.readouterr().out
    assert PayoffWeights.load(weights).mlp is None
    assert main(["train-payoff", str(tmp_path / "none.jsonl"), "-o", str(weights)]) == 2
    assert "cannot read step records" in capsys.readouterr().err


def test_dropped_inputs_get_no_weight_in_either_model() -> None:
    from hvd_agents.policy.hazard_mlp import MLP_INPUTS
    from hvd_agents.policy.train import FitSettings, fit_network, fit_payoff

    true_w = weights_with(bias=1.0, log_match=0.5, prob=2.0).weights
    samples = synthetic_samples(true_w, 300, seed=3)
    kinds = [i for i, name in enumerate(FEATURE_NAMES) if name.startswith("kind=")]
    assert np.any(fit(samples, drop=())[kinds] != 0)
    w = fit(samples, drop=("kind=*", "log_match"))
    assert np.all(w[kinds] == 0) and w[FEATURE_NAMES.index("log_match")] == 0
    assert w[FEATURE_NAMES.index("prob")] > 0.5  # the rest is still fitted
    texted = [DraftSample(CacheDraftFeatures(match_len=s.features.match_len, kind=s.features.kind,
                                             probs=s.features.probs, support=s.features.support,
                                             text=np.full(3 + len(s.features.probs), 5)), s.drafted, s.accepted,
                          s.group) for s in samples[:60]]
    mlp = fit_network(texted, hidden=4, epochs=1, drop=("kind=*", "text-3:*"))
    dropped = [i for i, name in enumerate(MLP_INPUTS) if name.startswith(("kind=", "text-3:"))]
    assert np.all(mlp.w1[dropped] == 0)
    weights, _ = fit_payoff(samples, FitSettings(hidden=0, drop=("kind=*",), online_rate=0.2, online=("bias",)))
    assert weights.meta["settings"]["drop"] == ["kind=*"]
    assert weights.meta["online"] == {"learning_rate": 0.2, "moves": ["bias"], "shared_rate": 0.0,
                                      "weighting": "draft", "next_label": False}
    weights, _ = fit_payoff(samples, FitSettings(hidden=0, online_weighting="position", online_next_label=True))
    assert weights.online.weighting == "position" and weights.online.next_label
    with pytest.raises(InvalidRequestError, match="online_weighting"):
        FitSettings(online_weighting="token")
    with pytest.raises(InvalidRequestError, match="names no input"):
        FitSettings(drop=("kind=nonsense",))
    with pytest.raises(InvalidRequestError, match="names no input"):
        FitSettings(online=("prob",))  # a position feature: the online step moves draft-level weights only


def test_the_online_step_is_the_one_the_weights_file_ships() -> None:
    features = CacheDraftFeatures(match_len=4, kind=SpanKind.TOOL_OUTPUT)
    meta = {"online": {"learning_rate": 0.5, "moves": ["bias"]}}
    shipped = PayoffPredictor(PayoffWeights(weights_with(bias=0.0).weights, meta))
    assert shipped.learning_rate == 0.5 and PayoffPredictor(weights_with(bias=0.0)).learning_rate == 0.05
    assert PayoffPredictor(PayoffWeights(weights_with().weights, meta), learning_rate=0.0).learning_rate == 0.0
    default = PayoffPredictor(weights_with(bias=0.0), learning_rate=0.5)
    for predictor in (shipped, default):
        for _ in range(5):
            predictor.update(features, drafted=8, accepted=8, session_id="s")
    # both moved the intercept; only the default moved the draft's kind's too, so only there does a draft of
    # another kind gain less than one of the kind the session saw
    other = CacheDraftFeatures(match_len=4, kind=SpanKind.TOOL_SCHEMA)
    for predictor, kind_moved in ((shipped, False), (default, True)):
        gain = predictor.expected_accepted(features, 4, "s") - predictor.expected_accepted(features, 4, None)
        other_gain = predictor.expected_accepted(other, 4, "s") - predictor.expected_accepted(other, 4, None)
        assert other_gain > 0 and (gain > other_gain + 1e-3 if kind_moved else gain == pytest.approx(other_gain))
    frozen = PayoffPredictor(PayoffWeights(weights_with().weights, {"online": {"learning_rate": 0.0}}))
    frozen.update(features, drafted=8, accepted=8, session_id="s")
    assert frozen.expected_accepted(features, 8, "s") == frozen.expected_accepted(features, 8, None)
    with pytest.raises(PayoffWeightsError, match="names no draft-level feature"):
        PayoffPredictor(PayoffWeights(weights_with().weights, {"online": {"moves": ["prob"]}}))


def test_a_shared_online_offset_moves_every_sessions_predictions() -> None:
    features = CacheDraftFeatures(match_len=4, kind=SpanKind.TOOL_OUTPUT)
    shared = PayoffPredictor(PayoffWeights(weights_with().weights, {"online": {"learning_rate": 0.0,
                                                                              "shared_rate": 0.5}}))
    alone = PayoffPredictor(PayoffWeights(weights_with().weights, {"online": {"learning_rate": 0.5}}))
    before = shared.expected_accepted(features, 8, "new")
    for predictor in (shared, alone):
        for _ in range(10):
            predictor.update(features, drafted=8, accepted=0, session_id="seen")
    assert shared.expected_accepted(features, 8, "new") < before / 2  # a session that saw nothing moved too
    assert alone.expected_accepted(features, 8, "new") == pytest.approx(before)
    assert alone.expected_accepted(features, 8, "seen") < before / 2
    explicit = PayoffPredictor(shared.weights, learning_rate=0.0)  # an explicit rate: no online step at all
    explicit.update(features, drafted=8, accepted=0, session_id="seen")
    assert explicit.expected_accepted(features, 8, "x") == pytest.approx(before)


def _intercept_shift(online: dict, drafted: int, accepted: int, next_accepted: bool | None = None) -> float:
    """How far one online step moves the logit of a logistic predictor whose step moves only the intercept."""
    features = CacheDraftFeatures(match_len=4, kind=SpanKind.TOOL_OUTPUT)
    predictor = PayoffPredictor(PayoffWeights(weights_with(bias=0.5).weights, {"online": online}), l2=0.0)
    logit = lambda: float(np.log(predictor.hazards(features, 1, "s")[0] / (1 - predictor.hazards(features, 1, "s")[0])))
    before = logit()
    predictor.update(features, drafted=drafted, accepted=accepted, session_id="s", next_accepted=next_accepted)
    return logit() - before


def test_the_online_step_weighs_each_draft_or_each_position() -> None:
    h = 1 / (1 + math.exp(-0.5))  # every position's hazard before the step
    draft = {"learning_rate": 0.1, "moves": ["bias"]}
    position = draft | {"weighting": "position"}
    # 8 accepted: the mean residual (1 - h) per draft, 8 times it per position
    assert _intercept_shift(draft, 8, 8) == pytest.approx(0.1 * (1 - h))
    assert _intercept_shift(position, 8, 8) == pytest.approx(0.8 * (1 - h))
    # a first-token failure: one labelled position, the same either way
    assert _intercept_shift(draft, 8, 0) == pytest.approx(_intercept_shift(position, 8, 0)) == pytest.approx(-0.1 * h)
    # so under "position" one 8-token copy outweighs one failure, under "draft" it does not
    assert _intercept_shift(position, 8, 8) + _intercept_shift(position, 8, 0) > 0
    assert _intercept_shift(draft, 8, 8) + _intercept_shift(draft, 8, 0) < 0
    with pytest.raises(PayoffWeightsError, match="weighting"):
        PayoffPredictor(PayoffWeights(weights_with().weights, {"online": {"weighting": "token"}}))


def test_the_next_label_tells_the_step_about_the_position_a_cut_left_unverified() -> None:
    h = 1 / (1 + math.exp(-0.5))
    step = {"learning_rate": 0.1, "moves": ["bias"], "weighting": "position"}
    labelled = step | {"next_label": True}
    # a cut draft of 4 accepted whole: the proposal's 5th token was the target's next one, or was not
    assert _intercept_shift(labelled, 4, 4, True) == pytest.approx(0.1 * 5 * (1 - h))
    assert _intercept_shift(labelled, 4, 4, False) == pytest.approx(0.1 * (4 * (1 - h) - h))
    assert _intercept_shift(labelled, 4, 4, False) < _intercept_shift(step, 4, 4, False) == _intercept_shift(step, 4, 4)
    # a draft rejected inside the cut already labels its first rejection: the next token says nothing more
    assert _intercept_shift(labelled, 4, 2, True) == pytest.approx(_intercept_shift(step, 4, 2))
    assert PayoffWeights(weights_with().weights).online.next_label is False  # a file without it


def test_balance_by_conversation_weighs_each_conversation_alike() -> None:
    # one long conversation whose drafts hold, ten short ones whose drafts fail: unweighted, the long one decides
    # the rate; balanced, each of the eleven conversations counts once
    long = [DraftSample(CacheDraftFeatures(), 1, 1, "long") for _ in range(90)]
    short = [DraftSample(CacheDraftFeatures(), 1, 0, f"short{i}") for i in range(10)]
    row = feature_matrix(CacheDraftFeatures(), 1)[0]
    rate = lambda w: 1.0 / (1.0 + math.exp(-float(row @ w)))
    assert rate(fit(long + short, l2=1e-6)) == pytest.approx(0.9, abs=1e-3)
    assert rate(fit(long + short, l2=1e-6, balance="conversation")) == pytest.approx(1 / 11, abs=1e-3)
    weights = row_weights(long + short, "conversation")
    assert weights.mean() == pytest.approx(1.0) and weights[:90].sum() == pytest.approx(weights[90:91].sum() * 1)
    assert np.array_equal(row_weights(long, "none"), np.ones(90))
    with pytest.raises(InvalidRequestError, match="hidden=0"):
        FitSettings(balance="conversation")
    with pytest.raises(InvalidRequestError, match="balance is one of"):
        FitSettings(hidden=0, balance="kind")
    assert FitSettings(hidden=0, balance="conversation").to_dict()["balance"] == "conversation"


def test_the_logistic_hazard_reads_the_text_where_it_is_fitted_on_it(tmp_path) -> None:
    # drafts of two tokens, the same features; the second token breaks off where it is a double quote
    quote = 1 << CLASS_NAMES.index("dquote")
    plain = CacheDraftFeatures(match_len=4, probs=[1.0, 1.0], support=[1, 1], text=[0, 0, 0, 0, 0])
    quoted = CacheDraftFeatures(match_len=4, probs=[1.0, 1.0], support=[1, 1], text=[0, 0, 0, 0, quote])
    samples = ([DraftSample(plain, 2, 2, f"p{i}") for i in range(40)]
               + [DraftSample(quoted, 2, 1, f"q{i}") for i in range(40)])
    weights, text_weights = fit_text(samples, l2=1.0, text_l2=0.1)
    assert text_weights[TEXT_COLUMNS.index("text+0:dquote")] < -2  # the quote, where it is the drafted token
    assert np.count_nonzero(text_weights) == 1  # no other column ever varied
    predictor = PayoffPredictor(PayoffWeights(weights, text_weights=text_weights), learning_rate=0.0)
    assert predictor.hazards(plain, 2)[1] > 0.9 and predictor.hazards(quoted, 2)[1] < 0.1
    unread = PayoffPredictor(PayoffWeights(weights), learning_rate=0.0)  # the same weights without the text
    assert unread.hazards(quoted, 2)[1] == pytest.approx(unread.hazards(plain, 2)[1])
    blind = replace(quoted, text=np.zeros(0, dtype=np.int64))  # a draft whose text is not known: the features alone
    assert predictor.hazards(blind, 2)[1] == pytest.approx(unread.hazards(plain, 2)[1])
    # dropped, the text columns get no weight; the fit through fit_payoff ships them in the file
    assert not np.any(fit_text(samples, text_l2=0.1, drop=("text*",))[1])
    fitted, _ = fit_payoff(samples, FitSettings(hidden=0, text_l2=0.1, held_out=0.0))
    assert fitted.text_weights is not None and fitted.meta["settings"]["text_l2"] == 0.1
    fitted.save(tmp_path / "w.json")
    loaded = PayoffWeights.load(tmp_path / "w.json")
    assert np.array_equal(loaded.text_weights, fitted.text_weights)
    assert PayoffWeights.load(tmp_path / "w.json").mlp is None
    document = json.loads((tmp_path / "w.json").read_text())
    del document["text_weights"]["text+0:dquote"]
    with pytest.raises(PayoffWeightsError, match="must name each of the 72 text columns"):
        PayoffWeights.from_document(document)
    with pytest.raises(InvalidRequestError, match="needs hidden=0"):
        FitSettings(text_l2=1.0)
    with pytest.raises(InvalidRequestError, match="carry no text classes"):
        fit_payoff([DraftSample(replace(plain, text=np.zeros(0, dtype=np.int64)), 2, 2, "x")],
                   FitSettings(hidden=0, text_l2=1.0, held_out=0.0))
