"""Distillation data for the draft head: the target's own answers and its hidden states.

For each prompt the target writes an answer (greedy for some prompts, sampled
for the rest, so the head sees both the greedy path it must match and nearby
sequences), then one teacher-forced forward over prompt + answer records, at
every position ``i``, the last-layer hidden state ``h_i`` and the target's
greedy next token ``argmax p(. | x_0..x_i)``. Nothing else is needed: the head's
soft targets are the target's LM rows applied to ``h``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hvd_agents.chat import encode_prompt

logger = logging.getLogger(__name__)


@dataclass
class Sample:
    """One distillation sequence.

    Attributes:
        tokens: ``[T]`` prompt + answer ids.
        hidden: ``[T, d]`` the target's last-layer hidden states (fp16 to save memory).
        greedy: ``[T]`` the target's greedy next token after each position.
        answer_start: index of the first answer token (the head is trained on answers).
    """

    tokens: torch.Tensor
    hidden: torch.Tensor
    greedy: torch.Tensor
    answer_start: int

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def generate_samples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    eos_token_ids: Sequence[int],
    *,
    max_new_tokens: int = 160,
    batch_size: int = 16,
    sampled_fraction: float = 0.5,
    temperature: float = 0.7,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[Sample]:
    """The target's answers to ``prompts`` (ending at an ``eos_token_ids`` token or ``max_new_tokens``),
    with hidden states (see the module docstring). Prompts are rendered as the engine renders a
    one-turn chat (:func:`hvd_agents.chat.encode_prompt`)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = set(eos_token_ids)
    rendered = [encode_prompt(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(rendered[i]))
    rng = random.Random(seed)
    samples: list[Sample] = []
    start = time.perf_counter()
    for b in range(0, len(order), batch_size):
        batch = [rendered[i] for i in order[b : b + batch_size]]
        sampled = rng.random() < sampled_fraction
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
        torch.manual_seed(rng.randrange(2**31))
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=sampled,
                temperature=temperature if sampled else None,
                top_p=None,
                top_k=None,
                pad_token_id=pad,
            )
        answers = []
        for row in out[:, width:].tolist():
            answer = []
            for token in row:
                answer.append(token)
                if token in eos:
                    break
            answers.append(answer)
        samples.extend(teacher_forced_samples(model, [p + a for p, a in zip(batch, answers)], [len(p) for p in batch], pad))
        if progress is not None:
            done = min(b + batch_size, len(order))
            tokens = sum(len(s) - s.answer_start for s in samples)
            progress(f"generated {done}/{len(order)} answers, {tokens} answer tokens, {time.perf_counter() - start:.0f} s")
    return samples


def teacher_forced_samples(
    model: PreTrainedModel, sequences: list[list[int]], answer_starts: list[int], pad: int = 0
) -> list[Sample]:
    """One batched teacher-forced forward over ``sequences``: their hidden states and greedy next tokens."""
    device = next(model.parameters()).device
    width = max(len(s) for s in sequences)
    input_ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=device)
    with torch.inference_mode():
        out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
    hidden = out.hidden_states[-1]  # [B, T, d]
    greedy = out.logits.argmax(-1)  # [B, T]
    return [
        Sample(
            torch.tensor(seq),
            hidden[i, : len(seq)].to("cpu", torch.float16).clone(),
            greedy[i, : len(seq)].cpu().clone(),
            start,
        )
        for i, (seq, start) in enumerate(zip(sequences, answer_starts))
    ]


def save_samples(samples: list[Sample], path: str | Path) -> None:
    """Keep generated samples (to train again without regenerating)."""
    torch.save([(s.tokens, s.hidden, s.greedy, s.answer_start) for s in samples], str(path))


def load_samples(path: str | Path) -> list[Sample]:
    return [Sample(*row) for row in torch.load(str(path))]
