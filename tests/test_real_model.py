"""A focused set of tests on the embedded SmolLM2-135M-Instruct model."""

from __future__ import annotations

import json

import pytest
import torch

from hvd_agents import GenerationParams
from hvd_agents.bench.prompts import agent_prompts
from hvd_agents.chat.render import encode_prompt
from hvd_agents.cli import main

pytestmark = pytest.mark.real_model
MAX_NEW = 40


@pytest.fixture(scope="module")
def prompts(real_engine):
    return {p.name: encode_prompt(real_engine.tokenizer, p.messages, p.tools) for p in agent_prompts()}


def hf_generate(engine, prompt, **extra):
    ids = torch.tensor([prompt])
    eos = list(engine.eos_token_ids)
    with torch.inference_mode():
        out = engine.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                    do_sample=False, eos_token_id=eos, pad_token_id=eos[0], **extra)
    return tuple(out[0, len(prompt):].tolist())


@pytest.mark.parametrize("name", [p.name for p in agent_prompts()])
def test_every_method_equals_hf_greedy(real_engine, prompts, name) -> None:
    prompt = prompts[name]
    expected = hf_generate(real_engine, prompt)
    for method in ("ar", "pld", "hvd-cache", "model", "hvd"):
        got = real_engine.generate(prompt, GenerationParams(max_new_tokens=MAX_NEW, method=method)).token_ids
        assert got == expected, method


@pytest.mark.parametrize("method", ["hvd-cache", "hvd"])
def test_cache_methods_with_registered_structure_are_lossless_and_draft(real_engine, method) -> None:
    from hvd_agents.chat.conversation import prepare

    prompt = agent_prompts()[0]
    structure = prepare(real_engine, prompt.messages, prompt.tools, session_id=f"test-session-{method}")
    expected = hf_generate(real_engine, list(structure.prompt_ids))
    params = GenerationParams(max_new_tokens=MAX_NEW, method=method, record_steps=True)
    result = real_engine.generate(structure.prompt_ids, params, structure=structure)
    assert result.token_ids == expected
    assert result.stats.accepted_tokens > 0
    assert any(source.startswith("suffix:") for source in result.stats.per_source)
    if method == "hvd":  # the target's signal reached the predictor's features after the first step
        # cache drafts only: where the policy priced the draft head's draft higher (its timing decides), that step
        # carries the head's features, which have no target columns
        later = [r.features for r in result.stats.step_records[1:] if r.drafted and r.source.startswith("suffix")]
        assert later and all(f["has_target"] == 1.0 and f["target_entropy"] >= 0.0 for f in later)


def test_tree_drafts_on_the_embedded_model(real_engine, prompts) -> None:
    """Random trees with the greedy continuation planted in a branch: tree masks, positions and the
    accepted path's KV and hidden states on the real model's kernels."""
    from tests.drafters_for_tests import TreeDrafter

    prompt = prompts["json-echo"]
    expected = hf_generate(real_engine, prompt)
    drafter = TreeDrafter(expected, real_engine.vocab_size, seed=3, uses_hidden_states=True)
    real_engine.add_drafter("test-tree", drafter)
    params = GenerationParams(max_new_tokens=MAX_NEW, method="test-tree", num_draft_tokens=8, reuse_prefix=False)
    result = real_engine.generate(prompt, params)
    assert result.token_ids == expected
    assert drafter.trees > 0 and result.stats.steps < MAX_NEW
    # the same states computed plainly on the engine's runner: the prompt's prefill, then one token at a time
    # (on the quantized runner a row is bitwise the same alone or in a tree, so they are equal exactly)
    runner, kv, rows = real_engine.runner, real_engine.runner.new_kv(), []
    runner.forward(kv, prompt[:-1], logits_to_keep=1, hidden=rows)
    for token in drafter.last_context[len(prompt) - 1 : -1]:
        runner.forward(kv, [token], hidden=rows)
    torch.testing.assert_close(drafter.last_hidden, torch.cat(rows), rtol=0, atol=0)


def test_pld_drafts_are_accepted_on_copy_heavy_prompt(real_engine, prompts) -> None:
    result = real_engine.generate(prompts["json-echo"], GenerationParams(max_new_tokens=MAX_NEW, method="pld"))
    assert result.stats.accepted_tokens > 0
    assert result.stats.tokens_per_step > 1.0


def test_stream_text_matches_decode(real_engine, prompts) -> None:
    events = list(real_engine.stream(prompts["code-docstring"], GenerationParams(max_new_tokens=MAX_NEW)))
    tokens = [t for e in events for t in e.token_ids]
    text = "".join(e.text for e in events)
    assert text == real_engine.tokenizer.decode(tokens, skip_special_tokens=True)
    assert events[-1].finish_reason in ("stop", "length") and events[-1].stats is not None
    assert all(e.finish_reason is None for e in events[:-1])


def test_stop_string_on_real_tokenizer(real_engine, prompts) -> None:
    full = real_engine.generate(prompts["code-docstring"], GenerationParams(max_new_tokens=MAX_NEW)).text
    stop = full[10:14]
    cut = real_engine.generate(prompts["code-docstring"], GenerationParams(max_new_tokens=MAX_NEW, stop=(stop,)))
    assert cut.text == full[: full.index(stop)]
    assert cut.finish_reason == "stop"


def test_cli_generate_json(real_engine, capsys) -> None:
    code = main(["generate", "--prompt", "Say hello.", "--max-new-tokens", "8", "--json", "--device", "cpu"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}
    assert 1 <= len(out["token_ids"]) <= 8 and out["stats"]["new_tokens"] == len(out["token_ids"])


def test_cli_reports_bad_input_cleanly(capsys) -> None:
    assert main(["generate", "--prompt", "x", "--max-new-tokens", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--model", "/no/such/model/dir"]) == 2
    assert "/no/such/model/dir" in capsys.readouterr().err


def test_analyze_defaults_to_the_measured_cost_profile(real_engine, tmp_path, capsys) -> None:
    from tests.trace_data import conversations, write_jsonl

    trace = write_jsonl(tmp_path / "agent.jsonl", conversations())
    out = tmp_path / "o.json"
    assert main(["analyze", str(trace), "--policy", "suffix,hvd", "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    c = real_engine.cost_model().per_token
    assert f"--verify-cost {round(c, 4)} from the model's cost profile" in printed
    document = json.loads(out.read_text())
    assert document["_meta"]["verify_cost"] == round(c, 4)
    assert document["hvd"]["output_tokens"] == document["suffix"]["output_tokens"]
