"""Adversarial drafters for the losslessness tests.

They follow the Drafter protocol and propose drafts chosen to stress verification:
correct prefixes of random length followed by wrong tokens, pure noise, drafts
longer than the remaining budget, token ids outside the vocabulary, and drafts
that carry a distribution q (model-drafter style).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from hvd_agents.drafters import Draft, DraftContext, Outcome


class ScriptedDrafter:
    """Greedy-adversarial drafter.

    Knows the reference greedy continuation (``oracle``) and, from its own seeded
    RNG, proposes a mix of: a correct prefix of random length then noise; pure
    noise; an overlong draft (up to 3x k); an out-of-vocabulary id; nothing.
    """

    def __init__(self, oracle: Sequence[int], vocab_size: int, seed: int) -> None:
        self.oracle = list(oracle)
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.stopped: list[str] = []

    def start(self, req_id: str, prompt_ids: Sequence[int], structure=None) -> None:
        self.num_prompt = len(prompt_ids)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        pos = ctx.num_output_tokens
        mode = self.rng.randrange(5)
        length = self.rng.randint(1, 3 * k)
        noise = [self.rng.randrange(self.vocab_size) for _ in range(length)]
        if mode == 0:
            good = self.oracle[pos : pos + self.rng.randint(0, length)]
            tokens = good + noise[len(good) :]
        elif mode == 1:
            tokens = noise
        elif mode == 2:
            tokens = self.oracle[pos : pos + length] + noise
        elif mode == 3:
            tokens = self.oracle[pos : pos + 1] + [self.vocab_size + 7] + noise
        else:
            tokens = []
        return Draft(tuple(tokens), source=f"mode{mode}")

    def observe(self, outcome: Outcome) -> None:
        pass

    def stop(self, req_id: str) -> None:
        self.stopped.append(req_id)


class FixedDrafter:
    """Always proposes the same deterministic tokens (a bad cache draft)."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tuple(tokens)

    def start(self, req_id: str, prompt_ids: Sequence[int], structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return Draft(self.tokens[:k], source="fixed")

    def observe(self, outcome: Outcome) -> None:
        pass

    def stop(self, req_id: str) -> None:
        pass


class RandomQDrafter:
    """Samples each draft token from its own fixed random distribution q and reports q."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        logits = torch.randn(vocab_size, generator=gen) * 2.0
        self.q = logits.softmax(-1).double()  # [vocab]
        self.gen = gen

    def start(self, req_id: str, prompt_ids: Sequence[int], structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        tokens = torch.multinomial(self.q, k, replacement=True, generator=self.gen)  # [k]
        probs = self.q.expand(k, -1)  # [k, vocab]
        return Draft(tuple(tokens.tolist()), probs=probs, source="q")

    def observe(self, outcome: Outcome) -> None:
        pass

    def stop(self, req_id: str) -> None:
        pass


class OracleDrafter:
    """Proposes exactly the next ``k`` tokens of a known reference output."""

    def __init__(self, reference: Sequence[int]) -> None:
        self.reference = tuple(reference)

    def start(self, req_id: str, prompt_ids: Sequence[int], structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        pos = ctx.num_output_tokens
        return Draft(self.reference[pos : pos + k], source="oracle")

    def observe(self, outcome: Outcome) -> None:
        pass

    def stop(self, req_id: str) -> None:
        pass
