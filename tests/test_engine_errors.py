"""Bad input raises a clear exception that names the cause."""

from __future__ import annotations

import pytest

from hvd_agents import ContextLengthError, Engine, GenerationParams, HVDError, InvalidRequestError
from tests.tiny import make_tiny_llama


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(make_tiny_llama(32), eos_token_ids=(), context_window=64)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ("",)}, "stop"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
    ],
)
def test_invalid_params(kwargs, needle) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        GenerationParams(**kwargs)


def test_empty_prompt(engine) -> None:
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.generate([])


def test_out_of_vocabulary_prompt(engine) -> None:
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        engine.generate([1, 2, 999])


def test_prompt_longer_than_context(engine) -> None:
    with pytest.raises(ContextLengthError, match="context window is 64"):
        engine.generate(list(range(30)) * 3)


def test_generation_stops_at_context_window(engine) -> None:
    result = engine.generate(list(range(30)) * 2, GenerationParams(max_new_tokens=50, method="ar"))
    assert len(result.token_ids) == 4 and result.finish_reason == "length"


def test_unknown_method(engine) -> None:
    with pytest.raises(InvalidRequestError, match="unknown decoding method 'nope'"):
        engine.generate([1, 2], GenerationParams(method="nope"))


def test_stop_strings_need_a_tokenizer(engine) -> None:
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        engine.generate([1, 2], GenerationParams(stop=("x",)))


def test_errors_share_a_base_class() -> None:
    assert issubclass(ContextLengthError, HVDError) and issubclass(InvalidRequestError, ValueError)


def test_add_drafter_rejects_non_drafters(engine) -> None:
    with pytest.raises(InvalidRequestError, match="Drafter protocol"):
        engine.add_drafter("bad", object())
