"""The shipped draft head on the embedded SmolLM2-135M-Instruct: found, lossless, and its drafts accepted."""

from __future__ import annotations

import pytest
import torch

from hvd_agents import GenerationParams
from hvd_agents.bench.prompts import chat_prompts
from hvd_agents.chat.render import encode_prompt
from hvd_agents.cli import main
from hvd_agents.distill.prompts import TOPICS
from hvd_agents.draft_head.model import target_signature
from hvd_agents.draft_head.weights import read_recipe, shipped_heads
from hvd_agents.engine.sampling import target_probs
from tests.test_engine_lossless import assert_samples_follow

pytestmark = pytest.mark.real_model
MAX_NEW = 48


@pytest.fixture(scope="module")
def chat_ids(real_engine):
    return {p.name: encode_prompt(real_engine.tokenizer, p.messages, p.tools) for p in chat_prompts()}


def test_a_head_ships_for_the_embedded_model(real_engine) -> None:
    head = real_engine.draft_head
    assert head is not None and head.config.target == target_signature(real_engine.model)
    # on the native CPU forward the head drafts on its int8 kernel
    assert (head.lm_matrix is not None) == bool(getattr(real_engine.runner, "runs_own_threads", False))
    path = next(p for p in shipped_heads() if p.name.startswith("smollm2-135m"))
    assert path.stat().st_size < 20 * 2**20
    recipe = read_recipe(path)
    assert recipe["report"]["accuracy"] and recipe["data"]["answers"].startswith("the target's own answers")
    assert recipe["data"]["source"] == "engine"  # recorded from the forward the engine drafts on
    assert recipe["init"]["recipe"]["report"]["accuracy"]  # the head it was trained further from, recorded
    assert recipe["data"]["catalog"] == "broad"  # its last data: the broad prompt catalog (docs/drafters.md)
    assert recipe["more_data"] == ["broad2-data.pt", "broad-data.pt"]  # every earlier broad run's data beside its own
    assert recipe["init"]["recipe"]["more_data"] == ["broad-data.pt"]  # the head it was trained further from
    # the benchmark's chat prompts are held out from the head's training prompts
    assert not any(topic in text for _, text in [(p.name, p.messages[0]["content"]) for p in chat_prompts()]
                   for topic in TOPICS)


@pytest.mark.parametrize("name", ["volcano", "lighthouse", "thunder"])
def test_model_drafts_are_lossless_and_accepted(real_engine, chat_ids, name) -> None:
    prompt = chat_ids[name]
    reference = real_engine.generate(prompt, GenerationParams(max_new_tokens=MAX_NEW, method="ar"))
    for method in ("model", "hvd"):
        result = real_engine.generate(prompt, GenerationParams(max_new_tokens=MAX_NEW, method=method))
        assert result.token_ids == reference.token_ids, method
    result = real_engine.generate(prompt, GenerationParams(max_new_tokens=MAX_NEW, method="model"))
    head = result.stats.per_source["head"]
    assert head.accepted > 0 and result.stats.steps < reference.stats.steps


def test_sampling_with_the_head_keeps_the_first_token_distribution(real_engine) -> None:
    """Chi-square on the first sampled token (the one a 1-token head draft is verified for)."""
    prompt = real_engine.tokenizer("My favourite fruit is", add_special_tokens=False).input_ids
    params = GenerationParams(max_new_tokens=2, temperature=1.0, top_k=12, method="model", num_draft_tokens=1)
    with torch.inference_mode():
        logits = real_engine.model(torch.tensor([prompt])).logits[0, -1:]
    expected_probs = target_probs(logits, params.sampling)[0]
    expected = {(t,): float(p) for t, p in enumerate(expected_probs.tolist()) if p > 0}
    assert_samples_follow(real_engine, prompt, params, expected, n=600, tokens=1)


def test_cli_generate_with_method_model(real_engine, capsys) -> None:
    assert main(["generate", "--prompt", "Why is the sea salty?", "--method", "model", "--max-new-tokens", "16",
                 "--json"]) == 0
    assert '"head"' in capsys.readouterr().out
