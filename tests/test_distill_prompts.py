"""The draft head's training prompts (chat, code, JSON, tool-calling turns) and the kinds its data carry."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from hvd_agents.bench.prompts import CHAT_PROMPTS, held_out_prompts
from hvd_agents.cli.parser import build_parser
from hvd_agents.distill.catalogs import (
    ACTIONS,
    CATALOGS,
    ENTITIES,
    MORE_TOPICS,
    broad_prompt,
    made_code_tasks,
    made_tool_names,
)
from hvd_agents.distill.data import Sample, generate_samples, load_samples, save_samples
from hvd_agents.distill.pipeline import DataConfig
from hvd_agents.distill.prompts import CODE_TASKS, DEFAULT_MIX, KINDS, TOOLS, TOPICS, TrainingPrompt, training_prompts


def test_training_prompts_follow_the_mix_and_are_distinct_and_reproducible() -> None:
    prompts = training_prompts(400, seed=3)
    counts = Counter(p.kind for p in prompts)
    assert set(counts) == set(KINDS) and sum(counts.values()) == 400
    for kind, share in DEFAULT_MIX.items():
        assert abs(counts[kind] - 400 * share) <= 1, kind
    assert len({p.key() for p in prompts}) == 400
    assert [p.key() for p in training_prompts(400, seed=3)] == [p.key() for p in prompts]
    assert [p.key() for p in training_prompts(400, seed=4)] != [p.key() for p in prompts]
    only_code = training_prompts(20, mix={"code": 1.0})
    assert {p.kind for p in only_code} == {"code"}


def test_tool_prompts_declare_their_tools_and_calls_carry_valid_arguments() -> None:
    tools = [p for p in training_prompts(200, seed=1) if p.kind == "tools"]
    names = {t["function"]["name"] for t in TOOLS}
    assert tools and all(p.tools for p in tools)
    reported = [p for p in tools if p.messages[-1]["role"] == "tool"]
    assert reported and len(reported) < len(tools)  # both the call turn and the report turn
    for prompt in reported:
        call = prompt.messages[-2]["tool_calls"][0]["function"]
        assert call["name"] in names and call["name"] in {t["function"]["name"] for t in prompt.tools}
        assert isinstance(json.loads(call["arguments"]), dict)


def test_the_benchmarks_prompts_are_held_out_from_training() -> None:
    held = held_out_prompts()
    assert set(held) == set(KINDS) and all(held.values())
    trained_tools = {t["function"]["name"] for t in TOOLS}
    for prompts in held.values():
        for prompt in prompts:
            assert not {t["function"]["name"] for t in prompt.tools} & trained_tools, prompt.name
            text = " ".join(str(m.get("content", "")) for m in prompt.messages)
            assert not any(task in text for task in CODE_TASKS), prompt.name
    assert not any(topic in text for _, text in CHAT_PROMPTS for topic in TOPICS)


@pytest.mark.parametrize("bad", [{"poems": 1.0}, {"chat": -1.0, "code": 2.0}, {"chat": 0.0}])
def test_a_bad_mix_is_refused_by_name(bad) -> None:
    with pytest.raises(ValueError, match="a mix gives non-negative shares of chat, code, json, tools"):
        training_prompts(10, mix=bad)


def test_generated_samples_carry_their_prompts_kind_through_a_saved_file(tiny_model, byte_tokenizer, tmp_path) -> None:
    prompts = ["Tell me about rivers.",
               TrainingPrompt("tools", ({"role": "user", "content": "What is AAPL at?"},), (TOOLS[0],)),
               TrainingPrompt("json", ({"role": "user", "content": "A JSON object, please."},))]
    samples = generate_samples(tiny_model, byte_tokenizer, prompts, [byte_tokenizer.eos_token_id], max_new_tokens=4,
                               batch_size=2)
    assert sorted(s.kind for s in samples) == ["chat", "json", "tools"]
    tool_sample = next(s for s in samples if s.kind == "tools")
    rendered = byte_tokenizer.decode(tool_sample.tokens[: tool_sample.answer_start].tolist())
    assert "get_stock_price" in rendered  # the declared tool is in the prompt the target answered
    save_samples(samples, tmp_path / "data.pt")
    assert [s.kind for s in load_samples(tmp_path / "data.pt")] == [s.kind for s in samples]
    # a data file written before kinds were recorded still loads (as chat)
    old = tmp_path / "old.pt"
    torch.save([(s.tokens, s.hidden, s.greedy, s.answer_start) for s in samples], str(old))
    assert {s.kind for s in load_samples(old)} == {"chat"} and isinstance(load_samples(old)[0], Sample)


def test_the_broad_catalog_is_reproducible_distinct_and_broader() -> None:
    prompts = training_prompts(600, seed=2, make=broad_prompt)
    assert [p.key() for p in training_prompts(600, seed=2, make=broad_prompt)] == [p.key() for p in prompts]
    assert len({p.key() for p in prompts}) == 600
    counts = Counter(p.kind for p in prompts)
    for kind, share in DEFAULT_MIX.items():
        assert abs(counts[kind] - 600 * share) <= 1, kind
    templated_tools = {t["function"]["name"] for t in TOOLS}
    called = Counter()
    for prompt in (p for p in prompts if p.kind == "tools"):
        declared = [t["function"]["name"] for t in prompt.tools]
        assert len(declared) == len(set(declared)), declared  # no tool declared twice
        called[declared[0]] += 1
        if prompt.messages[-1]["role"] == "tool":
            call = prompt.messages[-2]["tool_calls"][0]["function"]
            assert call["name"] == declared[0] and isinstance(json.loads(call["arguments"]), dict)
            required = next(t for t in prompt.tools if t["function"]["name"] == call["name"])["function"]["parameters"]
            assert set(required["required"]) <= set(json.loads(call["arguments"]))
    made = set(called) - templated_tools
    assert len(made) > 3 * len(templated_tools) and set(called) & templated_tools  # made tools, and the templated
    assert len(made_tool_names()) == len(ENTITIES) * len(ACTIONS) and not made_tool_names() & templated_tools
    code = " ".join(p.messages[-1]["content"] for p in prompts if p.kind == "code")
    assert sum(task in code for task in made_code_tasks()) > 50 and any(task in code for task in CODE_TASKS)
    chat = " ".join(p.messages[-1]["content"] for p in prompts if p.kind == "chat")
    assert any(topic in chat for topic in MORE_TOPICS) and any(topic in chat for topic in TOPICS)


def test_the_benchmarks_prompts_are_held_out_from_the_broad_catalog_too() -> None:
    for prompts in held_out_prompts().values():
        for prompt in prompts:
            assert not {t["function"]["name"] for t in prompt.tools} & made_tool_names(), prompt.name
            text = " ".join(str(m.get("content", "")) for m in prompt.messages)
            assert not any(task in text for task in made_code_tasks()), prompt.name
    assert not any(topic in text for _, text in CHAT_PROMPTS for topic in MORE_TOPICS)


def test_a_catalog_is_named_in_the_data_settings_and_on_the_command_line() -> None:
    assert set(CATALOGS) == {"templated", "broad"} and DataConfig().catalog == "templated"
    with pytest.raises(ValueError, match="unknown prompt catalog 'wide': one of templated, broad"):
        DataConfig(catalog="wide")
    args = build_parser().parse_args(["train-drafter", "-o", "x.safetensors", "--catalog", "broad"])
    assert args.catalog == "broad"
    # the templated catalog is the one the shipped head's earlier data were drawn from: unchanged
    assert [p.key() for p in training_prompts(50, seed=0, make=CATALOGS["templated"])] == \
        [p.key() for p in training_prompts(50, seed=0)]
