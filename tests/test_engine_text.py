"""Text output of the engine on a tiny model with a byte-level tokenizer (no download).

Every non-ASCII character spans several tokens and every stop string of two or
more characters spans token boundaries, so these tests exercise incremental
detokenization and stop-string matching inside the decode loop.
"""

from __future__ import annotations

import pytest

from hvd_agents import Engine, GenerationParams
from tests.helpers import make_byte_tokenizer
from tests.tiny import make_tiny_llama


@pytest.fixture(scope="module")
def engine() -> Engine:
    tokenizer = make_byte_tokenizer()
    return Engine(make_tiny_llama(len(tokenizer), seed=7), tokenizer, eos_token_ids=())


PROMPT = list("héllo wörld ✓ ".encode())


@pytest.mark.parametrize("method", ["ar", "pld", "hvd-cache"])
def test_streamed_text_equals_decoded_tokens(engine, method) -> None:
    events = list(engine.stream(PROMPT, GenerationParams(max_new_tokens=60, method=method)))
    tokens = [t for e in events for t in e.token_ids]
    streamed = "".join(e.text for e in events)
    assert streamed == engine.tokenizer.decode(tokens, skip_special_tokens=True)
    assert any(b >= 0x80 for b in tokens), "the output should hold multi-byte sequences to be a real test"


@pytest.mark.parametrize("method", ["ar", "pld", "hvd-cache"])
def test_stop_string_across_token_boundaries(engine, method) -> None:
    full = engine.generate(PROMPT, GenerationParams(max_new_tokens=60, method="ar"))
    stop = full.text[5:8]  # three characters: at least three byte tokens
    assert len(stop.encode()) >= 3
    cut = engine.generate(PROMPT, GenerationParams(max_new_tokens=60, method=method, stop=(stop,)))
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason == "stop"
    # tokens stop at the one that completed the stop string, whatever the draft length
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert engine.tokenizer.decode(cut.token_ids).find(stop) >= 0


def test_stop_string_never_completed_returns_everything(engine) -> None:
    full = engine.generate(PROMPT, GenerationParams(max_new_tokens=30, method="ar"))
    params = GenerationParams(max_new_tokens=30, method="pld", stop=("\x00never\x00",))
    assert engine.generate(PROMPT, params).text == full.text
