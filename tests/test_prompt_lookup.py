"""Prompt-lookup drafter: hand-written cases and equivalence with transformers' own."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from hvd_agents.drafters import Draft, DraftContext, DraftOutcome, PromptLookupDrafter


def propose(context: list[int], k: int, max_ngram: int = 2) -> tuple[int, ...]:
    drafter = PromptLookupDrafter(max_ngram)
    drafter.start("r", context)
    return drafter.propose(DraftContext("r", context, len(context)), k).token_ids


@pytest.mark.parametrize(
    "context, k, expected, intent",
    [
        ([5, 6, 7, 8, 9, 5, 6], 3, (7, 8, 9), "bigram (5, 6) repeats: copy what followed it"),
        ([5, 6, 7, 8, 9, 5, 6], 10, (7, 8, 9, 5, 6), "draft runs to the end of the context, not past it"),
        ([1, 2, 3, 9, 2, 3, 4, 2, 3], 2, (9, 2), "the EARLIEST occurrence wins (HF's rule), not the latest"),
        ([1, 2, 4, 8, 3, 2], 3, (4, 8, 3), "no bigram match: fall back to the unigram (2)"),
        ([1, 2, 3, 4], 3, (), "nothing repeats: empty draft"),
        ([7], 3, (), "a single token has nothing before it"),
        ([4, 4, 4], 2, (4,), "overlapping self-match of a run"),
    ],
)
def test_hand_written(context, k, expected, intent) -> None:
    assert propose(context, k) == expected, intent


def test_observe_extends_the_context() -> None:
    drafter = PromptLookupDrafter()
    drafter.start("r", [1, 2, 3])
    drafter.observe(DraftOutcome("r", Draft(), 0, (1, 2)))  # context is now [1, 2, 3, 1, 2]
    assert drafter.propose(DraftContext("r", [1, 2, 3, 1, 2], 3), 4).token_ids == (3, 1, 2)
    drafter.stop("r")
    drafter.stop("r")  # idempotent
    with pytest.raises(ValueError, match="not started"):  # its state is gone: a later call is a caller's bug
        drafter.propose(DraftContext("r", [1, 2, 3, 1, 2], 3), 4)


@settings(max_examples=200, deadline=None)
@given(
    context=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    k=st.integers(1, 12),
    max_ngram=st.integers(1, 4),
)
def test_same_drafts_as_transformers(context, k, max_ngram) -> None:
    hf = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=max_ngram, max_length=10_000)
    ids = torch.tensor([context])
    candidates, _ = hf.get_candidates(ids)
    expected = tuple(candidates[0, len(context) :].tolist())
    assert propose(context, k, max_ngram) == expected
