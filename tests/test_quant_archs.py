"""The native forward of every family it runs, from GGUF files the tests write (llama, mistral, qwen2, qwen3,
gemma3, phi3): against the model's own transformers forward, speculation exactly the plain decode, a prompt's
bits the same whole, chunked and resumed, and sliding windows exact whatever the cache's history.

Two files per family (tests/arch_models.py's tiny random models, written as llama.cpp writes them):

* F32 matrices: the native forward reads the same numbers as the in-process model, and runs float32 matrices
  on float32 inputs; only the float16 KV cache rounds (a relative 2**-11 on each key and value), so logits
  agree with the transformers forward to 2e-3 of their largest magnitude.
* Q8_0 matrices, read back by transformers' own GGUF loader (the reference then holds the file's values, as
  the native forward does): the native forward also quantizes the inputs of every linear layer per block of
  32 to int8 (as llama.cpp does). For a block of Gaussian inputs (largest about 2.2 sigma, step largest / 127,
  rounding error step / sqrt(12)) that is a relative RMS error of about 0.5%; nine quantizations a forward
  (four a layer, one for the head) add up in quadrature to about 1.5%. Measured over three prompts per family:
  0.7% to 2.2% of the logits' standard deviation (RMS), 0.4% to 3.2% of the largest logit (max). The bounds:
  4% and 6%, and nine in ten argmaxes the same.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from hvd_agents import Engine, GenerationParams
from hvd_agents.bench.gguf_files import write_gguf
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.arch import architecture
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.target import Target
from tests.arch_models import FAMILIES, VOCAB, WINDOW, make_model
from tests.drafters_for_tests import ScriptedDrafter, TreeDrafter

pytestmark = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")

CONTEXT = 512


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """family -> (F32 file, Q8_0 file) of the family's tiny model."""
    root = tmp_path_factory.mktemp("gguf")
    return {f: tuple(write_gguf(make_model(f), root / f"{f}-{q}.gguf", q) for q in ("F32", "Q8_0"))
            for f in FAMILIES}


def _from_transformers(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def q8_models(files):
    """family -> the native forward over the Q8_0 file's blocks, its model the file as transformers loads it."""
    models = {}
    for family in FAMILIES:
        model = _from_transformers(files[family][1])
        models[family] = NativeModel(model, quant_weights.from_gguf(files[family][1], model), CONTEXT)
    return models


def _reference(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_file_matches_the_transformers_forward(files, family) -> None:
    model = make_model(family)
    native = NativeModel(model, quant_weights.from_gguf(files[family][0], model), CONTEXT)
    assert set(native.info.formats) == {"F32"}
    ids = _ids(3 * WINDOW + 5, seed=1)  # longer than the window: its layers see only the last 16 positions
    runner = QuantRunner(native)
    got, expected = runner.forward(runner.new_kv(), ids), _reference(model, ids)
    scale = expected.abs().max().item()
    assert scale > 1.0  # varied logits, not noise around zero
    torch.testing.assert_close(got, expected, atol=2e-3 * scale, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_file_matches_the_transformers_forward_of_the_same_file(q8_models, family) -> None:
    native = q8_models[family]
    ids = _ids(3 * WINDOW + 5, seed=2)
    runner = QuantRunner(native)
    got, expected = runner.forward(runner.new_kv(), ids), _reference(native.model, ids)
    diff = got - expected
    assert diff.pow(2).mean().sqrt() <= 0.04 * expected.std()
    assert diff.abs().max() <= 0.06 * expected.abs().max()
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert agree > 0.9, agree


def test_a_window_changes_what_a_layer_sees(files) -> None:
    # the comparison above would pass for a window applied nowhere only if windows changed nothing: they do
    model = make_model("mistral")
    ids = _ids(3 * WINDOW, seed=3)
    runner = QuantRunner(NativeModel(model, quant_weights.from_gguf(files["mistral"][0], model), CONTEXT))
    windowed = runner.forward(runner.new_kv(), ids)
    model.config.sliding_window = None
    runner = QuantRunner(NativeModel(model, quant_weights.from_gguf(files["mistral"][0], model), CONTEXT))
    full = runner.forward(runner.new_kv(), ids)
    assert torch.equal(windowed[:WINDOW], full[:WINDOW]) and not torch.allclose(windowed[-1], full[-1], atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_whole_in_chunks_and_resumed_is_bitwise_the_same(q8_models, family) -> None:
    runner = QuantRunner(q8_models[family])
    ids = _ids(150, seed=4)
    whole_kv = runner.new_kv()
    whole = runner.forward(whole_kv, ids, logits_to_keep=2)
    for size in (1, 5, 16, 17, 64, 149):
        kv = runner.new_kv()
        for i in range(0, len(ids), size):
            last = runner.forward(kv, ids[i : i + size])
        assert torch.equal(last[-1], whole[-1]), size
        assert torch.equal(kv.k[:, :, :150], whole_kv.k[:, :, :150]), size
        assert torch.equal(kv.v[:, :, :150], whole_kv.v[:, :, :150]), size
    resumed = runner.new_kv()
    resumed.import_prefix(whole_kv.export_prefix(97), 97)
    assert torch.equal(runner.forward(resumed, ids[97:])[-2:], whole)


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_windows_stay_exact_across_drafts_rollbacks_and_tree_compaction(q8_models, family) -> None:
    """A long history of verified drafts (rolled back to their accepted prefix) and trees (compacted to their
    accepted path) ends with the cache, and the next logits, of the accepted tokens decoded one at a time."""
    runner = QuantRunner(q8_models[family])
    rng = np.random.default_rng(5)
    accepted = _ids(WINDOW - 3, seed=6)
    kv = runner.new_kv()
    runner.forward(kv, accepted)
    while len(accepted) < 5 * WINDOW:
        past = kv.length
        if rng.random() < 0.5:  # a chain draft: keep a prefix
            draft = rng.integers(0, VOCAB, int(rng.integers(1, 2 * WINDOW))).tolist()
            runner.forward(kv, draft)
            keep = int(rng.integers(0, len(draft) + 1))
            kv.rollback(past + keep)
            accepted += draft[:keep]
        else:  # a tree: keep one root-to-node path
            n = int(rng.integers(2, 12))
            tokens = rng.integers(0, VOCAB, n).tolist()
            parents = [-1] + [int(rng.integers(-1, i)) for i in range(n - 2)]
            runner.forward(kv, tokens, parents=parents[: n - 1] if n > 1 else [])
            node, path = int(rng.integers(0, n)), []
            while node >= 0:
                path.insert(0, node)
                node = -1 if node == 0 else parents[node - 1] + 1
            kv.compact(past, path)
            accepted += [tokens[i] for i in path]
    one_by_one = runner.new_kv()
    for t in accepted:
        runner.forward(one_by_one, [t])
    n = len(accepted)
    assert kv.length == n
    assert torch.equal(kv.k[:, :, :n], one_by_one.k[:, :, :n]) and torch.equal(kv.v[:, :, :n], one_by_one.v[:, :, :n])
    assert torch.equal(runner.forward(kv, [7]), runner.forward(one_by_one, [7]))


@pytest.mark.parametrize("family", FAMILIES)
def test_speculation_is_exactly_the_plain_decode(q8_models, family) -> None:
    native = q8_models[family]
    engine = Engine(Target.of(native.model, eos_token_ids=(), native=native))
    assert isinstance(engine.runner, QuantRunner)
    for seed in range(3):
        prompt = _ids(5 + 7 * seed, seed=10 + seed)
        reference = engine.generate(prompt, GenerationParams(max_new_tokens=40, method="ar"))
        for name, drafter in (("chain", ScriptedDrafter(reference.token_ids, VOCAB, seed)),
                              ("tree", TreeDrafter(reference.token_ids, VOCAB, seed))):
            engine.add_drafter(name, drafter)
            result = engine.generate(prompt, GenerationParams(max_new_tokens=40, method=name, num_draft_tokens=8,
                                                              reuse_prefix=False))
            assert result.token_ids == reference.token_ids, (name, seed)
        for method in ("pld", "hvd"):
            got = engine.generate(prompt, GenerationParams(max_new_tokens=40, method=method)).token_ids
            assert got == reference.token_ids, (method, seed)


@pytest.mark.parametrize("family", ["gemma3", "qwen3", "phi3"])
def test_every_cpu_path_gives_the_avx2_bits(files, family) -> None:
    model = make_model(family)
    weights = quant_weights.from_gguf(files[family][1], model)
    ids = _ids(70, seed=8)
    logits = {}
    for path in native_forward.cpu_paths():
        runner = QuantRunner(NativeModel(model, weights, CONTEXT, path=path))
        kv = runner.new_kv()
        logits[path] = torch.cat([runner.forward(kv, ids[:40]), *(runner.forward(kv, [t]) for t in ids[40:])])
    for path, got in logits.items():
        assert torch.equal(got.view(torch.int32), logits["avx2"].view(torch.int32)), path


def test_what_each_family_is(q8_models) -> None:
    gemma = architecture(make_model("gemma3"))
    assert gemma.windows == (WINDOW, 0) and gemma.layer_ropes == (1, 0) and gemma.qk_norm and gemma.post_norms
    assert gemma.embed_scale == float(np.float32(8.0)) and gemma.attn_scale == 0.125 and gemma.head_dim == 256
    phi = architecture(make_model("phi3"))
    assert phi.ropes[0].inv_freq.numel() == 4  # half of head_dim 16 rotates: 4 pairs
    llama = architecture(make_model("llama"))
    hf = make_model("llama").model.rotary_emb.inv_freq.to(torch.float64)
    torch.testing.assert_close(llama.ropes[0].inv_freq, hf, rtol=1e-6, atol=0)  # Llama 3 scaling, as transformers
    assert architecture(q8_models["qwen2"].model).family == "qwen2"


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path / "cache"))


def test_a_gguf_file_loads_with_no_float32_copy_of_its_layers(files, own_cache) -> None:
    from hvd_agents.runtime.loading import load_model

    loaded = load_model(files["qwen3"][1], device="cpu")
    model = loaded.model
    assert loaded.native is not None and loaded.native.model is model
    layers = [p for name, p in model.named_parameters() if ".layers." in name]
    assert layers and all(p.device.type == "meta" for p in layers)  # the file's blocks are the only copy
    assert model.get_input_embeddings().weight.device.type == "cpu"  # real rows, for what reads them
    ids = _ids(20, seed=9)
    runner = QuantRunner(loaded.native)
    native = runner.forward(runner.new_kv(), ids)
    reference = _reference(_from_transformers(files["qwen3"][1]), ids)
    assert torch.equal(native, runner.forward(runner.new_kv(), ids))
    assert torch.equal(_reference(model, ids), reference)  # its own forward, once called, has the file's weights
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_a_family_the_native_forward_lacks_loads_through_transformers_with_a_notice(files, own_cache, monkeypatch,
                                                                                   caplog) -> None:
    from hvd_agents.runtime.cpu import arch as quant_arch
    from hvd_agents.runtime.loading import load_model

    monkeypatch.setattr(quant_arch, "FAMILIES", tuple(f for f in quant_arch.FAMILIES if f != "qwen3"))
    with caplog.at_level("WARNING", logger="hvd_agents.runtime.loading"):
        loaded = load_model(files["qwen3"][1], device="cpu")
    assert loaded.native is None
    notice = [r.getMessage() for r in caplog.records if "float32 forward" in r.getMessage()]
    assert len(notice) == 1 and "architecture 'qwen3'" in notice[0] and "GB of weights in memory" in notice[0]


def test_a_head_size_transformers_does_not_read_comes_from_the_file(tmp_path, own_cache) -> None:
    # transformers' GGUF reader leaves qwen3's head_dim at its default (128): the file's key_length decides
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hvd_agents.runtime.loading import load_model

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                         max_position_embeddings=256)
    model = Qwen3ForCausalLM(config).eval()
    path = write_gguf(model, tmp_path / "qwen3-head32.gguf", "F32")
    loaded = load_model(path, device="cpu")
    assert loaded.native is not None and loaded.model.config.head_dim == 32
    ids = _ids(12, seed=11)
    runner = QuantRunner(loaded.native)
    torch.testing.assert_close(runner.forward(runner.new_kv(), ids), _reference(model, ids), atol=2e-3, rtol=0)
