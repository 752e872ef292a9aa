"""The model drafters: the EAGLE-style draft head and a draft LM, on tiny random models (no download).

Losslessness (greedy equality under any head, sampling distribution with q-carrying
drafts), the hidden states the engine hands over, the head's KV bookkeeping
across steps and requests, training-time test == drafting, training that learns,
and the head file format.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.distill.data import answer_samples, generate_samples, teacher_forced_samples
from hvd_agents.distill.train import TrainConfig, evaluate, train_head, ttt_forward
from hvd_agents.draft_head import DraftHead, DraftHeadConfig, DraftHeadError, HeadCache, load_head, save_head
from hvd_agents.draft_head.model import init_weights, target_signature
from hvd_agents.draft_head.weights import shipped_head_for
from hvd_agents.drafters import (
    Draft,
    DraftContext,
    DraftHeadDrafter,
    DraftModelDrafter,
    HybridDrafter,
    ModelDrafter,
    SuffixDrafter,
)
from hvd_agents.drafters.model.loop import draft_loop
from hvd_agents.drafters.model.protocol import DEFAULT_INGEST_COST_PRIOR, DEFAULT_TOKEN_COST_PRIOR
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy import CostModel
from tests.test_engine_lossless import SMALL_VOCAB, assert_samples_follow, exact_two_token_distribution
from tests.tiny import make_tiny_llama

VOCAB = 64


def random_head(target, draft_vocab: int = 48, seed: int = 0) -> DraftHead:
    """An untrained head over a reduced vocabulary (every other id dropped past ``draft_vocab``)."""
    config = DraftHeadConfig(target.config.hidden_size, 4, 64, draft_vocab, VOCAB if target.config.vocab_size == VOCAB
                             else target.config.vocab_size, target=target_signature(target))
    head = init_weights(DraftHead(config), seed=seed)
    head.draft_vocab = torch.randperm(config.target_vocab_size, generator=torch.Generator().manual_seed(seed))[
        :draft_vocab].sort().values
    return head.to(torch.float64).attach(target)


def tiny_samples(model, n: int, seed: int, answer: int = 24):
    """Greedy answers of ``model`` to random prompts, teacher-forced (the head's distillation data)."""
    rng = random.Random(seed)
    engine = Engine(model, eos_token_ids=(), prefix_cache_bytes=0)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 12))] for _ in range(n)]
    sequences = [p + list(engine.generate(p, GenerationParams(max_new_tokens=answer, method="ar")).token_ids)
                 for p in prompts]
    samples = []
    for i in range(0, n, 32):
        samples += teacher_forced_samples(model, sequences[i : i + 32], [len(p) for p in prompts[i : i + 32]])
    return samples


@pytest.fixture(scope="module")
def target():
    return make_tiny_llama(VOCAB, seed=11)


@pytest.fixture(scope="module")
def trained(target):
    """A head trained on the tiny target's own greedy answers, with its report."""
    samples = tiny_samples(target, 240, seed=1)
    config = TrainConfig(draft_vocab=48, intermediate_size=64, num_heads=4, epochs=12, lr=3e-3, batch_tokens=2048)
    untrained_head, _ = train_head(target, samples, TrainConfig(**{**config.__dict__, "epochs": 1, "lr": 1e-9}),
                                   log=lambda _: None)
    head, report = train_head(target, samples, config, log=lambda _: None)
    return head, report, untrained_head, samples


def test_training_learns_the_targets_greedy_tokens(trained) -> None:
    _head, report, untrained, samples = trained
    to_draft = torch.full((VOCAB,), -1, dtype=torch.long)
    to_draft[untrained.draft_vocab] = torch.arange(len(untrained.draft_vocab))
    _, before = evaluate(untrained, samples[:24], TrainConfig(batch_tokens=2048), to_draft)
    assert report.accuracy[0] > before[0] + 0.25, (report.accuracy, before)
    assert report.accuracy[0] > 0.5
    assert report.expected_accepted > 0.5
    assert report.epochs[-1]["train_loss"] < report.epochs[0]["train_loss"]


def test_answer_samples_match_teacher_forcing_of_the_same_answers(target) -> None:
    """The data ``train-drafter`` makes: answers and hidden states from ``generate`` alone, for left-padded
    prompts of different lengths, equal the engine's greedy answers and a teacher-forced forward over them.
    An answer keeps the EOS it ends at; an answer cut at ``max_new_tokens`` loses its last token, whose
    hidden state ``generate`` never computes."""
    rng = random.Random(3)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(n)] for n in (4, 9, 6)]
    engine = Engine(target, eos_token_ids=(), prefix_cache_bytes=0)
    full = [list(engine.generate(p, GenerationParams(max_new_tokens=12, method="ar")).token_ids) for p in prompts]
    eos = {full[1][4]}
    expected = []
    for answer in full:
        cut = answer[:11]
        ends = [i for i, token in enumerate(cut) if token in eos]
        expected.append(cut[: ends[0] + 1] if ends else cut)
    assert len(expected[1]) <= 5 and any(len(a) == 11 for a in expected)  # both endings are exercised

    samples = answer_samples(target, prompts, eos, pad=0, max_new_tokens=12)
    forced = teacher_forced_samples(target, [p + a for p, a in zip(prompts, expected)], [len(p) for p in prompts])
    for prompt, answer, sample, reference in zip(prompts, expected, samples, forced):
        assert sample.tokens.tolist() == prompt + answer
        assert sample.answer_start == len(prompt)
        assert sample.greedy.tolist() == reference.greedy.tolist()
        torch.testing.assert_close(sample.hidden.float(), reference.hidden.float(), atol=2e-3, rtol=2e-3)


def test_interrupted_data_generation_resumes_with_the_same_samples(tiny_model, byte_tokenizer, tmp_path) -> None:
    """``train-drafter --data`` keeps each batch as it is made: a run stopped part way and started again
    gives exactly the samples of an uninterrupted run (greedy and sampled batches alike), and a batch
    directory made with other settings is refused by name."""
    prompts = [f"Tell me about topic {i}." for i in range(6)]
    eos = [byte_tokenizer.eos_token_id]
    settings = {"max_new_tokens": 6, "batch_size": 2, "sampled_fraction": 0.5, "temperature": 1.0, "seed": 3}
    whole = generate_samples(tiny_model, byte_tokenizer, prompts, eos, **settings)
    rng, kinds = random.Random(settings["seed"]), set()  # the draws generate_samples makes per batch
    for _ in range(3):
        kinds.add(rng.random() < settings["sampled_fraction"])
        rng.randrange(2**31)
    assert kinds == {True, False}  # both greedy and sampled batches are resumed

    def stop_after_two_batches(message: str) -> None:
        if message.startswith("generated 4/"):
            raise KeyboardInterrupt

    parts = tmp_path / "data.pt.parts"
    with pytest.raises(KeyboardInterrupt):
        generate_samples(tiny_model, byte_tokenizer, prompts, eos, progress=stop_after_two_batches, parts=parts,
                         **settings)
    assert len(list(parts.glob("batch-*.pt"))) == 2
    torch.manual_seed(123)  # resuming must not depend on the global RNG state
    resumed = generate_samples(tiny_model, byte_tokenizer, prompts, eos, parts=parts, **settings)
    assert len(resumed) == len(whole) == 6
    for a, b in zip(resumed, whole):
        assert a.tokens.tolist() == b.tokens.tolist() and a.answer_start == b.answer_start
        assert torch.equal(a.greedy, b.greedy) and torch.equal(a.hidden, b.hidden)
    with pytest.raises(ValueError, match="data.pt.parts holds batches made with other max_new_tokens"):
        generate_samples(tiny_model, byte_tokenizer, prompts, eos, parts=parts, **{**settings, "max_new_tokens": 7})


def test_training_time_test_equals_drafting(target) -> None:
    """Pass p of training at index t computes exactly the p-th drafting step from verified index t - p + 1."""
    head = random_head(target)
    tokens = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = target(input_ids=tokens, output_hidden_states=True).hidden_states[-1]  # [1, 20, d]
    length = 19
    passes = ttt_forward(head, hidden[:, :length], tokens[:, 1:], torch.ones(1, length, dtype=torch.bool), 3)
    for last in (0, 4, 9, 15):  # the last verified index
        cache = HeadCache()
        feature, _ = head.step(hidden[0, : last + 1], tokens[0, 1 : last + 2], list(range(last + 1)), cache)
        feature = feature[-1:]
        assert torch.allclose(feature[0], passes[0][0, last], atol=1e-9)
        for p in (2, 3):
            t = last + p - 1
            feature, _ = head.step(feature, tokens[0, t + 1 : t + 2], [t], cache)
            assert torch.allclose(feature[0], passes[p - 1][0, t], atol=1e-9), (last, p)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    max_new=st.integers(1, 40),
    k=st.integers(0, 10),
    method=st.sampled_from(["model", "hvd"]),
)
def test_greedy_equality_with_the_trained_head(target, trained, prompt, max_new, k, method) -> None:
    engine = Engine(target, eos_token_ids=(), draft_head=trained[0], prefix_cache_bytes=1 << 22)
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar", reuse_prefix=False))
    result = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method=method, num_draft_tokens=k))
    assert result.token_ids == reference.token_ids


def test_trained_head_drafts_are_accepted(target, trained) -> None:
    engine = Engine(target, eos_token_ids=(), draft_head=None)
    # the tiny head spreads its mass over 48 tokens: drafting on a low survival threshold lets it show its agreement
    engine.add_drafter("tiny-head", DraftHeadDrafter(trained[0], min_survival=0.1))
    prompt = [5, 9, 33, 2, 17, 40]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=60, method="ar"))
    result = engine.generate(prompt, GenerationParams(max_new_tokens=60, method="tiny-head", num_draft_tokens=4))
    assert result.token_ids == reference.token_ids
    head_stats = result.stats.per_source["head"]
    assert head_stats.accepted >= 0.4 * head_stats.drafted  # the tiny head agrees with its target often
    assert result.stats.steps < reference.stats.steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_equality_with_draft_lms(target, seed) -> None:
    prompt = [random.Random(seed).randrange(VOCAB) for _ in range(9)]
    drafts = [make_tiny_llama(VOCAB, seed=100 + seed), target]  # an unrelated LM, and the target itself
    engine = Engine(target, eos_token_ids=(), prefix_cache_bytes=0)
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="ar"))
    for draft in drafts:
        lm_engine = Engine(target, eos_token_ids=(), draft_model=draft)
        for method in ("model", "hvd"):
            for extended in (prompt, prompt + list(reference.token_ids[:5])):  # the second reuses the draft LM's KV
                ref = engine.generate(extended, GenerationParams(max_new_tokens=30, method="ar"))
                out = lm_engine.generate(extended, GenerationParams(max_new_tokens=30, method=method))
                assert out.token_ids == ref.token_ids
    self_engine = Engine(target, eos_token_ids=())
    self_engine.add_drafter("self", DraftModelDrafter(target, VOCAB, min_survival=0.0))
    out = self_engine.generate(prompt, GenerationParams(max_new_tokens=40, method="self", num_draft_tokens=4))
    assert out.stats.steps == 8  # the target drafting for itself: every 4-token draft accepted, + 1 token a step


@pytest.mark.parametrize(
    "kind, temperature, top_k, top_p",
    [("head", 1.0, 0, 1.0), ("head", 0.7, 5, 0.9), ("lm", 1.0, 0, 1.0), ("self", 0.7, 5, 0.9), ("hvd", 1.0, 0, 1.0),
     ("hvd-head", 1.0, 0, 1.0)],
)
def test_sampling_distribution_with_model_drafts(kind, temperature, top_k, top_p) -> None:
    model = make_tiny_llama(SMALL_VOCAB, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)
    prompt = [1, 4, 2, 7, 1, 4]
    method = "hvd" if kind == "hvd" else "model"
    if kind in ("head", "hvd", "hvd-head"):
        config = DraftHeadConfig(32, 4, 64, SMALL_VOCAB - 2, SMALL_VOCAB, target=target_signature(model))
        head = init_weights(DraftHead(config), seed=4)
        head.draft_vocab = torch.arange(2, SMALL_VOCAB)  # ids 0 and 1 are never drafted: q = 0 there
        # hvd-head: the policy where no cache draft exists (a prompt without repeats, no cross-request store), so
        # the head is asked at every step and its first token's confidence decides; no prefix reuse, so the
        # head has the prompt's hidden states in every request
        engine = Engine(model, eos_token_ids=(), draft_head=head.to(torch.float64),
                        prefix_cache_bytes=0 if kind == "hvd-head" else 1 << 22)
        if kind == "hvd-head":
            prompt, method = [1, 4, 2, 7, 3, 5], kind
            engine.add_drafter(kind, HybridDrafter(SuffixDrafter(None), cost=CostModel.linear(0.05),
                                                   model=DraftHeadDrafter(engine.draft_head)))
    else:
        engine = Engine(model, eos_token_ids=(), draft_model=make_tiny_llama(SMALL_VOCAB, seed=9) if kind == "lm" else model)
    params = GenerationParams(max_new_tokens=2, temperature=temperature, top_k=top_k, top_p=top_p,
                              method=method, num_draft_tokens=3, seed=0)
    assert_samples_follow(engine, prompt, params, exact_two_token_distribution(model, prompt, params))
    if kind == "hvd-head":  # the samples went through head drafts
        assert engine.generate(prompt, params).stats.per_source["head"].steps == 1


class RecordingHeadDrafter(DraftHeadDrafter):
    """Keeps what the engine hands over at each propose."""

    def __init__(self, head):
        super().__init__(head)
        self.seen: list[tuple[int, torch.Tensor, list[int]]] = []
        self.fed: list[int] = []
        self.pending_before: list[int] = []

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None):
        self.pending_before.append(self.pending(ctx))
        before = len(self.cache)
        draft = super().propose(ctx, k, min_survival)
        self.fed.append(len(self.cache) - before)
        self.seen.append((ctx.hidden_start, ctx.hidden_states.clone(), list(ctx.token_ids)))
        return draft


def test_engine_hands_over_the_targets_hidden_states(target) -> None:
    engine = Engine(target, eos_token_ids=(), prefix_cache_bytes=1 << 22)
    drafter = RecordingHeadDrafter(random_head(target))
    engine.add_drafter("rec", drafter)
    prompt = [3, 8, 1, 44, 9, 12, 30]
    first = engine.generate(prompt, GenerationParams(max_new_tokens=12, method="rec", num_draft_tokens=3))
    start, hidden, tokens = drafter.seen[-1]
    assert start == 0 and hidden.shape[0] == len(tokens) - 1  # every processed token: all but the last
    with torch.no_grad():
        full = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(hidden, full, atol=1e-8)
    assert all(fed >= 1 for fed in drafter.fed)  # each step ingests the newly verified indices
    assert drafter.pending_before == drafter.fed  # and says beforehand how many (what the hvd policy charges)
    # the next turn extends the conversation: the engine reuses its prefix KV (no hidden states there)
    # and the head keeps its own entries for the shared prefix, ingesting only the new ones
    drafter.seen.clear()
    drafter.fed.clear()
    drafter.pending_before.clear()
    cached_before = len(drafter.cache)
    extended = prompt + list(first.token_ids) + [5, 6]
    second = engine.generate(extended, GenerationParams(max_new_tokens=6, method="rec", num_draft_tokens=3))
    start, hidden, tokens = drafter.seen[0]
    assert start == second.stats.reused_prefix_tokens > 0
    # entries kept: the shared prefix up to the head's last verified index; it then ingests from the first
    # position it has neither an entry nor a reused KV for (the last step of the first request never reached it)
    assert drafter.fed[0] == len(extended) - 1 - max(cached_before, start) < len(extended) - 1
    assert drafter.pending_before == drafter.fed
    ref = Engine(target, eos_token_ids=(), prefix_cache_bytes=0).generate(
        extended, GenerationParams(max_new_tokens=6, method="ar"))
    assert second.token_ids == ref.token_ids


class RecordingDraftLM(DraftModelDrafter):
    """Keeps what it said it would feed before each propose, and what it fed before drafting."""

    def __init__(self, model) -> None:
        super().__init__(model, VOCAB)
        self.pending_before: list[int] = []
        self.fed: list[int] = []
        self._catching_up = False

    def propose(self, ctx: DraftContext, k: int, min_survival: float | None = None):
        self.pending_before.append(self.pending(ctx))
        self._catching_up = True
        return super().propose(ctx, k, min_survival)

    def _feed(self, token_ids):
        if self._catching_up:
            self.fed.append(len(token_ids))
            self._catching_up = False
        return super()._feed(token_ids)


def test_draft_lm_says_what_catching_up_costs(target) -> None:
    engine = Engine(target, eos_token_ids=(), prefix_cache_bytes=0)
    drafter = RecordingDraftLM(make_tiny_llama(VOCAB, seed=5))
    engine.add_drafter("rec", drafter)
    prompt = [3, 8, 1, 44, 9, 12, 30]
    first = engine.generate(prompt, GenerationParams(max_new_tokens=12, method="rec", num_draft_tokens=3))
    assert drafter.fed[0] == len(prompt) and drafter.pending_before == drafter.fed
    # the next turn extends the conversation: the draft LM keeps its KV for the shared prefix
    drafter.pending_before.clear()
    drafter.fed.clear()
    extended = prompt + list(first.token_ids) + [5, 6]
    second = engine.generate(extended, GenerationParams(max_new_tokens=6, method="rec", num_draft_tokens=3))
    assert drafter.pending_before == drafter.fed and drafter.fed[0] < len(extended) - len(prompt)
    ref = engine.generate(extended, GenerationParams(max_new_tokens=6, method="ar"))
    assert second.token_ids == ref.token_ids
    # a request that shares nothing feeds everything
    drafter.pending_before.clear()
    drafter.fed.clear()
    other = [60, 61, 62]
    engine.generate(other, GenerationParams(max_new_tokens=4, method="rec", num_draft_tokens=3))
    assert drafter.fed[0] == len(other) and drafter.pending_before == drafter.fed


def test_the_project_drafters_declare_the_model_drafter_protocol(target) -> None:
    # what the hvd policy prices and steers them by, declared rather than guessed
    head = DraftHeadDrafter(random_head(target))
    lm = DraftModelDrafter(make_tiny_llama(VOCAB, seed=9), VOCAB)
    for drafter in (head, lm):
        assert isinstance(drafter, ModelDrafter) and drafter.gates_first_token
        assert drafter.cost_prior == DEFAULT_TOKEN_COST_PRIOR and drafter.ingest_cost_prior == DEFAULT_INGEST_COST_PRIOR
    assert head.uses_hidden_states and not lm.uses_hidden_states
    assert head.acceptance_prior is None and lm.acceptance_prior is None  # an untrained head knows no agreement
    assert HybridDrafter(SuffixDrafter(None), model=head).model is head  # used as is, not wrapped
    assert HybridDrafter(SuffixDrafter(None), model=head).uses_hidden_states


def test_head_cache_is_cropped_to_verified_entries(target) -> None:
    drafter = DraftHeadDrafter(random_head(target))
    tokens = [4, 5, 6, 7, 8, 9]
    with torch.no_grad():
        hidden = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    drafter.start("r", tokens)
    draft = drafter.propose(DraftContext("r", tokens, 3, hidden_states=hidden), k=5, min_survival=0.0)
    assert draft.main_length == 5 and draft.probs is None  # greedy: deterministic draft
    # with it: the next three first tokens as alternatives to the first (min_survival 0 keeps them all)
    assert len(draft) == 8 and draft.parents[5:] == (-1, -1, -1) and draft.token_ids[0] not in draft.token_ids[5:]
    assert drafter.cache.positions == [0, 1, 2, 3, 4]  # drafting steps were dropped again
    assert set(draft.token_ids) <= set(drafter.head.draft_vocab.tolist())


def test_sampled_head_drafts_report_q_over_the_target_vocabulary(target) -> None:
    head = random_head(target)
    drafter = DraftHeadDrafter(head)
    tokens = [4, 5, 6, 7]
    with torch.no_grad():
        hidden = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    drafter.start("r", tokens)
    ctx = DraftContext("r", tokens, 2, hidden_states=hidden, temperature=0.8, generator=torch.Generator().manual_seed(0))
    draft = drafter.propose(ctx, k=4, min_survival=0.0)
    assert draft.probs.shape == (4, VOCAB)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(4, dtype=draft.probs.dtype))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head.draft_vocab] = False
    assert float(draft.probs[:, outside].sum()) == 0.0
    for token, row in zip(draft.token_ids, draft.probs):
        assert row[token] > 0


def test_min_survival_stops_model_drafts_early(target) -> None:
    drafter = DraftModelDrafter(target, VOCAB)
    drafter.start("r", [1, 2, 3])
    full = drafter.propose(DraftContext("r", [1, 2, 3], 3), k=8, min_survival=0.0)
    cut = drafter.propose(DraftContext("r", [1, 2, 3], 3), k=8, min_survival=0.999)
    assert full.main_length == 8 and cut.main_length < 8
    assert full.token_ids[: cut.main_length] == cut.token_ids[: cut.main_length]
    assert cut.score >= 0.999 and full.features.survival <= cut.score


def test_draft_loop_skips_the_forward_it_could_not_use() -> None:
    # every distribution puts 0.6 on token 2: survival 0.6, then 0.36, then 0.216 < 0.3, so two tokens;
    # after the second, 0.36 * 0.6 < 0.3: no third forward is run just to learn that
    logits = torch.log(torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1]))
    calls = []

    def advance(token: int) -> torch.Tensor:
        calls.append(token)
        return logits

    draft = draft_loop(logits, advance, 8, temperature=0.0, generator=None, min_survival=0.3, to_target=None,
                       target_vocab=5, source="test", alternatives=0)
    assert draft.token_ids == (2, 2) and calls == [2]
    assert draft.score == pytest.approx(0.36)
    longer = draft_loop(logits, advance, 8, temperature=0.0, generator=None, min_survival=0.2, to_target=None,
                        target_vocab=5, source="test", alternatives=0)
    assert longer.token_ids == (2, 2, 2) and len(calls) == 1 + 2


def test_min_first_decides_the_first_token_on_its_reach() -> None:
    # the first distribution: 0.3 on token 1, then 0.25, 0.2, 0.15 on tokens 2, 3, 4 (0.1 on token 0)
    first = torch.log(torch.tensor([0.1, 0.3, 0.25, 0.2, 0.15]))
    later = torch.log(torch.tensor([0.05, 0.05, 0.8, 0.05, 0.05]))

    def loop(temperature: float, min_first: float | None, min_survival: float = 0.12) -> Draft:
        return draft_loop(first, lambda token: later, 3, temperature=temperature,
                          generator=torch.Generator().manual_seed(0), min_survival=min_survival,
                          min_first=min_first, to_target=None, target_vocab=5, source="test")

    # greedy: the alternatives count towards the reach (0.3 + 0.25 + 0.2 + 0.15 = 0.9)
    greedy = loop(0.0, 0.85)  # one token: its survival 0.3 times at most 0.3 for a second is below 0.12
    assert greedy.main_length == 1 and greedy.token_ids == (1, 2, 3, 4) and greedy.parents == (-1, -1, -1, -1)
    assert loop(0.0, 0.95).token_ids == ()  # not worth a first token: nothing, not even the alternatives
    # sampling verifies no alternatives: the reach is the confidence alone
    assert loop(1.0, 0.35).token_ids == ()
    sampled = loop(1.0, 0.25)
    assert sampled.token_ids and sampled.probs is not None
    # min_first decides the first token only; min_survival (0.5 here) still ends the draft after it
    assert loop(0.0, 0.2, min_survival=0.5).token_ids == (1,)
    assert loop(0.0, None, min_survival=0.5).token_ids == ()  # without min_first, min_survival gates the first too


def test_ingesting_indices_at_once_gives_the_last_ones_logits(target) -> None:
    head = random_head(target)
    features = torch.randn(5, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([1, 2, 3, 4, 5])
    at_once_feature, at_once = head.step(features, tokens, list(range(5)), HeadCache())
    cache, singly = HeadCache(), []
    for t in range(5):
        feature, one = head.step(features[t : t + 1], tokens[t : t + 1], [t], cache)
        singly.append(feature)
    assert at_once.shape == head.draft_vocab.shape  # [V']: only the last index's logits are computed
    assert at_once_feature.shape == (1, 32)  # and only its feature
    assert torch.allclose(at_once, one, atol=1e-9)
    assert torch.allclose(at_once_feature, singly[-1], atol=1e-9)
    # ingested in chunks, each chunk's last index attends to every entry before it, cached or new
    chunked = HeadCache()
    first, _ = head.step(features[:2], tokens[:2], [0, 1], chunked)
    second, in_chunks = head.step(features[2:], tokens[2:], [2, 3, 4], chunked)
    assert torch.allclose(first, singly[1], atol=1e-9) and torch.allclose(second, singly[4], atol=1e-9)
    assert torch.allclose(in_chunks, one, atol=1e-9)
    # a later index's output depends on the earlier ones: the check above is not vacuous
    assert not torch.allclose(singly[4], head.step(features[4:], tokens[4:], [4], HeadCache())[0], atol=1e-6)


def test_head_file_round_trip_and_errors(target, tmp_path) -> None:
    head = random_head(target)
    path = save_head(head, tmp_path / "head.safetensors", {"note": "test"})
    loaded = load_head(path, target).to(torch.float64)
    loaded.attach(target)
    features = torch.randn(3, 32, dtype=torch.float64)
    tokens = torch.tensor([1, 2, 3])
    a = head.step(features, tokens, [0, 1, 2], HeadCache())[1]
    b = loaded.step(features, tokens, [0, 1, 2], HeadCache())[1]
    assert torch.allclose(a, b, atol=5e-2)  # stored in fp16
    assert torch.equal(loaded.draft_vocab, head.draft_vocab)
    assert loaded.recipe == {"note": "test"} and loaded.acceptance_prior is None
    save_head(head, tmp_path / "measured.safetensors", {"report": {"accuracy": [0.42, 0.4]}})
    measured = load_head(tmp_path / "measured.safetensors", target)
    assert measured.acceptance_prior == pytest.approx(0.42)
    hybrid = HybridDrafter(SuffixDrafter(None), model=DraftHeadDrafter(measured.to(torch.float64).attach(target)))
    assert hybrid.model_acceptance == pytest.approx(0.42)  # the policy starts from the head's measured agreement
    engine = Engine(target, eos_token_ids=(), draft_head=str(path))
    assert engine.draft_head is not None
    assert len(engine.generate([1, 2, 3], GenerationParams(max_new_tokens=4, method="model")).token_ids) == 4
    with pytest.raises(DraftHeadError, match="no draft-head file"):
        load_head(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(DraftHeadError, match="not a readable draft-head file"):
        load_head(tmp_path / "junk.safetensors")
    other = make_tiny_llama(VOCAB + 8, seed=1)
    with pytest.raises(DraftHeadError, match="vocabulary"):
        load_head(path, other)
    assert shipped_head_for(target) is None  # no head ships for a tiny random model


def test_method_model_without_a_model_drafter_names_the_fix(target) -> None:
    engine = Engine(target, eos_token_ids=(), draft_head=None)
    with pytest.raises(InvalidRequestError, match="draft_model="):
        engine.generate([1, 2, 3], GenerationParams(method="model"))
    assert engine.generate([1, 2, 3], GenerationParams(max_new_tokens=5, method="hvd")).token_ids  # hvd: cache only


def test_draft_model_must_share_the_vocabulary(target) -> None:
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        Engine(target, draft_model=make_tiny_llama(VOCAB * 40, seed=2))


def test_cost_with_drafting_adds_per_token_cost() -> None:
    cost = CostModel(((0, 1.0), (8, 1.16), (16, 1.4))).with_drafting(0.05)
    assert cost.verify(0) == 1.0
    assert cost.verify(8) == pytest.approx(1.16 + 0.4)
    assert cost.verify(24) == pytest.approx(1.64 + 1.2)
    assert CostModel.linear(0.02).with_drafting(0.1).verify(3) == pytest.approx(1.36)


def test_train_drafter_command_defaults_are_the_recipe_and_bad_arguments_are_refused(tmp_path, capsys) -> None:
    from hvd_agents.cli import build_parser, main
    from hvd_agents.distill.pipeline import DataConfig

    args = build_parser().parse_args(["train-drafter", "-o", str(tmp_path / "head.safetensors")])
    data, train = DataConfig(), TrainConfig()
    assert (args.prompts, args.max_new_tokens, args.seed) == (data.prompts, data.max_new_tokens, data.seed)
    assert (args.epochs, args.draft_vocab, args.lr, args.batch_tokens) == (
        train.epochs, train.draft_vocab, train.lr, train.batch_tokens)
    # refused before any model is loaded or file written
    assert main(["train-drafter", "-o", str(tmp_path / "head.safetensors"), "--batch-tokens", "0"]) == 2
    assert "--batch-tokens" in capsys.readouterr().err
    assert not (tmp_path / "head.safetensors").exists()


def test_the_attention_window_sees_only_the_latest_entries(target) -> None:
    """With a window of w, an index's output is what a cache holding only the w - 1 entries before it gives (an
    entry's key and value depend on its own inputs only), and not what the whole cache gives."""
    head = random_head(target)
    generator = torch.Generator().manual_seed(7)
    features = torch.randn(20, 32, dtype=torch.float64, generator=generator)
    tokens = torch.randint(0, VOCAB, (20,), generator=generator)
    head.attention_window = 8
    long = HeadCache()
    head.step(features[:19], tokens[:19], list(range(19)), long)
    windowed = head.step(features[19:], tokens[19:], [19], long)
    short = HeadCache()
    head.step(features[12:19], tokens[12:19], list(range(12, 19)), short)  # the 7 entries before index 19
    alone = head.step(features[19:], tokens[19:], [19], short)
    assert torch.allclose(windowed[0], alone[0], atol=1e-9) and torch.allclose(windowed[1], alone[1], atol=1e-9)
    at_once = head.step(features, tokens, list(range(20)), HeadCache())  # ingested at once: the same window
    assert torch.allclose(at_once[0], windowed[0], atol=1e-9)
    head.attention_window = None
    whole = head.step(features, tokens, list(range(20)), HeadCache())
    assert not torch.allclose(whole[0], windowed[0], atol=1e-6)
    head.attention_window = 64  # longer than the sequence: every entry
    assert torch.allclose(head.step(features, tokens, list(range(20)), HeadCache())[0], whole[0], atol=1e-12)
