"""The draft head's data from the engine's own forward (``train-drafter --data-source engine``), and training
that starts from an existing head (``--init``); on a tiny random model over the byte tokenizer."""

from __future__ import annotations

import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.chat.render import encode_prompt
from hvd_agents.distill.engine_data import engine_samples, record
from hvd_agents.distill.prompts import TrainingPrompt
from hvd_agents.distill.train import TrainConfig, train_head
from hvd_agents.draft_head import DraftHead, DraftHeadConfig
from hvd_agents.draft_head.model import init_weights, target_signature
from tests.server_helpers import IM_END_ID

PROMPTS = [f"Tell me about topic {i}." for i in range(5)] + [
    TrainingPrompt("json", ({"role": "system", "content": "Reply in JSON."}, {"role": "user", "content": "A cat."}))
]
SETTINGS = {"max_new_tokens": 7, "sampled_fraction": 0.5, "temperature": 1.0, "seed": 5}


@pytest.fixture(scope="module")
def engine(tiny_model, byte_tokenizer):
    return Engine(tiny_model, byte_tokenizer, eos_token_ids=(IM_END_ID,), draft_head=None, prefix_cache_bytes=0,
                  max_batch=3)


def test_engine_samples_are_the_engines_answers_with_its_forwards_rows(engine, byte_tokenizer) -> None:
    """Each sample is the rendered prompt and the engine's own answer (a greedy one equals plain greedy
    decoding; a sampled one the request's seeded draw), its kind kept; its rows are the runner's
    teacher-forced hidden states, and its greedy labels the argmax of the runner's logits, so along a
    greedy answer each label is the next answer token."""
    samples = engine_samples(engine, PROMPTS, concurrency=3, **SETTINGS)
    assert [s.kind for s in samples] == ["chat"] * 5 + ["json"]
    greedy_seen = sampled_seen = False
    for prompt, sample in zip(PROMPTS, samples):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt.messages)
        ids = encode_prompt(byte_tokenizer, messages)
        assert sample.tokens[: sample.answer_start].tolist() == ids
        answer = sample.tokens[sample.answer_start :].tolist()
        greedy = list(engine.generate(ids, GenerationParams(max_new_tokens=7, method="ar")).token_ids)
        labels = sample.greedy[sample.answer_start - 1 : -1].tolist()
        if answer == greedy:
            greedy_seen = True
            assert labels == answer
        else:
            sampled_seen = True
            assert labels != answer  # a sampled answer leaves the greedy path somewhere
        kv = engine.runner.new_kv()
        rows: list[torch.Tensor] = []
        logits = engine.runner.forward(kv, sample.tokens.tolist(), hidden=rows)
        kv.release()
        assert torch.equal(sample.hidden, torch.cat(rows).to(torch.float16))
        assert torch.equal(sample.greedy, logits.argmax(-1))
    assert greedy_seen and sampled_seen
    again = engine_samples(engine, PROMPTS, concurrency=2, **SETTINGS)  # another batching: the same data
    assert [a.tokens.tolist() for a in again] == [s.tokens.tolist() for s in samples]


def test_an_interrupted_engine_run_resumes_with_the_same_samples(engine, tmp_path, monkeypatch) -> None:
    """Parts are saved as they are made; a run stopped after one part and started again loads it and gives
    the samples of an uninterrupted run; a part directory made with other settings is refused by name."""
    from hvd_agents.distill import engine_data

    monkeypatch.setattr(engine_data, "PART_PROMPTS", 4)
    whole = engine_samples(engine, PROMPTS, concurrency=3, **SETTINGS)

    def stop_after_one_part(message: str) -> None:
        raise KeyboardInterrupt

    parts = tmp_path / "data.pt.parts"
    with pytest.raises(KeyboardInterrupt):
        engine_samples(engine, PROMPTS, concurrency=3, progress=stop_after_one_part, parts=parts, **SETTINGS)
    assert [p.name for p in parts.glob("part-*.pt")] == ["part-000000.pt"]
    made: list[str] = []
    resumed = engine_samples(engine, PROMPTS, concurrency=3, parts=parts, progress=made.append, **SETTINGS)
    assert len(made) == 1 and made[0].startswith("engine answered 6/6")  # only the second part was decoded
    for a, b in zip(resumed, whole, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist() and a.kind == b.kind
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.greedy, b.greedy)
    with pytest.raises(ValueError, match="holds batches made with other max_new_tokens"):
        engine_samples(engine, PROMPTS, parts=parts, **{**SETTINGS, "max_new_tokens": 8})


def test_record_is_one_forward_over_prompt_and_answer(engine) -> None:
    sample = record(engine, [5, 6, 7], [8, 9], kind="code")
    assert sample.tokens.tolist() == [5, 6, 7, 8, 9] and sample.answer_start == 3 and sample.kind == "code"
    assert sample.hidden.shape == (5, engine.model.config.hidden_size) and sample.greedy.shape == (5,)


def _head_for(target, seed: int) -> DraftHead:
    config = DraftHeadConfig(target.config.hidden_size, 4, 64, 40, target.config.vocab_size,
                             target=target_signature(target))
    head = init_weights(DraftHead(config), seed=seed)
    head.draft_vocab = torch.arange(0, 80, 2)
    return head


def test_training_from_an_initial_head_keeps_its_vocabulary_and_starts_from_its_weights(engine) -> None:
    """``--init``: the head trained further has the initial head's shape and draft vocabulary (not one chosen
    from the data), starts from its weights (one step at a vanishing rate changes them by almost nothing), and
    a head made for another target is refused by name."""
    samples = engine_samples(engine, PROMPTS * 2, concurrency=3, **SETTINGS)
    target = engine.model
    initial = _head_for(target, seed=4)
    weights = {k: v.clone() for k, v in initial.state_dict().items()}
    config = TrainConfig(epochs=1, lr=1e-9, batch_tokens=4096, ttt_passes=2)
    head, report = train_head(target, samples, config, log=lambda _: None, init=initial)
    assert torch.equal(head.draft_vocab, torch.arange(0, 80, 2))
    assert head.config.intermediate_size == 64 and report.vocab_coverage < 1.0
    for name, value in head.state_dict().items():
        torch.testing.assert_close(value, weights[name].to(value.dtype), atol=1e-5, rtol=0)
    fresh, _ = train_head(target, samples, config, log=lambda _: None)
    assert fresh.config.intermediate_size == TrainConfig().intermediate_size  # without init: the config's shape
    stranger = DraftHead(DraftHeadConfig(target.config.hidden_size, 4, 64, 40, target.config.vocab_size,
                                         target="llama/d999/l1/v1"))
    with pytest.raises(ValueError, match="the initial head was trained for llama/d999/l1/v1"):
        train_head(target, samples, config, log=lambda _: None, init=stranger)


def test_more_data_trains_and_is_never_held_out(engine) -> None:
    """``--more-data``: earlier runs' sequences join the training split only. The held-out split (and so the
    held-out figures) is the one the run's own data give without them, and the training tokens grow by
    exactly theirs: a head started from one trained on those files is judged on sequences it has not seen."""
    samples = engine_samples(engine, PROMPTS, concurrency=3, **SETTINGS)
    earlier = engine_samples(engine, PROMPTS, concurrency=3, **{**SETTINGS, "seed": 6})
    config = TrainConfig(epochs=1, lr=1e-9, batch_tokens=4096, ttt_passes=2)
    target = engine.model
    _, alone = train_head(target, samples, config, log=lambda _: None, init=_head_for(target, seed=4))
    _, more = train_head(target, samples, config, log=lambda _: None, init=_head_for(target, seed=4), train_only=earlier)
    assert more.held_out_sequences == alone.held_out_sequences == 1
    assert more.train_sequences == alone.train_sequences + len(earlier)
    assert more.train_tokens == alone.train_tokens + sum(len(s) - s.answer_start for s in earlier)
    assert more.epochs[0]["held_out_loss"] == pytest.approx(alone.epochs[0]["held_out_loss"], abs=1e-3)


def test_train_drafter_command_takes_the_data_source_and_an_initial_head(tmp_path, capsys) -> None:
    from hvd_agents.cli import build_parser, main
    from hvd_agents.distill.pipeline import DataConfig

    output = tmp_path / "head.safetensors"
    args = build_parser().parse_args(["train-drafter", "-o", str(output)])
    assert (args.data_source, args.concurrency, args.init) == (DataConfig().source, DataConfig().concurrency, None)
    assert DataConfig().source == "engine"
    # refused before any model is loaded or file written
    assert main(["train-drafter", "-o", str(output), "--init", str(tmp_path / "missing.safetensors")]) == 2
    assert "--init" in capsys.readouterr().err
    assert main(["train-drafter", "-o", str(output), "--more-data", str(tmp_path / "earlier.pt")]) == 2
    error = capsys.readouterr().err
    assert "--more-data" in error and "earlier.pt: no such data file" in error
    assert main(["train-drafter", "-o", str(output), "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    assert not output.exists()
    with pytest.raises(ValueError, match="unknown data source 'hf': one of engine, model"):
        DataConfig(source="hf")
