"""Distillation data for the draft head: the target's own answers and its hidden states.

For each prompt the target writes an answer (greedy for some prompts, sampled
for the rest, so the head sees both the greedy path it must match and nearby
sequences). The hidden states ``generate`` computes on the way give, at every
position ``i`` of prompt + answer, the last-layer hidden state ``h_i`` and the
target's greedy next token ``argmax p(. | x_0..x_i)`` (its LM head on ``h_i``);
:func:`teacher_forced_samples` records the same from one forward over given
sequences. Nothing else is needed: the head's
soft targets are the target's LM rows applied to ``h``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hvd_agents.chat.render import encode_prompt
from hvd_agents.distill.prompts import TrainingPrompt

logger = logging.getLogger(__name__)


@dataclass
class Sample:
    """One distillation sequence.

    Attributes:
        tokens: ``[T]`` prompt + answer ids.
        hidden: ``[T, d]`` the target's last-layer hidden states (fp16 to save memory); with ``taps``,
            ``[T, (1 + len(taps)) * d]``: each tapped layer's input beside them (what a head fusing them reads).
        taps: the target layers whose inputs ``hidden`` carries after the last-layer states.
        greedy: ``[T]`` the target's greedy next token after each position.
        answer_start: index of the first answer token (the head is trained on answers).
        kind: the prompt's kind (:data:`hvd_agents.distill.prompts.KINDS`), for figures per kind.
    """

    tokens: torch.Tensor
    hidden: torch.Tensor
    greedy: torch.Tensor
    answer_start: int
    kind: str = "chat"
    taps: tuple[int, ...] = ()

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def features(self, taps: Sequence[int]) -> torch.Tensor:
        """``[T, (1 + len(taps)) * d]``: the last-layer states and the inputs of ``taps``, in that order.

        Raises:
            ValueError: the sample was recorded without one of ``taps``.
        """
        missing = [layer for layer in taps if layer not in self.taps]
        if missing:
            raise ValueError(f"the data hold the inputs of layers {self.taps}, not {tuple(missing)}: make them "
                             "again with the head's taps")
        d = self.hidden.shape[1] // (1 + len(self.taps))
        if not taps and not self.taps:
            return self.hidden
        blocks = [0, *(1 + self.taps.index(layer) for layer in taps)]
        return torch.cat([self.hidden[:, b * d : (b + 1) * d] for b in blocks], dim=1)


def generate_samples(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | TrainingPrompt],
    eos_token_ids: Sequence[int],
    *,
    max_new_tokens: int = 160,
    batch_size: int = 16,
    sampled_fraction: float = 0.5,
    temperature: float = 0.7,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    parts: str | Path | None = None,
) -> list[Sample]:
    """The target's answers to ``prompts`` (ending at an ``eos_token_ids`` token or ``max_new_tokens``),
    with hidden states (see the module docstring). Prompts are rendered as the engine renders a
    chat (:func:`hvd_agents.chat.encode_prompt`): a string as one user turn, a
    :class:`~hvd_agents.distill.prompts.TrainingPrompt` with its messages and tools.

    With ``parts`` (a directory), each batch's samples are saved there as they are made and a batch
    already saved is loaded instead of generated, so an interrupted run resumes where it stopped
    (the random draws of every batch are made in the same order either way).

    Raises:
        ValueError: ``parts`` holds batches made from other prompts or settings.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = set(eos_token_ids)
    prompts = [TrainingPrompt("chat", ({"role": "user", "content": p},)) if isinstance(p, str) else p
               for p in prompts]
    rendered = [encode_prompt(tokenizer, list(p.messages), list(p.tools) or None) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(rendered[i]))
    rng = random.Random(seed)
    samples: list[Sample] = []
    start = time.perf_counter()
    if parts is not None:
        claim_parts(Path(parts), {
            "prompts": prompts_digest([rendered[i] for i in order]),
            "batch_size": batch_size, "max_new_tokens": max_new_tokens, "sampled_fraction": sampled_fraction,
            "temperature": temperature, "seed": seed,
        })
    for b in range(0, len(order), batch_size):
        batch = [rendered[i] for i in order[b : b + batch_size]]
        sampled = rng.random() < sampled_fraction
        batch_seed = rng.randrange(2**31)
        part = None if parts is None else Path(parts) / f"batch-{b:06d}.pt"
        if part is not None and part.is_file():
            samples.extend(load_samples(part))
            continue
        torch.manual_seed(batch_seed)
        made = answer_samples(model, batch, eos, pad, max_new_tokens=max_new_tokens,
                              temperature=temperature if sampled else 0.0)
        for sample, i in zip(made, order[b : b + batch_size]):
            sample.kind = prompts[i].kind
        if part is not None:
            save_samples(made, part)
        samples.extend(made)
        if progress is not None:
            done = min(b + batch_size, len(order))
            tokens = sum(len(s) - s.answer_start for s in samples)
            progress(f"generated {done}/{len(order)} answers, {tokens} answer tokens, {time.perf_counter() - start:.0f} s")
    return samples


def prompts_digest(rendered: Sequence[Sequence[int]]) -> str:
    """A short digest of tokenized prompts: a part directory is refused when made from other prompts."""
    return hashlib.sha256(json.dumps([list(ids) for ids in rendered]).encode()).hexdigest()[:16]


def claim_parts(parts: Path, settings: dict) -> None:
    """Make ``parts`` the batch directory of a run with ``settings``, or check that it already is."""
    manifest = parts / "settings.json"
    if manifest.is_file():
        saved = json.loads(manifest.read_text())
        differ = sorted(key for key in settings.keys() | saved.keys() if settings.get(key) != saved.get(key))
        if differ:
            raise ValueError(f"{parts} holds batches made with other {', '.join(differ)}: "
                             "remove it, or give another data file")
        return
    parts.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(settings, sort_keys=True))


def answer_samples(
    model: PreTrainedModel,
    prompts: list[list[int]],
    eos: set[int],
    pad: int,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
) -> list[Sample]:
    """The target's answers to a batch of tokenized ``prompts`` (greedy, or sampled at ``temperature``
    from the global torch RNG), with the hidden states ``generate`` computed on the way.

    Prompts are left-padded. Each step's last-layer output is kept (``[B, width, d]`` for the
    prompts, then ``[B, 1, d]`` per token fed back). The last generated token is never fed back,
    so an answer cut at ``max_new_tokens`` loses that token (its hidden state is unknown); an answer
    ending at an EOS token keeps it. The greedy next tokens are the target's LM head applied to
    those hidden states: no second forward over the sequences.
    """
    device = next(model.parameters()).device
    width = max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0.0,
            temperature=temperature if temperature > 0.0 else None,
            top_p=None,
            top_k=None,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_hidden_states=True,
        )
        hidden = torch.cat([step[-1] for step in out.hidden_states], dim=1)  # [B, width + fed, d]
        fed = len(out.hidden_states) - 1  # generated tokens fed back: their hidden states exist
        lm_head = model.get_output_embeddings()
        samples = []
        for i, (prompt, row) in enumerate(zip(prompts, out.sequences[:, width:].tolist())):
            answer: list[int] = []
            for token in row[:fed]:
                answer.append(token)
                if token in eos:
                    break
            h = hidden[i, width - len(prompt) : width + len(answer)]  # [len(prompt) + len(answer), d]
            greedy = torch.cat([lm_head(chunk).argmax(-1) for chunk in h.split(512)])
            samples.append(Sample(torch.tensor(prompt + answer), h.to("cpu", torch.float16).clone(), greedy.cpu(),
                                  len(prompt)))
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
    """Keep generated samples (to train again without regenerating). The file appears whole or not at
    all: a run stopped while saving leaves no truncated file for a later run to load."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save([(s.tokens, s.hidden, s.greedy, s.answer_start, s.kind, s.taps) for s in samples], str(partial))
    os.replace(partial, path)


def load_samples(path: str | Path) -> list[Sample]:
    # rows of older files lack the taps (and before them the kind): they were recorded without either
    return [Sample(*row[:4], *row[4:5], taps=tuple(row[5]) if len(row) > 5 else ()) for row in torch.load(str(path))]
