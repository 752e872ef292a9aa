"""The drafts' text classes and the hazard network that reads them (policy/token_text.py, policy/hazard_mlp.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from hvd_agents.drafters import CacheStore, DraftContext, DrafterResources, SuffixDrafter, create_drafter
from hvd_agents.policy.features import FEATURE_NAMES, CacheDraftFeatures, feature_matrix
from hvd_agents.policy.hazard_mlp import MLP_INPUTS, HazardMLP, HazardMLPError, fit_hazard_mlp
from hvd_agents.policy.payoff import PayoffPredictor, PayoffWeights, PayoffWeightsError
from hvd_agents.policy.token_text import (
    BEFORE,
    CLASS_NAMES,
    NUM_CLASSES,
    TEXT_COLUMNS,
    TokenText,
    decode_each,
    text_columns,
    token_classes,
)
from hvd_agents.structure import SpanKind

VOCAB = ['a', '": "', "\n", " Hello", "42", "_x", "'", "}}", "<|im_end|>", ""]


def _bits(mask: int) -> set[str]:
    return {name for i, name in enumerate(CLASS_NAMES) if mask >> i & 1}


def test_token_classes_read_the_text() -> None:
    assert _bits(token_classes('": "')) == {"punct", "dquote", "colon", "ends_quote", "starts_quote", "len2"}
    assert _bits(token_classes(" Hello")) == {"alpha", "lead_space", "upper", "len2", "len5"}
    assert _bits(token_classes("\n")) == {"blank", "newline"}
    assert _bits(token_classes("42")) == {"digit", "len2"}
    assert _bits(token_classes("}}")) == {"punct", "bracket", "len2"}
    assert _bits(token_classes("<|im_end|>", special=True)) >= {"special", "bracket", "underscore", "len5"}
    assert token_classes("") == 1 << CLASS_NAMES.index("blank")


def test_token_text_masks_and_around() -> None:
    text = TokenText.from_decoder(VOCAB.__getitem__, len(VOCAB), special=[8])
    assert text.vocab_size == len(VOCAB)
    masks = text.masks([1, 3, 99, -1])
    assert masks[0] == token_classes('": "') and masks[1] == token_classes(" Hello")
    assert masks[2:].tolist() == [0, 0]  # ids the table does not cover have no class
    assert "special" in _bits(int(text.masks([8])[0]))
    around = text.around([3], [1, 4])  # a context shorter than BEFORE is padded with no class
    assert around.tolist() == [0] * (BEFORE - 1) + text.masks([3, 1, 4]).tolist()
    assert text.around([5, 6, 7, 3], [1]).tolist() == text.masks([6, 7, 3, 1]).tolist()


def test_text_columns_describe_the_tokens_around_each_position() -> None:
    text = TokenText.from_decoder(VOCAB.__getitem__, len(VOCAB))
    context, draft = [5, 6, 1], [4, 7]
    masks = text.around(context, draft)
    columns = text_columns(masks, 3)  # one position past the draft: no class
    assert columns.shape == (3, len(TEXT_COLUMNS)) == (3, 4 * NUM_CLASSES)

    def block(row: int, offset: int) -> set[str]:
        start = TEXT_COLUMNS.index(f"text{offset:+d}:{CLASS_NAMES[0]}")
        return {CLASS_NAMES[i] for i in np.flatnonzero(columns[row, start : start + NUM_CLASSES])}

    assert block(0, -1) == _bits(token_classes('": "')) and block(0, -2) == _bits(token_classes("'"))
    assert block(0, -3) == _bits(token_classes("_x")) and block(0, 0) == _bits(token_classes("42"))
    assert block(1, -1) == _bits(token_classes("42")) and block(1, 0) == _bits(token_classes("}}"))
    assert block(2, -1) == _bits(token_classes("}}")) and block(2, 0) == set()


def test_from_tokenizer_builds_once_and_needs_a_decoder() -> None:
    from tests.helpers import make_byte_tokenizer

    tokenizer = make_byte_tokenizer()
    built = TokenText.from_tokenizer(tokenizer)
    assert built is not None and built.vocab_size == len(tokenizer)
    assert TokenText.from_tokenizer(tokenizer) is built
    assert TokenText.from_tokenizer(None) is None and TokenText.from_tokenizer(object()) is None


def test_batched_decode_gives_each_ids_own_text(real_engine) -> None:
    """The classes read through the fast tokenizer's batched decode are those of decoding each id alone."""
    from tests.helpers import make_byte_tokenizer

    for tokenizer in (real_engine.tokenizer, make_byte_tokenizer()):
        size = len(tokenizer)
        one_by_one = TokenText.from_decoder(lambda token, tokenizer=tokenizer: tokenizer.decode([token]), size,
                                            tokenizer.all_special_ids)
        built = TokenText.from_tokenizer(tokenizer)
        assert np.array_equal(built.masks(range(size)), one_by_one.masks(range(size)))
    assert decode_each(real_engine.tokenizer, 8) == [real_engine.tokenizer.decode([t]) for t in range(8)]

    class CleaningUp:  # a tokenizer whose decode cleans up spaces: its backend's text is not its decode's
        clean_up_tokenization_spaces = True
        backend_tokenizer = real_engine.tokenizer.backend_tokenizer

    assert decode_each(CleaningUp(), 8) is None and decode_each(object(), 8) is None


def test_features_record_round_trips_the_text() -> None:
    text = TokenText.from_decoder(VOCAB.__getitem__, len(VOCAB))
    features = CacheDraftFeatures(match_len=4, probs=[1.0, 0.5], support=[2, 1], kind=SpanKind.ASSISTANT_TOOL_CALL,
                                  text=text.around([5, 6, 1], [4, 7]))
    record = features.to_record()
    assert record["before_1"] == token_classes('": "') and record["text_1"] == token_classes("}}")
    assert CacheDraftFeatures.from_record(json.loads(json.dumps(record))) == features
    assert not len(CacheDraftFeatures.from_record(CacheDraftFeatures(probs=[1.0], support=[1]).to_record()).text)
    with pytest.raises(ValueError, match="text must be empty or 3 \\+ 2"):
        CacheDraftFeatures(probs=[1.0, 0.5], support=[1, 1], text=[1, 2, 3])
    with pytest.raises(ValueError, match="non-negative"):
        CacheDraftFeatures(probs=[1.0], support=[1], text=[0, 0, 0, -2])


def test_suffix_drafter_describes_its_drafts_text() -> None:
    text = TokenText.from_decoder(lambda t: chr(97 + t % 26) if t % 7 else '"', 64)
    calls = []

    def lazy() -> TokenText:
        calls.append(1)
        return text

    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    for given in (text, lazy):
        drafter = SuffixDrafter(None, text=given)
        drafter.start("r", prompt)
        draft = drafter.propose(DraftContext("r", prompt, len(prompt)), 4)
        assert draft.token_ids == (4, 5, 6, 7)
        assert draft.features.text.tolist() == text.around(prompt, draft.token_ids).tolist()
    assert calls == [1]
    plain = SuffixDrafter(None)
    plain.start("r", prompt)
    assert not len(plain.propose(DraftContext("r", prompt, len(prompt)), 4).features.text)


def test_the_engine_hvd_drafter_reads_the_tokenizers_text() -> None:
    from tests.helpers import make_byte_tokenizer

    tokenizer = make_byte_tokenizer()
    hvd = create_drafter("hvd", DrafterResources(CacheStore(1000), tokenizer=tokenizer))
    assert hvd.cache.text is TokenText.from_tokenizer(tokenizer)
    assert create_drafter("hvd", DrafterResources(CacheStore(1000))).cache.text is None


def _network(seed: int = 0, hidden: int = 5) -> HazardMLP:
    rng = np.random.default_rng(seed)
    d = len(MLP_INPUTS)
    return HazardMLP(rng.normal(size=d), rng.uniform(0.5, 2.0, d), rng.normal(size=(d, hidden)),
                     rng.normal(size=hidden), rng.normal(size=hidden), 0.3)


def test_network_logits_are_the_standardized_layers() -> None:
    net = _network()
    rows = np.random.default_rng(1).normal(size=(6, len(MLP_INPUTS)))
    expected = np.tanh(((rows - net.mu) / net.sd) @ net.w1 + net.b1) @ net.w2 + net.b2
    np.testing.assert_allclose(net.logits(rows), expected, rtol=1e-12, atol=1e-12)
    again = HazardMLP.from_document(json.loads(json.dumps(net.to_document())))
    assert np.array_equal(again.logits(rows), net.logits(rows)) and again.hidden == 5


def test_network_documents_are_checked() -> None:
    document = _network().to_document()
    with pytest.raises(HazardMLPError, match="inputs do not match"):
        HazardMLP.from_document({**document, "inputs": document["inputs"][:-1]})
    with pytest.raises(HazardMLPError, match="w1 must have shape"):
        HazardMLP.from_document({**document, "w1": document["w1"][:-1]})
    with pytest.raises(HazardMLPError, match="malformed"):
        HazardMLP.from_document({k: v for k, v in document.items() if k != "b2"})
    with pytest.raises(HazardMLPError, match="sd must be > 0"):
        HazardMLP.from_document({**document, "sd": [0.0] * len(MLP_INPUTS)})
    weights = {"weights": dict.fromkeys(FEATURE_NAMES, 0.0), "mlp": {**document, "b1": [1.0]}}
    with pytest.raises(PayoffWeightsError, match="b1|w1"):
        PayoffWeights.from_document(weights)


def test_fit_learns_a_text_signal_and_ignores_constant_inputs() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    rows = np.zeros((n, len(MLP_INPUTS)))
    rows[:, FEATURE_NAMES.index("bias")] = 1.0
    rows[:, FEATURE_NAMES.index("prob")] = rng.uniform(0.2, 1.0, n)
    quote = MLP_INPUTS.index("text-1:dquote")
    rows[:, quote] = rng.random(n) < 0.3
    # a copied token after a quote is rejected far more often, whatever else the row says
    labels = (rng.random(n) < np.where(rows[:, quote] == 1, 0.2, 0.95)).astype(float)
    net = fit_hazard_mlp(rows, labels, hidden=8, epochs=20, batch=128)
    p = 1.0 / (1.0 + np.exp(-net.logits(rows)))
    assert p[rows[:, quote] == 1].mean() < 0.35 and p[rows[:, quote] == 0].mean() > 0.85
    assert np.array_equal(fit_hazard_mlp(rows, labels, hidden=8, epochs=20, batch=128).w1, net.w1)  # deterministic by seed
    # the target's signal never varied in training: a run-time value does not move the logit
    live = rows[:5].copy()
    live[:, FEATURE_NAMES.index("has_target")] = 1.0
    live[:, FEATURE_NAMES.index("target_logp")] = -3.0
    assert np.array_equal(net.logits(live), net.logits(rows[:5]))
    with pytest.raises(ValueError, match="rows and"):
        fit_hazard_mlp(rows[:, :5], labels)


def test_predictor_uses_the_network_only_where_the_text_is_known(tmp_path) -> None:
    text = TokenText.from_decoder(VOCAB.__getitem__, len(VOCAB))
    linear = PayoffWeights.default().weights
    weights = PayoffWeights(linear, {"note": "test"}, _network(hidden=4))
    path = tmp_path / "w.json"
    weights.save(path)
    loaded = PayoffWeights.load(path)
    assert loaded.mlp is not None and np.array_equal(loaded.weights, linear)
    predictor, plain = PayoffPredictor(loaded), PayoffPredictor(PayoffWeights(linear))
    bare = CacheDraftFeatures(match_len=5, probs=[1.0, 0.8, 0.5], support=[3, 2, 1])
    described = replace(bare, text=text.around([1, 3], [4, 7, 2]))
    assert np.array_equal(predictor.survival(bare, 3), plain.survival(bare, 3))
    survival = predictor.survival(described, 3)
    rows = np.concatenate([feature_matrix(described, 3), text_columns(described.text, 3)], axis=1)
    np.testing.assert_allclose(survival, np.cumprod(1 / (1 + np.exp(-loaded.mlp.logits(rows)))), rtol=1e-12)
    assert np.all(np.diff(survival) <= 0)
    # the session's online offset moves the network's prediction too
    predictor.update(described, 3, 0, "s")
    assert predictor.survival(described, 3, "s")[0] < survival[0]


def test_the_packaged_predictor_ships_a_network_that_beats_its_logistic_weights() -> None:
    weights = PayoffWeights.default()
    assert weights.mlp is not None
    held_out, logistic = weights.meta["held_out"], weights.meta["held_out_logistic"]
    assert held_out["drafts"] == logistic["drafts"] > 1000
    assert held_out["mae"] < logistic["mae"] and held_out["spearman"] > logistic["spearman"]
