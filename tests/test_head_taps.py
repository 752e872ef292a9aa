"""A draft head that fuses several of the target's layers (EAGLE-3's fusion, ``DraftHeadConfig.taps``).

The runners give each tapped layer's input beside the last-layer state (``set_hidden_taps``): the native CPU
forward copies the residual stream as it enters the layer, the HF runner reads ``hidden_states[layer]``. The
head reads ``h_t + fuse(norm(taps))`` where it read ``h_t``; a head given taps starts with a zero fusion, so it
drafts exactly as before until trained. Outputs never depend on the head: the greedy-equality checks run with a
fusion that changes the drafts.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.distill.data import Sample, load_samples, save_samples
from hvd_agents.distill.engine_data import record
from hvd_agents.distill.train import TrainConfig, train_head
from hvd_agents.draft_head import DraftHead, DraftHeadConfig, HeadCache, load_head, save_head
from hvd_agents.draft_head.model import init_weights, target_signature, with_taps
from hvd_agents.drafters import DraftHeadDrafter
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.runner import HFRunner
from tests.tiny import make_tiny_llama

VOCAB = 64
needs_native = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")


@pytest.fixture(scope="module")
def target():
    return make_tiny_llama(VOCAB, seed=11, dtype=torch.float32)


def head_for(target, taps=(), seed: int = 3) -> DraftHead:
    config = DraftHeadConfig(target.config.hidden_size, 4, 64, 48, VOCAB, target=target_signature(target), taps=taps)
    head = init_weights(DraftHead(config), seed=seed)
    head.draft_vocab = torch.arange(VOCAB - 48, VOCAB)
    return head.attach(target)


def wide_hidden(target, tokens: list[int], taps) -> torch.Tensor:
    """The float model's last-layer states of ``tokens`` with the inputs of ``taps`` beside them."""
    with torch.no_grad():
        states = target(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.cat([states[-1][0], *(states[layer][0] for layer in taps)], dim=-1)


@needs_native
def test_the_native_forward_gives_each_tapped_layers_input_beside_the_last_layers_state(target) -> None:
    # the last-layer columns are the bits the forward gives untapped; each tapped block is the residual stream
    # entering the layer (the float model's hidden_states[layer], to the KV cache's float16 rounding)
    runner = QuantRunner(NativeModel(target, quant_weights.from_model(target, "float32"), 512))
    ids = [3, 17, 42, 5, 9, 3, 17, 30, 1]
    plain: list = []
    runner.forward(runner.new_kv(), ids, hidden=plain)
    runner.set_hidden_taps([1, 0])
    assert runner.hidden_taps == (1, 0)
    tapped: list = []
    kv = runner.new_kv()
    runner.forward(kv, ids[:4], hidden=tapped)
    runner.forward(kv, ids[4:], hidden=tapped)  # a prompt and then a step: the same rows
    rows, d = torch.cat(tapped), target.config.hidden_size
    assert rows.shape == (len(ids), 3 * d)
    assert torch.equal(rows[:, :d], plain[0])
    torch.testing.assert_close(rows, wide_hidden(target, ids, (1, 0)), atol=2e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="layer 2 is not in 0..1"):
        runner.set_hidden_taps([2])
    runner.set_hidden_taps([])
    again: list = []
    runner.forward(runner.new_kv(), ids, hidden=again)
    assert torch.equal(again[0], plain[0])


def test_the_hf_runner_gives_each_tapped_layers_input(target) -> None:
    runner = HFRunner(target, cost_model=None)
    runner.set_hidden_taps([1])
    rows: list = []
    runner.forward(runner.new_kv(), [4, 8, 15, 16, 23], hidden=rows)
    assert torch.equal(rows[0], wide_hidden(target, [4, 8, 15, 16, 23], (1,)))
    with pytest.raises(ValueError, match="not all in 0..1"):
        runner.set_hidden_taps([0, 5])


def test_a_head_given_taps_drafts_as_before_until_its_fusion_is_trained(target) -> None:
    head = head_for(target)
    tapped = with_taps(head, (0, 1)).attach(target)
    assert tapped.config.taps == (0, 1) and tapped.feature_width == 3 * target.config.hidden_size
    tokens = [5, 9, 2, 33, 7, 12]
    wide = wide_hidden(target, tokens, (0, 1))
    d = target.config.hidden_size
    plain, fused = (h.step(f, torch.tensor(tokens[1:]), list(range(5)), HeadCache())
                    for h, f in ((head, wide[:-1, :d]), (tapped, wide[:-1])))
    assert torch.equal(plain[1], fused[1])
    with torch.no_grad():
        tapped.fuse.weight.normal_(0, 0.5)
    moved = tapped.step(wide[:-1], torch.tensor(tokens[1:]), list(range(5)), HeadCache())
    assert not torch.allclose(moved[1], plain[1])
    with pytest.raises(ValueError, match="reads features 32 or 96 wide, not 64"):
        tapped.step(wide[:-1, : 2 * d], torch.tensor(tokens[1:]), list(range(5)), HeadCache())
    with pytest.raises(ValueError, match="fuses layers"):
        with_taps(tapped, (1,))


def test_a_tapped_head_file_round_trips(target, tmp_path) -> None:
    head = with_taps(head_for(target), (1,)).attach(target)
    with torch.no_grad():
        head.fuse.weight.normal_(0, 0.1)
    path = save_head(head, tmp_path / "head.safetensors", {"note": "taps"})
    loaded = load_head(path, target)
    assert loaded.config.taps == (1,)
    torch.testing.assert_close(loaded.fuse.weight, head.fuse.weight.half().float())


@needs_native
@pytest.mark.parametrize("window", [None, 3])
def test_the_fused_native_step_of_a_tapped_head_is_the_layer_by_layer_step(target, window) -> None:
    heads = []
    for fused in (True, False):
        head = with_taps(head_for(target), (0, 1)).attach(target)
        with torch.no_grad():
            head.fuse.weight.copy_(torch.randn(head.fuse.weight.shape, generator=torch.Generator().manual_seed(4)) * 0.2)
        assert head.quantize_for_cpu(1, fused=fused) == 6  # the fusion runs on the kernel too
        head.attention_window = window
        heads.append(head)
    tokens = [5, 9, 2, 33, 7, 12, 40, 41]
    wide = wide_hidden(target, tokens, (0, 1))
    caches = HeadCache(), HeadCache()
    outs = [h.step(wide[:-1], torch.tensor(tokens[1:]), list(range(7)), c) for h, c in zip(heads, caches)]
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-5)
    feature = outs[0][0]
    for i in range(4):  # drafting: the head's own d-wide features
        (pf, lf), (_, ll) = (h.step(feature, torch.tensor([20 + i]), [7 + i], c) for h, c in zip(heads, caches))
        torch.testing.assert_close(lf, ll, rtol=1e-4, atol=1e-5)
        feature = pf


def _trained_tapped_head(target) -> DraftHead:
    head = with_taps(head_for(target, seed=5), (0, 1)).attach(target)
    with torch.no_grad():
        head.fuse.weight.normal_(0, 0.3)  # drafts that differ from the untapped head's
    return head


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16),
    max_new=st.integers(1, 24),
    method=st.sampled_from(["model", "hvd", "eager"]),
)
def test_greedy_equality_with_a_tapped_head(target, prompt, max_new, method) -> None:
    engine = Engine(target, eos_token_ids=(), draft_head=_trained_tapped_head(target), prefix_cache_bytes=0)
    assert engine.runner.hidden_taps == (0, 1)  # the engine had its runner tap what the head fuses
    engine.add_drafter("eager", DraftHeadDrafter(engine.draft_head, min_survival=0.0))  # drafts every step
    got = engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method=method))
    ref = Engine(target, eos_token_ids=(), draft_head=None, prefix_cache_bytes=0).generate(
        prompt, GenerationParams(max_new_tokens=max_new, method="ar"))
    assert got.token_ids == ref.token_ids


@needs_native
def test_greedy_equality_with_a_tapped_head_on_the_native_runner(target) -> None:
    from hvd_agents.runtime.target import Target

    native = NativeModel(target, quant_weights.from_model(target, "int8"), 512)
    head = _trained_tapped_head(target)
    assert head.quantize_for_cpu(1) == 6
    engine = Engine(Target.of(target, eos_token_ids=(), native=native), draft_head=head, prefix_cache_bytes=0)
    assert isinstance(engine.runner, QuantRunner) and engine.runner.hidden_taps == (0, 1)
    engine.add_drafter("eager", DraftHeadDrafter(head, min_survival=0.0))  # drafts every step, from wide rows
    for prompt in ([3, 17, 42, 5], [9] * 12, list(range(20, 40))):
        ref = engine.generate(prompt, GenerationParams(max_new_tokens=30, method="ar"))
        for method in ("model", "eager"):
            got = engine.generate(prompt, GenerationParams(max_new_tokens=30, method=method, num_draft_tokens=4))
            assert got.token_ids == ref.token_ids
        assert got.stats.drafted_tokens > 0


def test_tapped_samples_train_a_tapped_head_and_untapped_data_are_refused(target, tmp_path) -> None:
    engine = Engine(target, eos_token_ids=(), draft_head=None, prefix_cache_bytes=0)
    engine.runner.set_hidden_taps([1])
    samples = [record(engine, [i, i + 1, i + 2], [i + 3, i + 4, i + 5, i + 6], "chat") for i in range(0, 30, 3)]
    assert samples[0].taps == (1,) and samples[0].hidden.shape[1] == 2 * target.config.hidden_size
    path = tmp_path / "data.pt"
    save_samples(samples, path)
    again = load_samples(path)
    assert again[0].taps == (1,) and torch.equal(again[0].hidden, samples[0].hidden)
    assert torch.equal(again[0].features(()), samples[0].hidden[:, : target.config.hidden_size])
    config = TrainConfig(epochs=1, lr=1e-3, batch_tokens=256, ttt_passes=2, taps=(1,))
    head, _ = train_head(target, samples, config, log=lambda _: None, init=head_for(target))
    assert head.config.taps == (1,) and head.fuse.weight.abs().max() > 0  # the fusion trained from zero
    # trained alone, the fusion moves and every other weight of the head it was added to stays as it was
    init = head_for(target)
    alone, _ = train_head(target, samples, TrainConfig(epochs=1, lr=1e-3, batch_tokens=256, ttt_passes=2, taps=(1,),
                                                       fusion_only=True), log=lambda _: None, init=init)
    kept = {name: value for name, value in init.state_dict().items()}
    changed = {name for name, value in alone.state_dict().items()
               if name not in kept or not torch.equal(value, kept[name])}
    assert changed == {"fuse.weight", "norm_taps.weight"} and alone.fuse.weight.abs().max() > 0
    assert all(param.requires_grad for param in alone.parameters())  # a head as any other afterwards
    with pytest.raises(ValueError, match="needs a trained head"):
        train_head(target, samples, TrainConfig(taps=(1,), fusion_only=True), log=lambda _: None)
    with pytest.raises(ValueError, match="needs the layers it fuses"):
        TrainConfig(fusion_only=True)
    untapped = [Sample(s.tokens, s.hidden[:, : target.config.hidden_size], s.greedy, s.answer_start) for s in samples]
    with pytest.raises(ValueError, match=r"hold the inputs of layers \(\), not \(1,\)"):
        train_head(target, untapped, config, log=lambda _: None, init=head_for(target))


def test_train_drafter_refuses_bad_taps(tmp_path, capsys) -> None:
    from hvd_agents.cli import main

    assert main(["train-drafter", "-o", str(tmp_path / "h.safetensors"), "--taps", "2,x"]) != 0
    assert "--taps '2,x': give layer indices" in capsys.readouterr().err
    assert main(["train-drafter", "-o", str(tmp_path / "h.safetensors"), "--taps", "2",
                 "--data-source", "model"]) != 0
    assert "taps need the data source 'engine'" in capsys.readouterr().err
    assert main(["train-drafter", "-o", str(tmp_path / "h.safetensors"), "--taps", "2", "--fusion-only"]) != 0
    assert "--fusion-only trains the fusion of an --init head alone" in capsys.readouterr().err
