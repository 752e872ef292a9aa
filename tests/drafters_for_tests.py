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

from hvd_agents.drafters import Draft, DraftContext, DraftOutcome


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

    def observe(self, outcome: DraftOutcome) -> None:
        pass

    def stop(self, req_id: str) -> None:
        self.stopped.append(req_id)


class FixedDrafter:
    """Always proposes the same deterministic tokens (a bad cache draft)."""

    def __init__(self, tokens: Sequence[int], parents: Sequence[int] | None = None) -> None:
        self.tokens = tuple(tokens)
        self.parents = None if parents is None else tuple(parents)

    def start(self, req_id: str, prompt_ids: Sequence[int], structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        if self.parents is not None:  # a tree: all of it (the engine cuts it to k)
            return Draft(self.tokens, source="fixed-tree", parents=self.parents)
        return Draft(self.tokens[:k], source="fixed")

    def observe(self, outcome: DraftOutcome) -> None:
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

    def observe(self, outcome: DraftOutcome) -> None:
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

    def observe(self, outcome: DraftOutcome) -> None:
        pass

    def stop(self, req_id: str) -> None:
        pass


def random_tree(rng: random.Random, size: int, vocab_size: int, plant: Sequence[int] = ()) -> Draft:
    """A random tree draft of at most ``size`` tokens, with ``plant`` (a correct continuation)
    planted as a branch at a random place among noise branches."""
    tokens: list[int] = []
    parents: list[int] = []
    siblings: dict[int, set[int]] = {}

    def add(parent: int, token: int) -> int | None:
        if len(tokens) >= size or token in siblings.setdefault(parent, set()):
            existing = [i for i, (p, t) in enumerate(zip(parents, tokens)) if p == parent and t == token]
            return existing[0] if existing else None
        siblings[parent].add(token)
        tokens.append(token)
        parents.append(parent)
        return len(tokens) - 1

    planted_at = rng.randrange(3)  # plant first, second or last
    for branch in range(3):
        if branch == planted_at and plant:
            node = -1
            for token in plant[: rng.randint(1, len(plant))]:
                node = add(node, token)
                if node is None:
                    break
            continue
        node = rng.choice([-1, *range(len(tokens))])
        for _ in range(rng.randint(1, max(1, size // 2))):
            node = add(node, rng.randrange(vocab_size))
            if node is None:
                break
    return Draft(tuple(tokens), source="tree", parents=tuple(parents))


class TreeDrafter:
    """Proposes random tree drafts, some with the reference continuation planted in a branch.

    With ``uses_hidden_states`` it also keeps the hidden states it was last given,
    so a test can check the engine's buffer against a plain forward.
    """

    def __init__(self, oracle: Sequence[int], vocab_size: int, seed: int, uses_hidden_states: bool = False) -> None:
        self.oracle = list(oracle)
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.uses_hidden_states = uses_hidden_states
        self.last_hidden: torch.Tensor | None = None
        self.last_context: tuple[int, ...] = ()
        self.trees = 0

    def start(self, req_id: str, prompt_ids: Sequence[int], structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        if ctx.hidden_states is not None:
            self.last_hidden = ctx.hidden_states.clone()
            self.last_context = tuple(ctx.token_ids)
        pos = ctx.num_output_tokens
        draft = random_tree(self.rng, k, self.vocab_size, self.oracle[pos : pos + k])
        self.trees += draft.is_tree
        return draft

    def observe(self, outcome: DraftOutcome) -> None:
        assert len(outcome.draft.path(outcome.new_token_ids)) == outcome.num_accepted

    def stop(self, req_id: str) -> None:
        pass
