"""Draft-head acceptance (``hvd-agents bench-head``): how often a head's drafts are accepted, per prompt kind.

For every held-out prompt (:func:`hvd_agents.bench.prompts.held_out_prompts`:
chat, code, JSON and tool-calling turns) the engine decodes greedily with each
head drafting a chain of ``k`` tokens at every step, ungated (no confidence stop, no
alternative first tokens), so every
draft starts from the target's own greedy context: the figures are the head's
agreement with the target along the target's greedy path, measured on the path
the engine runs (the forward's own hidden states, the head's CPU kernel where
the engine uses it). Per head and kind: drafts, first-token acceptance
(``acc@1``), ``acc@p`` (the p-th token accepted given the p-1 before it were),
per-token acceptance (accepted / drafted) and accepted tokens per draft; and
whether every output equals ``ar``'s (it must: the target verifies every token).

Beside the drafts, the head is run teacher-forced along the same greedy answer (one forward of the
engine's runner gives every position's hidden state and greedy token, as the training data are
made): ``forced@1`` is its first-token agreement with the target over every answer position, and
``after miss`` over the positions whose previous prediction was wrong. Drafts start where the last
draft was rejected, mostly just such positions, so ``acc@1`` is near ``after miss``, below
``forced@1``; and ``forced@1`` against the training data's held-out figure is the gap between the
training prompts and these.

Heads are compared in one run on one engine: the one shipped for the model and
any head files given (``--head``), e.g. a head before and after retraining.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hvd_agents.bench.head_files import head_files, tapped
from hvd_agents.bench.prompts import held_out_prompts
from hvd_agents.chat.render import encode_prompt
from hvd_agents.distill.data import Sample
from hvd_agents.distill.engine_data import record as teacher_forced
from hvd_agents.draft_head import DraftHead, HeadCache
from hvd_agents.drafters.model.head import DraftHeadDrafter
from hvd_agents.engine import GenerationParams
from hvd_agents.engine.shared import shared_engine
from hvd_agents.errors import HVDError


@dataclass
class Acceptance:
    """Tallies of one head's drafts on one kind of prompt."""

    k: int
    prompts: int = 0
    same: int = 0
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: list[int] = field(default_factory=list)  # [p]: drafts with at least p + 1 tokens accepted
    offered: list[int] = field(default_factory=list)  # [p]: drafts with a (p + 1)-th token and p accepted
    forced: list[int] = field(default_factory=lambda: [0, 0])  # teacher-forced first tokens: [agreed, positions]
    after_miss: list[int] = field(default_factory=lambda: [0, 0])  # those after a wrong prediction

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * self.k
        self.offered = self.offered or [0] * self.k

    def add(self, drafted: int, accepted: int) -> None:
        """Count one draft of ``drafted`` tokens of which the first ``accepted`` were accepted."""
        self.drafts += 1
        self.drafted += drafted
        self.accepted += accepted
        for p in range(min(drafted, self.k)):
            if accepted >= p:
                self.offered[p] += 1
            if accepted >= p + 1:
                self.reached[p] += 1

    def add_forced(self, agreed: Sequence[bool]) -> None:
        """Count one answer's teacher-forced first-token agreement, position by position."""
        for i, hit in enumerate(agreed):
            self.forced[0] += hit
            self.forced[1] += 1
            if i and not agreed[i - 1]:
                self.after_miss[0] += hit
                self.after_miss[1] += 1

    def merge(self, other: Acceptance) -> None:
        for name in ("prompts", "same", "drafts", "drafted", "accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("reached", "offered", "forced", "after_miss"):
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name))])

    def rate(self, p: int) -> float:
        """``acc@p`` (1-based): the p-th draft token accepted given the p-1 before it were."""
        return self.reached[p - 1] / self.offered[p - 1] if self.offered[p - 1] else 0.0

    @property
    def forced_rate(self) -> float:
        return self.forced[0] / self.forced[1] if self.forced[1] else 0.0

    @property
    def after_miss_rate(self) -> float:
        return self.after_miss[0] / self.after_miss[1] if self.after_miss[1] else 0.0

    @property
    def per_token(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_draft(self) -> float:
        return self.accepted / self.drafts if self.drafts else 0.0


@torch.inference_mode()
def forced_agreement(head: DraftHead, sample: Sample) -> list[bool]:
    """Whether the head's first token agrees with the target's greedy one at each answer position, teacher-forced:
    the head ingests the prompt, then at each answer index ``t`` reads the target's hidden state there and the
    next token, and its prediction is compared with the target's greedy token after that token."""
    tokens, greedy, start = sample.tokens, sample.greedy, sample.answer_start
    hidden = sample.features(head.config.taps).to(head.fc.weight.dtype)
    if start < 2 or len(tokens) - start < 1:
        return []
    cache = HeadCache()
    head.step(hidden[: start - 1], tokens[1:start], list(range(start - 1)), cache)
    agreed = []
    for t in range(start - 1, len(tokens) - 1):  # the answer's tokens after its first (which the prefill gives)
        _, logits = head.step(hidden[t : t + 1], tokens[t + 1 : t + 2], [t], cache)
        agreed.append(int(head.draft_vocab[int(logits.argmax())]) == int(greedy[t + 1]))
    return agreed


def _heads(engine, paths: Sequence[str | Path], shipped: bool) -> dict[str, DraftHead]:
    heads: dict[str, DraftHead] = {}
    if shipped and engine.draft_head is not None:
        heads["shipped"] = engine.draft_head
    heads.update(head_files(engine, paths))
    if not heads:
        raise HVDError("no head to measure: this model has no shipped head; give one with --head")
    return heads


def run_head_benchmark(
    model: str | None = None,
    heads: Sequence[str | Path] = (),
    *,
    shipped: bool = True,
    k: int = 4,
    max_new_tokens: int = 96,
) -> dict[str, dict[str, Acceptance]]:
    """Measure each head (see the module docstring), print the table, return tallies by head and kind."""
    if k < 1 or max_new_tokens < 1:
        raise HVDError(f"k and max_new_tokens must be positive, got {k} and {max_new_tokens}")
    engine = shared_engine(model)
    measured = _heads(engine, heads, shipped)
    methods = {}
    for i, (label, head) in enumerate(measured.items()):
        methods[label] = f"bench-head-{i}"
        engine.add_drafter(methods[label], DraftHeadDrafter(head, min_survival=0.0, alternatives=0))
    by_kind = held_out_prompts()
    tallies = {label: {kind: Acceptance(k) for kind in by_kind} for label in measured}
    # heads may fuse different layers: the runner taps them all for the teacher-forced rows (each head reads its
    # own), and each head's for its drafts
    every_tap = tuple(sorted({layer for head in measured.values() for layer in head.config.taps}))
    for kind, prompts in by_kind.items():
        for prompt in prompts:
            ids = encode_prompt(engine.tokenizer, prompt.messages, prompt.tools or None)
            reference = engine.generate(ids, GenerationParams(max_new_tokens=max_new_tokens, method="ar",
                                                              reuse_prefix=False)).token_ids
            with tapped(engine, every_tap):
                forced = teacher_forced(engine, ids, reference, kind)
            for label, method in methods.items():
                params = GenerationParams(max_new_tokens=max_new_tokens, method=method, num_draft_tokens=k,
                                          reuse_prefix=False, record_steps=True)
                with tapped(engine, measured[label].config.taps):
                    result = engine.generate(ids, params)
                tally = tallies[label][kind]
                tally.prompts += 1
                tally.add_forced(forced_agreement(measured[label], forced))
                tally.same += result.token_ids == reference
                for record in result.stats.step_records or []:
                    if record.source == DraftHeadDrafter.source and record.drafted:
                        tally.add(record.drafted, record.accepted)
    _print(tallies, k, max_new_tokens)
    return tallies


def _print(tallies: dict[str, dict[str, Acceptance]], k: int, max_new_tokens: int) -> None:
    print(f"draft-head acceptance on held-out prompts: greedy, {k}-token drafts at every step (ungated), "
          f"max_new_tokens={max_new_tokens}")
    print(f"{'head':<24}{'kind':<7}{'prompts':>8}{'drafts':>8}" + "".join(f"{f'acc@{p}':>8}" for p in range(1, k + 1))
          + f"{'per token':>11}{'per draft':>11}{'forced@1':>10}{'after miss':>12}{'same as ar':>12}")
    for label, by_kind in tallies.items():
        total = Acceptance(k)
        for tally in by_kind.values():
            total.merge(tally)
        for kind, tally in [*by_kind.items(), ("all", total)]:
            print(f"{label:<24}{kind:<7}{tally.prompts:>8}{tally.drafts:>8}"
                  + "".join(f"{tally.rate(p):>8.3f}" for p in range(1, k + 1))
                  + f"{tally.per_token:>11.3f}{tally.per_draft:>11.2f}{tally.forced_rate:>10.3f}"
                  + f"{tally.after_miss_rate:>12.3f}{f'{tally.same}/{tally.prompts}':>12}")
    print("forced@1: the head's first token teacher-forced at every position of ar's answer (the target's own hidden "
          "states); after miss: at the positions after one it got wrong, where drafts mostly start")
