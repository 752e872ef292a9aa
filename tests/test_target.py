"""An engine built over a Target (model, runner, tokenizer, EOS ids): the runner is used as it is, chosen once."""

from __future__ import annotations

import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.loading import LoadedModel
from hvd_agents.runtime.runner import HFRunner
from hvd_agents.runtime.target import Target, default_eos
from tests.helpers import make_byte_tokenizer
from tests.tiny import make_tiny_llama

VOCAB = 64
PROMPT = [3, 17, 12, 5, 9, 3, 17, 12]
GREEDY = GenerationParams(max_new_tokens=10, method="pld")


def test_an_engine_over_a_target_runs_on_its_runner_as_given() -> None:
    model = make_tiny_llama(VOCAB)
    runner = HFRunner(model, context_window=40, cost_model=CostModel.linear(0.1))
    target = Target(model, runner, None, (7,))
    engine = Engine(target, draft_head=None)
    assert engine.target is target and engine.runner is runner and engine.model is model
    assert engine.context_window == 40 and engine.eos_token_ids == (7,) and engine.tokenizer is None
    plain = Engine(model, eos_token_ids=(7,), context_window=40, cost_model=CostModel.linear(0.1), draft_head=None)
    assert plain.runner is not runner  # a model alone gets a runner of its own
    assert engine.generate(PROMPT, GREEDY).token_ids == plain.generate(PROMPT, GREEDY).token_ids
    assert Engine.from_target(target, max_batch=2).runner is runner


@pytest.mark.parametrize("part", ["tokenizer", "eos_token_ids", "context_window", "cost_model", "runner"])
def test_a_target_part_given_twice_is_refused(part: str) -> None:
    model = make_tiny_llama(VOCAB)
    target = Target.of(model, eos_token_ids=(7,))
    value = {"tokenizer": make_byte_tokenizer(), "eos_token_ids": (1,), "context_window": 32,
             "cost_model": CostModel.linear(0.1), "runner": HFRunner(model)}[part]
    with pytest.raises(InvalidRequestError, match=f"takes its {part} from the target"):
        Engine(target, **{part: value})


def test_a_target_sibling_has_its_own_runner_and_the_same_cost_and_window() -> None:
    model = make_tiny_llama(VOCAB)
    target = Target.of(model, eos_token_ids=(7,), context_window=48, cost_model=CostModel.linear(0.2))
    sibling = target.sibling()
    assert sibling.model is model and sibling.eos_token_ids == (7,) and sibling.runner is not target.runner
    assert sibling.runner.context_window == 48 and sibling.runner.profile() == CostModel.linear(0.2)
    assert target.sibling(CostModel.linear(0.5)).runner.profile() == CostModel.linear(0.5)


def test_a_target_from_a_loaded_model_takes_its_tokenizer_eos_and_window() -> None:
    tokenizer = make_byte_tokenizer()
    model = make_tiny_llama(len(tokenizer))
    loaded = LoadedModel(model=model, tokenizer=tokenizer, name="tiny", device=torch.device("cpu"), dtype=torch.float64)
    target = Target.from_loaded(loaded)
    assert target.tokenizer is tokenizer and target.eos_token_ids == loaded.eos_token_ids
    assert target.runner.context_window == loaded.context_window and isinstance(target.runner, HFRunner)
    assert Target.of(model, tokenizer).eos_token_ids == default_eos(model, tokenizer)


@pytest.mark.skipif(not native_forward.available(), reason="the native forward needs AVX2 and a compiler")
def test_a_loaded_models_native_forward_is_its_targets_runner_and_its_siblings() -> None:
    tokenizer = make_byte_tokenizer()
    model = make_tiny_llama(len(tokenizer), dtype=torch.float32)
    native = NativeModel(model, quant_weights.from_model(model, "int8"), 96)
    loaded = LoadedModel(model=model, tokenizer=tokenizer, name="tiny", device=torch.device("cpu"),
                         dtype=torch.float32, native=native)
    target = Target.from_loaded(loaded, cost_model=CostModel.linear(0.2))
    assert target.native is native and isinstance(target.runner, QuantRunner) and target.runner.native is native
    sibling = target.sibling()
    assert isinstance(sibling.runner, QuantRunner) and sibling.runner is not target.runner
    assert sibling.native is native and sibling.runner.native is native
    assert sibling.runner.profile() == CostModel.linear(0.2)
    assert isinstance(Target.of(model, tokenizer).runner, HFRunner)  # the model alone runs its own forward
    with pytest.raises(ValueError, match="another model"):
        Target.of(make_tiny_llama(len(tokenizer), dtype=torch.float32), native=native)
