"""No warnings from the package's own calls: the test run turns them into errors (pyproject.toml's
``filterwarnings``), and the runner and the cost-profile steps call transformers by its current names."""

from __future__ import annotations

import warnings

import pytest
import torch

from hvd_agents.drafters.base import DraftContext
from hvd_agents.drafters.model.draft_lm import DraftModelDrafter
from hvd_agents.runtime.profile import measure_cost_model
from hvd_agents.runtime.runner import HFRunner
from tests.tiny import make_tiny_llama

TINY = make_tiny_llama(64, seed=3)


@pytest.mark.parametrize("module", ["hvd_agents.runtime.runner", "langchain_hvd.chat_models", "llama_index.llms.hvd.base"])
def test_a_warning_raised_from_our_code_fails_the_test(module: str) -> None:
    with pytest.raises(DeprecationWarning, match="planted"):
        warnings.warn_explicit("planted", DeprecationWarning, "planted.py", 1, module=module)


def test_a_warning_raised_elsewhere_is_left_to_the_default_filters() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit("planted", DeprecationWarning, "planted.py", 1, module="hvd_agents_elsewhere")
    assert [str(w.message) for w in caught] == ["planted"]


def test_the_deprecated_cache_argument_fails_the_test() -> None:
    # what the runner passed before: transformers warns from torch's Module.__call__, matched by the message
    with pytest.raises(FutureWarning, match="past_key_values"), torch.inference_mode():
        TINY(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=HFRunner(TINY).new_kv(), use_cache=True)


def test_the_runner_the_profile_and_the_draft_lm_call_the_model_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner = HFRunner(TINY)
        kv = runner.new_kv()
        assert runner.forward(kv, [1, 2, 3]).shape == (3, 64)
        measure_cost_model(TINY, lengths=(0, 2), context=8, repeats=1)
        drafter = DraftModelDrafter(TINY, target_vocab=64, min_survival=0.0)
        drafter.start("r", [1, 2, 3])
        assert drafter.propose(DraftContext("r", [1, 2, 3], 3), 2).token_ids
