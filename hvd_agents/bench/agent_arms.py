"""The arms of ``hvd-agents bench-agents``: one way each of generating an agent's next turn.

Every arm decodes the same prompt token ids (rendered once per call by
:func:`hvd_agents.chat.conversation.prepare`), greedily, with the call's token budget,
the model's stop ids and the call's stop strings, and returns a :class:`CallFigures`:

* :class:`EngineArm`: the engine with one decoding method, on a fresh engine per
  conversation (fresh cache store, fresh prefix cache: a new agent process) over the
  shared loaded model; with or without prefix KV reuse. The call is rendered through
  ``prepare`` on the arm's engine, which registers its structure as every front end
  does. Its drafter is wrapped in :class:`~hvd_agents.bench.timed.TimedDrafter`, which times ``propose`` (drafting
  and the policy's decision) and ``observe`` (index update and online learning) and
  collects each step's accepted length.
* :class:`HFArm`: ``model.generate`` of transformers on the same model, no reuse (what a
  ``ChatHuggingFace`` user runs), optionally with ``prompt_lookup_num_tokens``.
* :class:`LlamaCppArm`: llama.cpp through llama-cpp-python
  (:mod:`hvd_agents.bench.llama_cpp`) on the model's GGUF file, one instance kept over a
  conversation's calls, reusing the KV of the longest common prefix with what it holds
  (what an Ollama user gets).

Stop strings end a decode after the token that completes one, as the engine's stop
matcher does (:class:`StopRule`); an arm that overshoots (HF's prompt lookup verifies
several tokens a step) has its tokens cut at the same point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hvd_agents.bench.llama_cpp import LlamaCppPeer
from hvd_agents.bench.timed import TimedDrafter
from hvd_agents.chat.conversation import prepare
from hvd_agents.drafters import Drafter
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.engine.engine import DEFAULT_PREFIX_CACHE_BYTES
from hvd_agents.errors import HVDError


@dataclass(frozen=True)
class ReplayCall:
    """One model call to replay: the recorded request and its prompt ids (from ``prepare``)."""

    conversation: str
    index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    session_id: str | None
    assistant_prefix: str
    stop: tuple[str, ...]
    max_new_tokens: int
    prompt_ids: tuple[int, ...]


@dataclass
class CallFigures:
    """What one arm's replay of one call took and produced.

    ``latency_s`` is the whole call (rendering included for the engine arms); ``prefill_s``
    the prompt's prefill (for HF: up to its first new token); ``decode_s`` the rest.
    ``steps`` are the target's decoding forwards; ``propose_s`` / ``observe_s`` /
    ``verify_s`` add up the engine's drafter calls and verification forwards over them;
    ``model_draft_s`` the model drafter's share of ``propose_s`` (``hvd``).
    """

    arm: str
    conversation: str
    index: int
    prompt_tokens: int
    token_ids: tuple[int, ...]
    latency_s: float
    prefill_s: float
    decode_s: float
    prepare_s: float = 0.0
    reused_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    propose_s: float = 0.0
    observe_s: float = 0.0
    verify_s: float = 0.0
    model_draft_s: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list)  # per step with a draft
    drafts_known: bool = True  # False: the arm does not report drafted tokens (HF prompt lookup)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


class StopRule:
    """When a greedy decode ends: a stop id, or the first token whose text completes a stop string.

    The text is the generated tokens' ``decode`` with special tokens skipped and no
    clean-up, as the engine's detokenizer gives it.
    """

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int], stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(stop_ids)
        self.stop = tuple(stop)

    def done(self, tokens: Sequence[int]) -> bool:
        if not tokens:
            return False
        if tokens[-1] in self.stop_ids:
            return True
        if not self.stop:
            return False
        text = self.tokenizer.decode(list(tokens), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return any(s in text for s in self.stop)

    def cut(self, tokens: Sequence[int], budget: int) -> tuple[int, ...]:
        """``tokens`` up to where a decode that checks after every token would have ended."""
        tokens = list(tokens[:budget])
        for n in range(1, len(tokens) + 1):
            if tokens[n - 1] in self.stop_ids or (self.stop and self.done(tokens[:n])):
                return tuple(tokens[:n])
        return tuple(tokens)


def budget_of(call: ReplayCall, context_window: int) -> int:
    """The engine's token budget for a call: its max_new_tokens, within the context window."""
    return min(call.max_new_tokens, context_window - len(call.prompt_ids))


# ------------------------------------------------------------------ engine arms


class EngineArm:
    """The engine with one method, a fresh engine per conversation; ``reuse``: prefix KV reuse on.

    Args:
        name: the arm's name.
        base: the loaded engine whose model, tokenizer, cost model and draft head are shared.
        method: the decoding method.
        reuse: keep and reuse prefix KV across the conversation's calls.
        drafter: a factory of the drafter (None: the engine's own for ``method``).
    """

    kind = "engine"

    def __init__(self, name: str, base: Engine, method: str, reuse: bool,
                 drafter: Callable[[], Drafter] | None = None) -> None:
        self.name, self.base, self.method, self.reuse, self.make_drafter = name, base, method, reuse, drafter
        self.engine: Engine | None = None
        self.timed: TimedDrafter | None = None

    def start(self) -> None:
        base = self.base
        self.engine = base.sibling(prefix_cache_bytes=DEFAULT_PREFIX_CACHE_BYTES if self.reuse else 0,
                                   draft_model=base.draft_model, draft_head=base.draft_head)
        inner = self.make_drafter() if self.make_drafter is not None else self.engine.drafter(self.method)
        self.timed = TimedDrafter(inner)
        self.engine.add_drafter(self.method, self.timed)

    def run(self, call: ReplayCall) -> CallFigures:
        engine, timed = self.engine, self.timed
        if engine is None or timed is None:
            raise HVDError(f"arm {self.name}: start() a conversation first")
        timed.reset()
        begun = time.perf_counter()
        structure = prepare(engine, call.messages, call.tools, session_id=call.session_id,
                            assistant_prefix=call.assistant_prefix)
        prepared = time.perf_counter()
        if tuple(structure.prompt_ids) != call.prompt_ids:
            raise HVDError(f"arm {self.name}: call {call.conversation}#{call.index} renders another prompt")
        params = GenerationParams(max_new_tokens=call.max_new_tokens, method=self.method, stop=call.stop,
                                  reuse_prefix=self.reuse)
        result = engine.generate(structure.prompt_ids, params, structure=structure)
        latency = time.perf_counter() - begun
        stats = result.stats
        return CallFigures(self.name, call.conversation, call.index, stats.prompt_tokens, result.token_ids, latency,
                           stats.prefill_s, stats.decode_s, prepared - begun, stats.reused_prefix_tokens, stats.steps,
                           stats.drafted_tokens, stats.accepted_tokens, timed.propose_s, timed.observe_s,
                           timed.verify_s, timed.model_draft_s, list(timed.accepted_lengths))


# ------------------------------------------------------------------ HF generate


class FirstTokenClock:
    """A stopping criterion that notes when the first new token is out and applies a :class:`StopRule`."""

    def __init__(self, prompt_len: int, rule: StopRule) -> None:
        self.prompt_len, self.rule = prompt_len, rule
        self.first: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        del scores, kwargs
        if self.first is None:
            self.first = time.perf_counter()
        done = self.rule.done(input_ids[0, self.prompt_len:].tolist())
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class HFArm:
    """transformers' ``generate`` on the shared model, greedy, the whole prompt each call (no reuse).

    ``prompt_lookup``: ``prompt_lookup_num_tokens`` (HF's prompt-lookup decoding), else plain.
    Steps are counted as the model's forwards (one per new token for plain ``generate``).
    """

    kind = "hf"

    def __init__(self, name: str, base: Engine, prompt_lookup: int | None = None) -> None:
        self.name, self.base, self.prompt_lookup = name, base, prompt_lookup

    def start(self) -> None:
        pass

    def run(self, call: ReplayCall) -> CallFigures:
        from transformers import StoppingCriteriaList

        base = self.base
        budget = budget_of(call, base.context_window)
        rule = StopRule(base.tokenizer, base.eos_token_ids, call.stop)
        clock = FirstTokenClock(len(call.prompt_ids), rule)
        forwards = [0]
        hook = base.model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        extra = {"prompt_lookup_num_tokens": self.prompt_lookup} if self.prompt_lookup else {}
        eos = list(base.eos_token_ids)
        try:
            begun = time.perf_counter()
            ids = torch.tensor([call.prompt_ids], device=base.device)  # [1, n]
            with torch.inference_mode():
                out = base.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                                          do_sample=False, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0,
                                          stopping_criteria=StoppingCriteriaList([clock]), **extra)
            end = time.perf_counter()
        finally:
            hook.remove()
        tokens = rule.cut(out[0, len(call.prompt_ids):].tolist(), budget)
        first = clock.first if clock.first is not None else end
        steps = forwards[0]
        accepted = max(len(tokens) - steps, 0) if self.prompt_lookup else 0
        return CallFigures(self.name, call.conversation, call.index, len(call.prompt_ids), tokens, end - begun,
                           first - begun, end - first, steps=steps, accepted=accepted,
                           drafts_known=not self.prompt_lookup)


# ------------------------------------------------------------------ llama.cpp


class LlamaCppArm:
    """llama.cpp (llama-cpp-python) with its prefix reuse: one instance, reset at each conversation's start."""

    kind = "llama.cpp"

    def __init__(self, name: str, base: Engine, peer: LlamaCppPeer) -> None:
        self.name, self.base, self.peer = name, base, peer

    def start(self) -> None:
        self.peer.llm.reset()

    def run(self, call: ReplayCall) -> CallFigures:
        base = self.base
        rule = StopRule(base.tokenizer, base.eos_token_ids, call.stop)
        begun = time.perf_counter()
        result = self.peer.generate_reusing(call.prompt_ids, budget_of(call, base.context_window),
                                            frozenset(base.eos_token_ids), until=rule.done if call.stop else None)
        latency = time.perf_counter() - begun
        return CallFigures(self.name, call.conversation, call.index, len(call.prompt_ids), result.token_ids, latency,
                           result.prefill_s, result.decode_s, reused_tokens=result.reused_tokens,
                           steps=len(result.token_ids))
