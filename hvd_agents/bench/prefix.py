"""Prefix-reuse benchmark: an agent conversation with and without prefix KV reuse, same run.

Agent mode (default): the session of :mod:`hvd_agents.bench.agent_session` (first
prompt about 3K tokens) runs for ``turns`` turns in three arms, each on its own
engine over the SAME loaded model (fresh cache store, fresh prefix cache):

* ``ar``: no prefix reuse, plain autoregressive decoding (what an agent gets from a
  backend that recomputes the prompt every call);
* ``ar+reuse``: prefix reuse, plain decoding (isolates the prefill saving);
* ``hvd+reuse``: prefix reuse and hvd decoding (the default method).

Each arm's conversation is built from its own replies (the model's text is sent back
as the assistant message, followed by the agent's next tool call and its output);
greedy decoding is lossless, so the three conversations must be identical, which is
checked. Turns are interleaved across arms so all see the same machine state. Every
prompt goes through :func:`hvd_agents.chat.conversation.prepare`, the real chat path.
Printed per turn: prompt tokens, reused tokens, prefill seconds and turn latency per
arm; then the prefill cut over turns 2..N and the end-to-end speedup.

Memory mode (``memory_turns``): a long loop of short turns over interleaved
conversations, printing the prefix cache's peak bytes against its budget.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from hvd_agents.bench.agent_session import agent_tools, first_messages, tool_exchange
from hvd_agents.bench.digest import output_digest
from hvd_agents.chat.conversation import prepare
from hvd_agents.drafters import CacheStore
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.engine.engine import DEFAULT_PREFIX_CACHE_BYTES
from hvd_agents.engine.shared import shared_engine

logger = logging.getLogger(__name__)
ARMS = (("ar", "ar", False), ("ar+reuse", "ar", True), ("hvd+reuse", "hvd", True))


@dataclass
class TurnFigures:
    """One turn of one arm."""

    prompt_tokens: int
    reused_tokens: int
    prefill_s: float
    latency_s: float
    token_ids: tuple[int, ...]


@dataclass
class Arm:
    """One configuration: its engine, conversation and per-turn figures."""

    name: str
    engine: Engine
    params: GenerationParams
    messages: list[dict]
    turns: list[TurnFigures] = field(default_factory=list)

    def run_turn(self, turn: int, tools: list[dict]) -> None:
        """One agent call: render + decode, then append the reply and the next tool exchange."""
        start = time.perf_counter()
        structure = prepare(self.engine, self.messages, tools, session_id=f"bench-{self.name}")
        result = self.engine.generate(structure.prompt_ids, self.params, structure=structure)
        latency = time.perf_counter() - start
        stats = result.stats
        self.turns.append(TurnFigures(stats.prompt_tokens, stats.reused_prefix_tokens, stats.prefill_s, latency,
                                      result.token_ids))
        if stats.prefix_break_at is not None:
            logger.warning("%s turn %d: prefix break at token %d", self.name, turn + 1, stats.prefix_break_at)
        self.messages += tool_exchange(turn, result.text)


def _fresh_engine(base: Engine, budget: int) -> Engine:
    return Engine(base.model, base.tokenizer, eos_token_ids=base.eos_token_ids, context_window=base.context_window,
                  cache_store=CacheStore(), cost_model=base.cost_model(), prefix_cache_bytes=budget)


def run_prefix_benchmark(
    model: str | None = None, device: str | None = None, turns: int = 6, max_new_tokens: int = 48,
    budget_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
) -> list[Arm]:
    """Run the agent-mode benchmark, print its table and return the arms."""
    base = shared_engine(model, device=device)
    tools = agent_tools()
    arms = [Arm(name, _fresh_engine(base, budget_bytes if reuse else 0),
                GenerationParams(max_new_tokens=max_new_tokens, method=method), first_messages())
            for name, method, reuse in ARMS]
    base.generate(base.tokenizer("warm up the kernels").input_ids, GenerationParams(max_new_tokens=4, method="ar",
                                                                                      reuse_prefix=False))
    for turn in range(turns):
        for arm in arms if turn % 2 == 0 else reversed(arms):
            logger.info("turn %d, arm %s", turn + 1, arm.name)
            arm.run_turn(turn, tools)
    _print_agent_table(arms, max_new_tokens, base)
    return arms


def _print_agent_table(arms: list[Arm], max_new_tokens: int, engine: Engine) -> None:
    plain, reuse, hvd = arms
    print(f"{len(plain.turns)}-turn agent conversation, greedy, max_new_tokens={max_new_tokens}, "
          f"device={engine.device}, prefix budget {reuse.engine.prefix_cache.budget_bytes / 2**20:.0f} MiB")
    print(f"{'turn':>4}{'prompt':>8}{'reused':>8} | {'prefill s: ar':>14}{'ar+reuse':>10}{'hvd+reuse':>11} | "
          f"{'turn s: ar':>11}{'ar+reuse':>10}{'hvd+reuse':>11} | same tokens")
    for i, (a, b, c) in enumerate(zip(plain.turns, reuse.turns, hvd.turns)):
        same = a.token_ids == b.token_ids == c.token_ids
        print(f"{i + 1:>4}{a.prompt_tokens:>8}{b.reused_tokens:>8} | {a.prefill_s:>14.2f}{b.prefill_s:>10.2f}"
              f"{c.prefill_s:>11.2f} | {a.latency_s:>11.2f}{b.latency_s:>10.2f}{c.latency_s:>11.2f} | {same}")

    def total(arm: Arm, what: str, first: int = 0) -> float:
        return sum(getattr(t, what) for t in arm.turns[first:])

    for arm in (reuse, hvd):
        cut = 1 - total(arm, "prefill_s", 1) / total(plain, "prefill_s", 1)
        print(f"prefill time of turns 2..{len(plain.turns)}, {arm.name} vs ar: cut by {cut:.1%}")
    print(f"end-to-end agent latency: ar {total(plain, 'latency_s'):.1f} s, ar+reuse {total(reuse, 'latency_s'):.1f} s,"
          f" hvd+reuse {total(hvd, 'latency_s'):.1f} s; speedup hvd+reuse vs ar "
          f"{total(plain, 'latency_s') / total(hvd, 'latency_s'):.2f}x (turns 2..{len(plain.turns)}: "
          f"{total(plain, 'latency_s', 1) / total(hvd, 'latency_s', 1):.2f}x), ar+reuse vs ar "
          f"{total(plain, 'latency_s') / total(reuse, 'latency_s'):.2f}x")
    same = sum(a.token_ids == b.token_ids == c.token_ids for a, b, c in zip(plain.turns, reuse.turns, hvd.turns))
    print(f"identical outputs in all three arms: {same}/{len(plain.turns)} turns")
    print("output tokens sha256: " + "  ".join(f"{arm.name} {output_digest(t.token_ids for t in arm.turns)}"
                                               for arm in arms))


def run_memory_benchmark(
    model: str | None = None, device: str | None = None, turns: int = 200, budget_bytes: int = 128 << 20,
    sessions: int = 4, session_tokens: int = 1200,
) -> None:
    """Short turns over ``sessions`` interleaved conversations; print the prefix cache's memory figures.

    A conversation grows by one user message and a 4-token reply per turn and starts
    over once its prompt passes ``session_tokens``.
    """
    engine = _fresh_engine(shared_engine(model, device=device), budget_bytes)
    tools = agent_tools()[:2]
    conversations: dict[int, list[dict]] = {}
    worst, reused, prompt_total = 0, 0, 0
    for turn in range(turns):
        which = turn % sessions
        messages = conversations.get(which) or [{"role": "system", "content": f"Agent {which}. Use the tools."}]
        messages = messages + [{"role": "user", "content": f"Step {turn}: check item {turn * 7 % 101} and report."}]
        structure = prepare(engine, messages, tools)  # session id derived: a restart is a new conversation
        result = engine.generate(structure.prompt_ids, GenerationParams(max_new_tokens=4, method="ar"),
                                 structure=structure)
        messages.append({"role": "assistant", "content": result.text})
        conversations[which] = messages if len(structure.prompt_ids) < session_tokens else []
        worst = max(worst, engine.prefix_cache.stats().bytes)
        reused += result.stats.reused_prefix_tokens
        prompt_total += result.stats.prompt_tokens
    stats = engine.prefix_cache.stats()
    print(f"{turns} turns over {sessions} conversations (restarted past {session_tokens} prompt tokens): "
          f"budget {stats.budget_bytes:,} B, peak {stats.peak_bytes:,} B ({stats.peak_bytes / stats.budget_bytes:.1%}),"
          f" worst after a turn {worst:,} B, final {stats.bytes:,} B in {stats.entries} entries")
    print(f"inserted {stats.inserted}, subsumed {stats.subsumed}, evicted {stats.evicted}, truncated "
          f"{stats.truncated}; reused {reused:,} of {prompt_total:,} prompt tokens ({reused / prompt_total:.1%}); "
          f"within budget: {stats.peak_bytes <= stats.budget_bytes}")
