"""The static runner's device-independent parts on the CPU: slot cache, buckets, masks, the
fixed-shape decoder against HF's own forward, engine losslessness through it, the
single-bucket mode's bitwise equality, and its bucket cost profile.

Its CUDA-only parts (graph capture and replay, one sync per step) are in tests/test_gpu_runner.py.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from hvd_agents import Engine, GenerationParams
from hvd_agents.runtime.kv import new_cache
from hvd_agents.runtime.runner import BatchCall, HFRunner
from hvd_agents.runtime.runner_choice import runner_for
from hvd_agents.runtime.static import Buckets, SlotPool, SlotsExhaustedError, StaticRunner, supports
from hvd_agents.runtime.static.cost import measure_bucket_cost
from tests.drafters_for_tests import ScriptedDrafter, TreeDrafter
from tests.tiny import make_tiny_llama

VOCAB = 64
BUCKETS = Buckets((1, 2, 3, 5, 9, 17), (64, 128, 512))


@pytest.fixture(scope="module")
def model():
    return make_tiny_llama(VOCAB, seed=3)


@pytest.fixture(scope="module")
def engines(model):
    """(HF-runner engine, static-runner engine) over the same float64 model."""
    return (Engine(model, eos_token_ids=(), draft_head=None),
            Engine(model, eos_token_ids=(), draft_head=None, runner=StaticRunner(model, buckets=BUCKETS)))


def tiny_qwen2() -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 (q/k/v biases) with random weights, float64."""
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True, use_sliding_window=False)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        model = Qwen2ForCausalLM(config).double().eval()
        for layer in model.model.layers:  # non-zero biases, so a forgotten bias shows
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.data.normal_()
    return model


# --- buckets and slots -------------------------------------------------------------------------

def test_buckets_pick_the_smallest_fitting_shape() -> None:
    b = Buckets.for_capacity(1000)
    assert b.kv == (256, 512, 1024)  # the capacity rounded up to a multiple of 64
    assert Buckets.for_capacity(960).kv == (256, 512, 960)
    assert [b.rows_for(n) for n in (1, 2, 3, 4, 5, 6, 9, 10, 65)] == [1, 2, 3, 5, 5, 9, 9, 17, 65]
    assert b.kv_for(256) == 256 and b.kv_for(257) == 512 and b.kv_for(1000) == 1024
    with pytest.raises(ValueError, match="exceeds the largest row bucket"):
        b.rows_for(66)
    with pytest.raises(ValueError, match="exceed the KV capacity"):
        b.kv_for(1025)
    with pytest.raises(ValueError, match="increasing"):
        Buckets((2, 1), (8,))


def test_slots_are_handed_out_once_and_return_when_released() -> None:
    pool = SlotPool(2, layers=1, kv_heads=1, head_dim=2, capacity=8, dtype=torch.float32, device=torch.device("cpu"))
    a, b = pool.acquire(), pool.acquire()
    assert {a.slot, b.slot} == {0, 1} and pool.free == 0
    with pytest.raises(SlotsExhaustedError, match="all 2 KV slots are held"):
        pool.acquire()
    a.release()
    assert pool.free == 1
    del b  # garbage collection gives the slot back too
    assert pool.free == 2
    c = pool.acquire()
    with pytest.raises(ValueError, match="exceed the slot's capacity"):
        c.advance(9)


def test_slot_cache_rolls_back_compacts_and_moves_prefixes_like_the_hf_cache(model) -> None:
    runner, hf = StaticRunner(model, buckets=BUCKETS), HFRunner(model)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    s, h = runner.new_kv(), hf.new_kv()
    for kv, r in ((s, runner), (h, hf)):
        r.forward(kv, ids[:30])
        kv.rollback(25)
        r.forward(kv, ids[25:33], parents=[-1, 0, 1, 0, 3, 4, 2])
        kv.compact(25, [0, 3, 4, 5])
    assert s.length == h.length == 29
    for (sk, sv), (hk, hv) in zip(s.export_prefix(29), h.export_prefix(29)):
        assert torch.equal(sk, hk) and torch.equal(sv, hv)
    t = runner.new_kv() if runner.pool.free else None
    s2 = t or runner.new_kv()
    s2.import_prefix(h.export_prefix(20), 20)
    assert s2.length == 20
    torch.testing.assert_close(runner.forward(s2, ids[20:24]), hf.forward(_cut(h, 20), ids[20:24]), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="cannot keep offsets"):
        s2.compact(20, [2, 1])
    with pytest.raises(ValueError, match="needs an empty cache"):
        s2.import_prefix(h.export_prefix(5), 5)


def _cut(kv, n):
    kv.rollback(n)
    return kv


# --- the decoder against HF's forward ------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: make_tiny_llama(VOCAB, seed=3), tiny_qwen2], ids=["llama", "qwen2"])
def test_static_forward_equals_the_models_own_forward(make) -> None:
    model = make()
    runner, hf = StaticRunner(model, buckets=BUCKETS), HFRunner(model)
    rng = random.Random(0)
    ids = [rng.randrange(VOCAB) for _ in range(80)]
    s, h = runner.new_kv(), hf.new_kv()
    hs, hh = [], []
    calls = [(ids[:37], None, 0), (ids[37:38], None, 0), (ids[38:43], None, 0),  # prefill, plain step, chain
             (ids[43:50], [-1, 0, 0, 1, 2, -1], 0), (ids[50:79], None, 2)]  # a tree; a long chain, last 2 logits
    for tokens, parents, keep in calls:
        a = runner.forward(s, tokens, parents=parents, logits_to_keep=keep, hidden=hs)
        b = hf.forward(h, tokens, parents=parents, logits_to_keep=keep, hidden=hh)
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
        torch.testing.assert_close(hs[-1], hh[-1], rtol=0, atol=1e-10)
        if parents is not None:
            s.compact(43, [0, 1, 3]), h.compact(43, [0, 1, 3])
    assert s.length == h.length


def test_stacked_projections_hold_the_weights_once_and_give_the_models_forward() -> None:
    model = make_tiny_llama(VOCAB, seed=8)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    unstacked = StaticRunner(model, buckets=BUCKETS, stack_projections=False)
    read = unstacked.decoder.layers[0].q.data_ptr()
    before = [w.detach().clone() for w in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                                           mlp.gate_proj.weight, mlp.up_proj.weight)]
    ids = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits[0]
    stacked = StaticRunner(model, buckets=BUCKETS, stack_projections=True)
    after = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight)
    assert all(torch.equal(a, b) for a, b in zip(after, before))  # the same values, now views of the stacks
    layer = stacked.decoder.layers[0]
    assert attn.q_proj.weight.untyped_storage().data_ptr() == layer.qkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == layer.gate_up.untyped_storage().data_ptr()
    again = StaticRunner(model, buckets=BUCKETS, stack_projections=True)  # over stacks already: no new copy
    assert again.decoder.layers[0].qkv.data_ptr() == layer.qkv.data_ptr()
    kv = stacked.new_kv()
    torch.testing.assert_close(stacked.forward(kv, ids[0].tolist()), want, rtol=0, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits[0], want, rtol=0, atol=0)  # the model itself unchanged
    # a decoder made before reads the tensors it was given (what graphs it captured read), not the stacks
    assert unstacked.decoder.layers[0].q.data_ptr() == read != attn.q_proj.weight.data_ptr()
    torch.testing.assert_close(unstacked.forward(unstacked.new_kv(), ids[0].tolist()), want, rtol=0, atol=1e-10)


def test_supported_models_and_the_runner_choice(model) -> None:
    assert supports(model) is None
    gemma_like = make_tiny_llama(VOCAB)
    gemma_like.config.model_type = "gemma3_text"
    assert "gemma3_text" in supports(gemma_like)
    mistral = make_tiny_llama(VOCAB)
    mistral.config.model_type, mistral.config.sliding_window = "mistral", 16
    assert "sliding-window" in supports(mistral)
    for rope_type in ("dynamic", "longrope"):
        scaled = make_tiny_llama(VOCAB)
        scaled.config.rope_parameters = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}
        assert f"RoPE type {rope_type!r}" in supports(scaled)
    llama3 = make_tiny_llama(VOCAB)
    llama3.config.rope_parameters = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0}
    assert supports(llama3) is None  # fixed frequencies: HF's inv_freq is the table
    assert isinstance(runner_for(model), HFRunner)  # the static runner is the CUDA default, not the CPU's
    with pytest.raises(ValueError, match="cannot run this model"):
        StaticRunner(gemma_like, buckets=BUCKETS)


def test_forward_errors_name_the_cause(model) -> None:
    runner = StaticRunner(model, buckets=BUCKETS)
    kv = runner.new_kv()
    with pytest.raises(ValueError, match="needs 2 parents"):
        runner.forward(kv, [1, 2, 3], parents=[-1])
    with pytest.raises(ValueError, match="at most 17 tokens"):
        runner.forward(kv, list(range(20)), parents=list(range(-1, 18)))
    with pytest.raises(ValueError, match="exceed the context window of 495"):
        runner.forward(kv, [1] * 496)


# --- the engine through the static runner ---------------------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24), max_new=st.integers(1, 30),
       k=st.integers(0, 12), seed=st.integers(0, 10_000), tree=st.booleans())
def test_engine_greedy_output_through_the_static_runner_is_plain_greedy(engines, prompt, max_new, k, seed,
                                                                        tree) -> None:
    hf_engine, engine = engines
    reference = hf_engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar")).token_ids
    assert engine.generate(prompt, GenerationParams(max_new_tokens=max_new, method="ar")).token_ids == reference
    drafter = (TreeDrafter if tree else ScriptedDrafter)(reference, VOCAB, seed)
    engine.add_drafter("adversarial", drafter)
    params = GenerationParams(max_new_tokens=max_new, method="adversarial", num_draft_tokens=max(k, 1))
    assert engine.generate(prompt, params).token_ids == reference


def test_prefix_reuse_and_cache_drafters_through_the_static_runner(engines) -> None:
    hf_engine, engine = engines
    turn = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    for method in ("pld", "hvd"):
        prompt = list(turn)
        for _ in range(3):  # a growing conversation: each prompt extends the last one and its reply
            want = hf_engine.generate(prompt, GenerationParams(max_new_tokens=20, method="ar"))
            got = engine.generate(prompt, GenerationParams(max_new_tokens=20, method=method))
            assert got.token_ids == want.token_ids
            prompt = prompt + list(got.token_ids) + turn[:5]
        assert got.stats.reused_prefix_tokens > 0
    assert engine.runner.pool.free == engine.runner.pool.slots  # finished requests hold no slot


# --- single-bucket mode: bitwise ---------------------------------------------------------------------

def test_single_bucket_mode_makes_every_position_bitwise_independent_of_its_forward() -> None:
    model = make_tiny_llama(VOCAB, seed=11, dtype=torch.float32)
    runner = StaticRunner(model, buckets=Buckets.single(9, 256))
    ids = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    plain = runner.new_kv()
    runner.forward(plain, ids[:40])
    one_by_one = torch.cat([runner.forward(plain, [t]) for t in ids[40:48]])  # [8, vocab]
    plain.release()
    spec = runner.new_kv()
    runner.forward(spec, ids[:40])
    together = runner.forward(spec, ids[40:48])  # the same positions in one forward
    assert torch.equal(one_by_one, together)
    # In a tree, a branch's rows read their ancestors' keys at non-adjacent slots: the attention sums
    # then group their terms differently, so trees are equal to plain decoding to rounding, not bitwise.
    spec.rollback(40)
    tree = runner.forward(spec, [ids[40], 3, ids[41], ids[42], 7], parents=[-1, -1, 1, 0])
    assert torch.equal(tree[0], one_by_one[0])
    torch.testing.assert_close(tree[[2, 3]], one_by_one[1:3], rtol=0, atol=1e-5)


def test_single_bucket_mode_speculation_equals_plain_decoding_bit_for_bit() -> None:
    model = make_tiny_llama(VOCAB, seed=11, dtype=torch.float32)
    engine = Engine(model, eos_token_ids=(), draft_head=None,
                    runner=StaticRunner(model, buckets=Buckets.single(17, 256)))
    prompt = [3, 17, 42, 5, 9, 3, 17, 42, 5]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=60, method="ar")).token_ids
    for seed in range(3):
        engine.add_drafter("scripted", ScriptedDrafter(reference, VOCAB, seed))
        got = engine.generate(prompt, GenerationParams(max_new_tokens=60, method="scripted", num_draft_tokens=12))
        assert got.token_ids == reference


# --- cost profile ------------------------------------------------------------------------------------

def test_bucket_cost_profile_is_a_step_function_of_the_draft_length(model) -> None:
    runner = StaticRunner(model, buckets=BUCKETS)
    cost = measure_bucket_cost(runner, context=32, repeats=2)
    assert cost.verify(0) == 1.0
    assert cost.verify(3) == cost.verify(4)  # both pad to the 5-row bucket
    assert cost.verify(5) == cost.verify(8)  # the 9-row bucket
    assert cost.verify(9) >= cost.verify(8) >= cost.verify(2) >= 1.0
    assert "static runner's buckets" in cost.source
    assert runner.pool.free == runner.pool.slots


def test_forward_batch_is_each_calls_own_forward(model) -> None:
    for runner in (StaticRunner(model, buckets=BUCKETS, slots=4), HFRunner(model)):
        caches = [runner.new_kv() for _ in range(2)]
        for kv, prompt in zip(caches, ([1, 2, 3], [4, 5, 6, 7, 8])):
            runner.forward(kv, prompt)
        got = runner.forward_batch([BatchCall(caches[0], [9, 10]), BatchCall(caches[1], [11, 12, 13], [-1, -1])])
        assert [g.shape[0] for g in got] == [2, 3] and [kv.length for kv in caches] == [5, 8]


def test_new_cache_still_backs_the_hf_runner(model) -> None:
    assert type(new_cache(model.config)).__name__ == "EngineCache"


def test_a_warmed_up_runner_takes_the_next_forward(model) -> None:
    # warm-up makes the packed input buffers inside inference mode; the next forward writes them outside it
    runner = StaticRunner(model, buckets=BUCKETS, graphs=False)
    runner.warm_up()
    assert runner.forward(runner.new_kv(), [1, 2, 3]).shape == (3, VOCAB)


def test_warm_up_runs_every_row_bucket_at_the_named_kv_lengths_and_keeps_live_caches(model, monkeypatch) -> None:
    runner = StaticRunner(model, buckets=BUCKETS, graphs=False, slots=2)
    ids = torch.randint(0, VOCAB, (50,), generator=torch.Generator().manual_seed(4)).tolist()
    live = runner.new_kv()
    runner.forward(live, ids[:40])
    seen, run = [], runner.graphs.run
    monkeypatch.setattr(runner.graphs, "run", lambda *key: seen.append(key) or run(*key))
    runner.warm_up([40, 100, 128], slot=live.slot)  # positions and a bucket: the KV buckets 64 and 128
    assert seen == [(live.slot, rows, length) for length in (64, 128) for rows in BUCKETS.rows]
    seen.clear()
    runner.warm_up(1, slot=1)
    assert seen == [(1, rows, 64) for rows in BUCKETS.rows]
    fresh = runner.new_kv()
    runner.forward(fresh, ids[:40])
    assert torch.equal(runner.forward(live, ids[40:45]), runner.forward(fresh, ids[40:45]))


def test_a_model_without_its_tensors_is_refused_with_the_way_to_load_it() -> None:
    # a GGUF file loaded for the native CPU forward alone keeps transformers' module on the meta device
    model = make_tiny_llama(64, dtype=torch.float32)
    rotary = model.model.rotary_emb
    rotary.register_buffer("inv_freq", torch.empty_like(rotary.inv_freq, device="meta"), persistent=False)
    with pytest.raises(ValueError, match=r"model.rotary_emb.inv_freq.*cpu_weights='none'"):
        StaticRunner(model, slots=1)
