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

With ``peers=("llama.cpp",)`` a fourth arm, ``llama.cpp+reuse``: one llama.cpp instance
(:mod:`hvd_agents.bench.llama_cpp`) kept over the turns, so each turn prefills only what
follows the longest common prefix with what its KV cache holds. It decodes the prompt token
ids our tokenizer renders from its own conversation (the same rule as the other arms: its
replies are sent back), greedy, with the same max_new_tokens and stop ids. Its kernels differ
from ours, so its replies may differ from ``ar``'s; then its later prompts differ too. This is
reported per turn, not required.

Memory mode (``memory_turns``): a long loop of short turns over interleaved
conversations, printing the prefix cache's peak bytes against its budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hvd_agents.bench.agent_session import agent_tools, first_messages, tool_exchange
from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.llama_cpp import PEER_NAME, LlamaCppPeer, check_peers, reply_text
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.render import encode_prompt
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


@dataclass
class PeerArm:
    """The llama.cpp arm: one instance over the turns, reusing its cached prefix; greedy."""

    name: str
    peer: LlamaCppPeer
    tokenizer: Any
    context_window: int
    max_new_tokens: int
    stop_ids: frozenset[int]
    messages: list[dict]
    turns: list[TurnFigures] = field(default_factory=list)

    def run_turn(self, turn: int, tools: list[dict]) -> None:
        """One agent call: render + decode (our tokenizer's ids), then append the reply and the next tool exchange."""
        start = time.perf_counter()
        prompt = encode_prompt(self.tokenizer, self.messages, tools)  # the ids prepare() gives the other arms
        budget = min(self.max_new_tokens, self.context_window - len(prompt))  # the engine's budget
        result = self.peer.generate_reusing(prompt, budget, self.stop_ids)
        latency = time.perf_counter() - start
        self.turns.append(TurnFigures(len(prompt), result.reused_tokens, result.prefill_s, latency, result.token_ids))
        self.messages += tool_exchange(turn, reply_text(self.tokenizer, result.token_ids, self.stop_ids))


def run_prefix_benchmark(
    model: str | None = None, device: str | None = None, turns: int = 6, max_new_tokens: int = 48,
    budget_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, peers: Sequence[str] = (),
) -> list[Arm | PeerArm]:
    """Run the agent-mode benchmark, print its table and return the arms (the llama.cpp arm last, if asked for).

    Raises:
        HVDError: an unknown peer, or llama.cpp asked for and not installed or ``model`` not
            a GGUF file (checked before the model loads).
    """
    check_peers(peers, model)
    base = shared_engine(model, device=device)
    tools = agent_tools()
    arms = [Arm(name, base.sibling(prefix_cache_bytes=budget_bytes if reuse else 0),
                GenerationParams(max_new_tokens=max_new_tokens, method=method), first_messages())
            for name, method, reuse in ARMS]
    warm_ids = base.tokenizer("warm up the kernels").input_ids
    base.generate(warm_ids, GenerationParams(max_new_tokens=4, method="ar", reuse_prefix=False))
    peer = None
    if PEER_NAME in peers:
        stops = frozenset(base.eos_token_ids)
        llama = LlamaCppPeer.load(model, n_ctx=base.context_window, threads=torch.get_num_threads())
        llama.generate(warm_ids, 4, stops)
        peer = PeerArm(f"{PEER_NAME}+reuse", llama, base.tokenizer, base.context_window, max_new_tokens, stops,
                       first_messages())
    everyone: list[Arm | PeerArm] = [*arms, *([peer] if peer is not None else [])]
    for turn in range(turns):
        for arm in everyone if turn % 2 == 0 else reversed(everyone):
            logger.info("turn %d, arm %s", turn + 1, arm.name)
            arm.run_turn(turn, tools)
    _print_agent_table(arms, max_new_tokens, base, peer)
    return everyone


def _print_agent_table(arms: list[Arm], max_new_tokens: int, engine: Engine, peer: PeerArm | None = None) -> None:
    plain, reuse, hvd = arms
    print(f"{len(plain.turns)}-turn agent conversation, greedy, max_new_tokens={max_new_tokens}, "
          f"device={engine.device}, prefix budget {reuse.engine.prefix_cache.budget_bytes / 2**20:.0f} MiB")
    if peer is not None:
        print(f"{peer.name}: {peer.peer.describe()}; the engine with {torch.get_num_threads()} torch threads")
    wide = f"{peer.name:>17}" if peer is not None else ""
    print(f"{'turn':>4}{'prompt':>8}{'reused':>8} | {'prefill s: ar':>14}{'ar+reuse':>10}{'hvd+reuse':>11}{wide} | "
          f"{'turn s: ar':>11}{'ar+reuse':>10}{'hvd+reuse':>11}{wide} | same tokens"
          + (f" | {peer.name}: prompt  reused  = ar" if peer is not None else ""))
    for i, (a, b, c) in enumerate(zip(plain.turns, reuse.turns, hvd.turns)):
        same = a.token_ids == b.token_ids == c.token_ids
        d = peer.turns[i] if peer is not None else None
        print(f"{i + 1:>4}{a.prompt_tokens:>8}{b.reused_tokens:>8} | {a.prefill_s:>14.2f}{b.prefill_s:>10.2f}"
              f"{c.prefill_s:>11.2f}{f'{d.prefill_s:>17.2f}' if d else ''} | {a.latency_s:>11.2f}{b.latency_s:>10.2f}"
              f"{c.latency_s:>11.2f}{f'{d.latency_s:>17.2f}' if d else ''} | {f'{same!s:>11}' if d else same}"
              + (f" | {d.prompt_tokens:>23}{d.reused_tokens:>8}  {d.token_ids == a.token_ids!s:>4}" if d else ""))

    def total(arm: Arm | PeerArm, what: str, first: int = 0) -> float:
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
    if peer is not None:
        for line in peer_summary(plain, reuse, hvd, peer):
            print(line)
    print("output tokens sha256: " + "  ".join(f"{arm.name} {output_digest(t.token_ids for t in arm.turns)}"
                                               for arm in [*arms, *([peer] if peer is not None else [])]))


def peer_summary(plain: Arm | PeerArm, reuse: Arm | PeerArm, hvd: Arm | PeerArm, peer: Arm | PeerArm) -> list[str]:
    """The llama.cpp arm's summary lines: its end-to-end time against ours, and its replies against ``ar``'s."""

    def total(arm: Arm | PeerArm, first: int = 0) -> float:
        return sum(t.latency_s for t in arm.turns[first:])

    n = len(plain.turns)
    timing = (f"end-to-end agent latency: {peer.name} {total(peer):.1f} s (prefill "
              f"{sum(t.prefill_s for t in peer.turns):.1f} s); hvd+reuse vs {peer.name} "
              f"{total(peer) / total(hvd):.2f}x (turns 2..{n}: {total(peer, 1) / total(hvd, 1):.2f}x), "
              f"ar+reuse vs {peer.name} {total(peer) / total(reuse):.2f}x")
    equal = [a.token_ids == d.token_ids for a, d in zip(plain.turns, peer.turns)]
    identity = f"{peer.name} replies token-identical to ar's: {sum(equal)}/{n} turns"
    if not all(equal):
        first = equal.index(False) + 1
        identity += f"; they first differ at turn {first}"
        if first < n:
            identity += (f": each arm's conversation is built from its own replies, so from turn {first + 1} on "
                         f"{peer.name} decodes other prompts than ar")
    return [timing, identity]


def run_memory_benchmark(
    model: str | None = None, device: str | None = None, turns: int = 200, budget_bytes: int = 128 << 20,
    sessions: int = 4, session_tokens: int = 1200,
) -> None:
    """Short turns over ``sessions`` interleaved conversations; print the prefix cache's memory figures.

    A conversation grows by one user message and a 4-token reply per turn and starts
    over once its prompt passes ``session_tokens``.
    """
    engine = shared_engine(model, device=device).sibling(prefix_cache_bytes=budget_bytes)
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
