"""The draft head's state across verification outcomes: what survives a rejection is what the verified context gives.

The head drafter keeps its KV over the verified context from step to step and
from request to request (an agent's growing conversation costs only its new
tokens), and drops what it computed while drafting: a drafted entry holds a
predicted feature and a drafted token, stale once the target has verified (or
rejected) that token. Whatever the target did with the last draft (accepted it
all, part of it, none of it) and wherever the engine reused a prefix KV (no
hidden states there), the drafter that kept its state must draft exactly what a
fresh drafter drafts from the verified tokens and the target's hidden states
alone. A drafter that keeps a drafted entry as if verified (a planted stale
hidden state) fails the same check.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from hvd_agents.draft_head import DraftHead, DraftHeadConfig
from hvd_agents.draft_head.model import init_weights, target_signature
from hvd_agents.drafters import DraftContext, DraftHeadDrafter
from hvd_agents.runtime.cpu import native_forward
from tests.tiny import make_tiny_llama

VOCAB = 64
K = 4
needs_native = pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")


def make_head(target, fused: bool = False, taps: tuple[int, ...] = ()) -> DraftHead:
    """A float64 head, or (``fused``) a float32 one on the native kernel, each index's key and value computed alone
    in one native call a step (``quantize_for_cpu``); with ``taps``, one that fuses those layers' inputs."""
    config = DraftHeadConfig(target.config.hidden_size, 4, 64, 48, VOCAB, target=target_signature(target), taps=taps)
    head = init_weights(DraftHead(config), seed=2)
    head.draft_vocab = torch.arange(VOCAB - 48, VOCAB)
    if not fused:
        return head.to(torch.float64).attach(target)
    head.attach(target)
    assert head.quantize_for_cpu(1) == 5 + bool(taps)
    return head


def hidden_of(target, tokens: list[int], taps: tuple[int, ...] = ()) -> torch.Tensor:
    """The target's last-layer hidden states of every token but the last (what the engine hands over), with the
    inputs of the layers ``taps`` beside them."""
    with torch.no_grad():
        states = target(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
    return torch.cat([states[-1][0], *(states[layer][0] for layer in taps)], dim=-1)


class KeepsDraftedState(DraftHeadDrafter):
    """Plants a stale hidden state: keeps the entry of its first drafted token (a predicted feature) as if the
    target had verified it, as a drafter that reused its drafts' states unchecked would."""

    def propose(self, ctx, k, min_survival=None, min_first=None):
        draft = super().propose(ctx, k, min_survival, min_first)
        if draft.token_ids:
            self.cache.positions.append(len(ctx.token_ids) - 1)  # the entry drafting wrote there, kept
        return draft


def run(drafter: DraftHeadDrafter, target, seed: int, steps: int = 12) -> tuple[int, Counter]:
    """Decode two requests (the second extends the first, its shared prefix given without hidden states, as
    after a prefix-KV reuse), each step accepting a random number of the draft's tokens followed by a token
    of the "target"'s own; returns the steps whose draft differs from a fresh drafter's, and the outcomes."""
    rng = random.Random(seed)
    tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 8))]
    differ, outcomes = 0, Counter()
    for request in range(2):
        # the second request's shared prefix comes from a reused KV: hidden states only from where the head's
        # own entries end (a gap between them would leave the head nothing to ingest there)
        prompt_length, reused = len(tokens), (drafter.cache.positions[-1] + 1 if request else 0)
        drafter.start(f"r{request}", tokens)
        for _ in range(steps):
            hidden = hidden_of(target, tokens, drafter.head.config.taps)
            kept = drafter.propose(DraftContext(f"r{request}", list(tokens), prompt_length,
                                                hidden_states=hidden[reused:], hidden_start=reused), K, 0.0)
            fresh = DraftHeadDrafter(drafter.head, alternatives=0)
            fresh.start("fresh", tokens)
            reference = fresh.propose(DraftContext("fresh", list(tokens), prompt_length, hidden_states=hidden), K, 0.0)
            assert len(reference.token_ids) == K
            differ += kept.token_ids != reference.token_ids or abs(kept.score - reference.score) > 1e-9
            accepted = rng.choice([0, 1, 2, K])  # none, part, all of the draft
            outcomes["none" if accepted == 0 else "all" if accepted == K else "part"] += 1
            correction = rng.choice([t for t in range(VOCAB) if accepted == K or t != reference.token_ids[accepted]])
            tokens = tokens + list(reference.token_ids[:accepted]) + [correction]
        tokens = tokens + [rng.randrange(VOCAB) for _ in range(3)]  # the next turn's new tokens
    return differ, outcomes


@pytest.mark.parametrize("taps", [(), (0, 1)])
@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=needs_native)])
def test_the_state_kept_across_steps_and_requests_drafts_what_the_verified_context_gives(fused, taps) -> None:
    target = make_tiny_llama(VOCAB, seed=11, dtype=torch.float32 if fused else torch.float64)
    head = make_head(target, fused, taps)
    for seed in range(3):
        differ, outcomes = run(DraftHeadDrafter(head, alternatives=0), target, seed)
        assert differ == 0
        assert set(outcomes) == {"none", "part", "all"}


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=needs_native)])
def test_a_planted_stale_hidden_state_is_caught(fused) -> None:
    target = make_tiny_llama(VOCAB, seed=11, dtype=torch.float32 if fused else torch.float64)
    head = make_head(target, fused)
    differ = sum(run(KeepsDraftedState(head, alternatives=0), target, seed)[0] for seed in range(3))
    assert differ > 0
