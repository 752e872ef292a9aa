"""Distillation data from the engine's own forward: what the head sees when it drafts.

The head drafts from the hidden states of the forward the engine runs (the
native CPU forward over a GGUF file's blocks, or whichever runner the engine
chose) and is judged against that forward's greedy tokens. This module makes its
training data from the same forward:

1. **Answers**: the engine decodes each prompt (method ``ar``; greedy for some
   prompts, sampled for the rest, each sampled answer from its own seed), with up
   to ``concurrency`` requests decoded together (the engine batches them: one
   forward per step reads the weights once for all of them; 418 tokens/s at 16
   requests against 54 for the float model's ``generate`` of 16 on 2 cores).
2. **Hidden states and greedy tokens**: one teacher-forced forward of the runner
   over prompt + answer gives every position's last-layer hidden state (and the
   inputs of the layers the runner taps, ``set_hidden_taps``) and the argmax of
   its logits (the runner's forward is bitwise invariant to chunking, so these are
   the rows decoding computed).

Same :class:`~hvd_agents.distill.data.Sample` as the float model's data
(:func:`~hvd_agents.distill.data.generate_samples`); answers keep their
end-of-turn token, and an answer cut at ``max_new_tokens`` keeps its last token
(the teacher-forced forward knows its hidden state).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from hvd_agents.chat.render import encode_prompt
from hvd_agents.distill.data import Sample, claim_parts, load_samples, prompts_digest, save_samples
from hvd_agents.distill.prompts import TrainingPrompt
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.runtime.cpu.threads import step_threads

PART_PROMPTS = 256  # prompts per saved part (what an interrupted run loses at most)


def engine_samples(
    engine: Engine,
    prompts: Sequence[str | TrainingPrompt],
    *,
    max_new_tokens: int = 160,
    sampled_fraction: float = 0.5,
    temperature: float = 0.7,
    seed: int = 0,
    concurrency: int = 32,
    progress: Callable[[str], None] | None = None,
    parts: str | Path | None = None,
) -> list[Sample]:
    """The engine's answers to ``prompts`` with its forward's hidden states and greedy tokens
    (see the module docstring). ``concurrency`` requests are decoded at a time (give ``engine`` a
    ``max_batch`` of as many, so that they share its forwards).

    With ``parts`` (a directory), every :data:`PART_PROMPTS` prompts' samples are saved there as
    they are made and a part already saved is loaded instead, so an interrupted run resumes
    (each prompt's greedy-or-sampled draw and seed are made up front, the same either way).

    Raises:
        ValueError: ``parts`` holds parts made from other prompts or settings.
    """
    prompts = [TrainingPrompt("chat", ({"role": "user", "content": p},)) if isinstance(p, str) else p
               for p in prompts]
    rendered = [encode_prompt(engine.tokenizer, list(p.messages), list(p.tools) or None) for p in prompts]
    rng = random.Random(seed)
    plans = [(rng.random() < sampled_fraction, rng.randrange(2**31)) for _ in prompts]
    if parts is not None:
        taps = tuple(getattr(engine.runner, "hidden_taps", ()))
        claim_parts(Path(parts), {
            "source": "engine", "prompts": prompts_digest(rendered), "max_new_tokens": max_new_tokens,
            "sampled_fraction": sampled_fraction, "temperature": temperature, "seed": seed,
            **({"taps": list(taps)} if taps else {}),
        })
    samples: list[Sample] = []
    start = time.perf_counter()
    for first in range(0, len(prompts), PART_PROMPTS):
        part = None if parts is None else Path(parts) / f"part-{first:06d}.pt"
        if part is not None and part.is_file():
            samples.extend(load_samples(part))
            continue
        chunk = range(first, min(first + PART_PROMPTS, len(prompts)))
        params = [GenerationParams(max_new_tokens=max_new_tokens, method="ar", reuse_prefix=False,
                                   temperature=temperature if plans[i][0] else 0.0, seed=plans[i][1])
                  for i in chunk]
        answers = _decode(engine, [rendered[i] for i in chunk], params, concurrency)
        made = [record(engine, rendered[i], answer, prompts[i].kind) for i, answer in zip(chunk, answers)]
        if part is not None:
            save_samples(made, part)
        samples.extend(made)
        if progress is not None:
            tokens = sum(len(s) - s.answer_start for s in samples)
            progress(f"engine answered {chunk.stop}/{len(prompts)} prompts, {tokens} answer tokens, "
                     f"{time.perf_counter() - start:.0f} s")
    return samples


def _decode(engine: Engine, prompts: list[list[int]], params: list[GenerationParams],
            concurrency: int) -> list[tuple[int, ...]]:
    """Each prompt's answer, ``concurrency`` requests at once (longest prompts first, so the batch stays
    full to the end)."""
    width = max(1, concurrency)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    with ThreadPoolExecutor(width) as pool:
        results = list(pool.map(lambda i: engine.generate(prompts[i], params[i]).token_ids, order))
    answers: list[tuple[int, ...]] = [()] * len(prompts)
    for i, tokens in zip(order, results):
        answers[i] = tuple(tokens)
    return answers


def record(engine: Engine, prompt: Sequence[int], answer: Sequence[int], kind: str = "chat") -> Sample:
    """The sample of ``prompt + answer``: one teacher-forced forward of the engine's runner (its hidden
    states and the argmax of its logits at every position)."""
    runner = engine.runner
    tokens = list(prompt) + list(answer)
    kv = runner.new_kv()
    rows: list[torch.Tensor] = []
    try:
        with torch.inference_mode(), step_threads(runner):
            logits = runner.forward(kv, tokens, hidden=rows)
    finally:
        kv.release()
    hidden = torch.cat(rows) if rows else torch.empty(0)
    if hidden.shape[0] != len(tokens):
        raise RuntimeError(f"the runner gave {hidden.shape[0]} hidden states for {len(tokens)} tokens")
    taps = tuple(getattr(runner, "hidden_taps", ()))
    if hidden.shape[1] != engine.model.config.hidden_size * (1 + len(taps)):
        raise RuntimeError(f"the runner gave hidden rows {hidden.shape[1]} wide for layers {taps} tapped")
    return Sample(torch.tensor(tokens), hidden.to("cpu", torch.float16).clone(), logits.argmax(-1).cpu(),
                  len(prompt), kind, taps)
