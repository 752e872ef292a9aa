"""``hvd-agents bench-agents``: the examples' recorded agent conversations, replayed under each arm.

Each shipped conversation (:mod:`hvd_agents.bench.recorded`) is the list of model calls
an example made (the four examples of ``examples/``, full runs on the embedded model).
The replay generates every one of those calls again, greedy, from the recorded messages
before it, under each arm (:mod:`hvd_agents.bench.agent_arms`): the same prompt token
ids for every arm, rendered by :func:`hvd_agents.chat.conversation.prepare` and checked
against the recording. Arms run call by call, interleaved (their order alternates from
call to call), so all see the same machine state; every engine arm and the llama.cpp arm
start each conversation fresh (a new agent process) and keep their state over its calls.

Per arm: the end-to-end agent latency (every call, rendering and prefill included, prefix
reuse where the arm has it), prefill and decode seconds, decode tok/s, tokens per step,
accepted/drafted, the drafter's per-step seconds (``propose``: drafting and the policy's
decision; ``observe``: index update and online learning; the verification forward) and
whether its tokens equal engine ``ar``'s on every call. Then the ratio of ``hvd+reuse``'s
end-to-end latency to every other arm's, per conversation and over all.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hvd_agents.bench import llama_cpp
from hvd_agents.bench.agent_arms import CallFigures, EngineArm, HFArm, LlamaCppArm, ReplayCall
from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.recorded import RecordedConversation, load_conversations, prompt_digest
from hvd_agents.chat.conversation import prepare
from hvd_agents.engine import Engine
from hvd_agents.engine.shared import shared_engine
from hvd_agents.errors import HVDError, InvalidRequestError

logger = logging.getLogger(__name__)

HVD_ARM = "hvd+reuse"
REFERENCE_ARM = "ar"
ENGINE_ARMS = {  # name: (method, prefix reuse)
    "ar": ("ar", False),
    "ar+reuse": ("ar", True),
    "pld+reuse": ("pld", True),
    "hvd-cache+reuse": ("hvd-cache", True),
    "model+reuse": ("model", True),
    "hvd+reuse": ("hvd", True),
    "hvd-paper+reuse": ("hvd-paper", True),
    "hvd-chain+reuse": ("hvd-chain", True),
    "hvd-graft+reuse": ("hvd-graft", True),
    "arctic+reuse": ("arctic", True),
}
PEER_ARMS = ("hf-generate", "hf-prompt-lookup", f"{llama_cpp.PEER_NAME}+reuse")
ARMS = (*PEER_ARMS, *ENGINE_ARMS)
PROMPT_LOOKUP_TOKENS = 10


def resolve_arms(spec: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Arm names from ``"a,b"`` (None: all), and a note for each one skipped as not installed.

    A method name without ``+reuse`` (``hvd``, ``pld``, ...) means the arm with reuse.

    Raises:
        InvalidRequestError: an unknown name.
    """
    raw = list(ARMS) if spec is None else spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (s.strip() for s in raw):
        if not item:
            continue
        name = item if item in ARMS else f"{item}+reuse"
        if name not in ARMS:
            raise InvalidRequestError(f"unknown arm {item!r}: choose from {', '.join(ARMS)}")
        if name not in names:
            names.append(name)
    if not names:
        raise InvalidRequestError("--arms names no arm")
    notes = []
    peer = f"{llama_cpp.PEER_NAME}+reuse"
    if peer in names and not llama_cpp.available():
        names.remove(peer)
        notes.append(f"{peer} skipped: {llama_cpp.missing_message()}")
    if "arctic+reuse" in names:
        from hvd_agents.trace.strategies import arctic_available

        if not arctic_available():
            names.remove("arctic+reuse")
            notes.append("arctic+reuse skipped: arctic_inference is not installed (pip install arctic-inference): "
                         "ArcticInference's SuffixDecodingCache drafts in that arm")
    return names, notes


def _make_arm(name: str, base: Engine, peer: llama_cpp.LlamaCppPeer | None) -> EngineArm | HFArm | LlamaCppArm:
    if name in ENGINE_ARMS:
        method, reuse = ENGINE_ARMS[name]
        drafter = None
        if method == "arctic":
            from hvd_agents.trace.strategies import ArcticDrafter

            drafter = ArcticDrafter
        return EngineArm(name, base, method, reuse, drafter)
    if name == "hf-generate":
        return HFArm(name, base)
    if name == "hf-prompt-lookup":
        return HFArm(name, base, prompt_lookup=PROMPT_LOOKUP_TOKENS)
    if peer is None:
        raise HVDError(f"arm {name} needs llama-cpp-python")
    return LlamaCppArm(name, base, peer)


def _scratch_engine(base: Engine) -> Engine:
    """An engine over the shared model with its own store, to render prompts without touching any arm."""
    return base.sibling(prefix_cache_bytes=0, draft_head=None)


def replay_calls(base: Engine, conversation: RecordedConversation, *, max_turns: int | None = None,
                 max_new_tokens: int | None = None, check: bool = True) -> list[ReplayCall]:
    """The calls of ``conversation`` to replay, with their prompt ids rendered by ``prepare``.

    Args:
        base: the engine (its tokenizer renders the prompts).
        conversation: the recording.
        max_turns: replay only its first calls.
        max_new_tokens: a smaller token budget than the recorded one (short runs).
        check: raise when a prompt differs from the recorded one (the recording's model only).

    Raises:
        HVDError: ``check`` and a rendered prompt that is not the recorded one.
    """
    scratch = _scratch_engine(base)
    calls = []
    for index, call in enumerate(conversation.calls[:max_turns]):
        messages, tools = conversation.call_messages(index), conversation.call_tools(index)
        structure = prepare(scratch, messages, tools, session_id=call.session_id,
                            assistant_prefix=call.assistant_prefix)
        if check and prompt_digest(structure.prompt_ids) != call.prompt_sha256:
            raise HVDError(f"{conversation.name} call {index}: the rendered prompt is not the recorded one "
                           f"({len(structure.prompt_ids)} tokens, recorded {call.prompt_tokens})")
        budget = call.max_new_tokens if max_new_tokens is None else min(call.max_new_tokens, max_new_tokens)
        calls.append(ReplayCall(conversation.name, index, messages, tools, call.session_id, call.assistant_prefix,
                                call.stop, budget, tuple(structure.prompt_ids)))
    return calls


# ------------------------------------------------------------------ figures


@dataclass
class ArmTotals:
    """One arm's figures added up over calls."""

    calls: int = 0
    latency_s: float = 0.0
    prepare_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    new_tokens: int = 0
    decode_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    propose_s: float = 0.0
    observe_s: float = 0.0
    verify_s: float = 0.0
    model_draft_s: float = 0.0
    drafts_known: bool = True

    @classmethod
    def of(cls, calls: Sequence[CallFigures], kind: str) -> ArmTotals:
        total = cls()
        for c in calls:
            total.calls += 1
            total.latency_s += c.latency_s
            total.prepare_s += c.prepare_s
            total.prefill_s += c.prefill_s
            total.decode_s += c.decode_s
            total.prompt_tokens += c.prompt_tokens
            total.reused_tokens += c.reused_tokens
            total.new_tokens += c.new_tokens
            # HF's decode clock starts once its first token is out (its prefill produced it)
            total.decode_tokens += max(c.new_tokens - 1, 0) if kind == "hf" else c.new_tokens
            total.steps += c.steps
            total.drafted += c.drafted
            total.accepted += c.accepted
            total.propose_s += c.propose_s
            total.observe_s += c.observe_s
            total.verify_s += c.verify_s
            total.model_draft_s += c.model_draft_s
            total.drafts_known &= c.drafts_known
        return total

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    def per_step_ms(self, seconds: float) -> float:
        return 1e3 * seconds / self.steps if self.steps else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(decode_tokens_per_s=self.decode_tokens_per_s, tokens_per_step=self.tokens_per_step,
                   step_ms=self.per_step_ms(self.decode_s), verify_ms_per_step=self.per_step_ms(self.verify_s),
                   propose_ms_per_step=self.per_step_ms(self.propose_s),
                   observe_ms_per_step=self.per_step_ms(self.observe_s),
                   model_draft_ms_per_step=self.per_step_ms(self.model_draft_s))
        return out


@dataclass
class AgentBenchResult:
    """Everything one run measured (see :func:`run_agents_benchmark`)."""

    arms: list[str]
    kinds: dict[str, str]
    conversations: list[str]
    calls: list[CallFigures]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def arm_calls(self, arm: str, conversation: str | None = None) -> list[CallFigures]:
        return [c for c in self.calls if c.arm == arm and (conversation is None or c.conversation == conversation)]

    def totals(self, arm: str, conversation: str | None = None) -> ArmTotals:
        return ArmTotals.of(self.arm_calls(arm, conversation), self.kinds[arm])

    def reference(self) -> str | None:
        return REFERENCE_ARM if REFERENCE_ARM in self.arms else None

    def differing(self, arm: str) -> list[tuple[str, int]]:
        """The calls (conversation, index) whose tokens differ from the reference arm's (``ar``)."""
        ref = self.reference()
        if ref is None:
            return []
        want = {(c.conversation, c.index): c.token_ids for c in self.arm_calls(ref)}
        return [(c.conversation, c.index) for c in self.arm_calls(arm) if want.get((c.conversation, c.index)) != c.token_ids]

    def speedup(self, arm: str, conversation: str | None = None) -> float:
        """``arm``'s end-to-end latency over ``hvd+reuse``'s (above 1: hvd is faster)."""
        hvd = self.totals(HVD_ARM, conversation).latency_s
        return self.totals(arm, conversation).latency_s / hvd if hvd > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"settings": self.settings, "notes": self.notes, "arms": {}, "conversations": {}}
        for arm in self.arms:
            row = self.totals(arm).to_json()
            row["kind"] = self.kinds[arm]
            row["differs_from_ar"] = [f"{conv}#{index}" for conv, index in self.differing(arm)]
            row["output_digest"] = output_digest(c.token_ids for c in self.arm_calls(arm))
            if HVD_ARM in self.arms:
                row["hvd_speedup"] = self.speedup(arm)
            out["arms"][arm] = row
        for conv in self.conversations:
            out["conversations"][conv] = {
                arm: {**self.totals(arm, conv).to_json(),
                      **({"hvd_speedup": self.speedup(arm, conv)} if HVD_ARM in self.arms else {})}
                for arm in self.arms}
        out["calls"] = [{**asdict(c), "token_ids": list(c.token_ids)} for c in self.calls]
        return out


# ------------------------------------------------------------------ the run


def run_agents_benchmark(
    *, model: str | None = None, device: str | None = None, arms: str | Sequence[str] | None = None,
    conversations: Sequence[str] | None = None, threads: int | None = None, max_turns: int | None = None,
    max_new_tokens: int | None = None, json_path: str | Path | None = None, chart_path: str | Path | None = None,
    engine: Engine | None = None,
) -> AgentBenchResult:
    """Replay the recorded conversations under each arm; print the tables; write JSON and the chart if asked.

    Args:
        model: the model (None: the embedded one, which recorded the conversations; another
            model renders other prompts, so the recorded-prompt check is off).
        device: its device.
        arms: arm names (None: all; llama.cpp and ArcticInference are skipped with a note when
            not installed).
        conversations: shipped conversation names (None: all).
        threads: torch's (and llama.cpp's) thread count; None keeps torch's.
        max_turns: replay only each conversation's first calls.
        max_new_tokens: cap each call's token budget (short runs).
        json_path: write the figures as JSON.
        chart_path: write a PNG chart (turn latency per arm, accepted-length histogram).
        engine: a loaded engine to use instead of loading ``model``.
    """
    names, notes = resolve_arms(arms)
    recorded = load_conversations(conversations)
    if threads is not None:
        torch.set_num_threads(threads)
    peer_name = f"{llama_cpp.PEER_NAME}+reuse"
    if peer_name in names:
        llama_cpp.gguf_path(model)  # a GGUF file, before anything loads
    base = engine if engine is not None else shared_engine(model, device=device)
    base.cost_model()  # measured (or read from its cache) before any clock runs
    calls = {conv.name: replay_calls(base, conv, max_turns=max_turns, max_new_tokens=max_new_tokens,
                                     check=model is None)
             for conv in recorded}
    peer = None
    if peer_name in names:
        longest = max(len(c.prompt_ids) + c.max_new_tokens for cs in calls.values() for c in cs)
        peer = llama_cpp.LlamaCppPeer.load(model, n_ctx=min(base.context_window, -(-longest // 256) * 256),
                                           threads=torch.get_num_threads())
    runners = [_make_arm(name, base, peer) for name in names]
    for note in notes:
        print(note)
    _warm_up(base, runners)
    figures: list[CallFigures] = []
    step = 0
    for conv in recorded:
        for arm in runners:
            arm.start()
        for call in calls[conv.name]:
            order = runners if step % 2 == 0 else list(reversed(runners))
            step += 1
            for arm in order:
                logger.info("%s call %d/%d, arm %s", conv.name, call.index + 1, len(calls[conv.name]), arm.name)
                figures.append(arm.run(call))
    settings = {
        "model": model or "embedded SmolLM2-135M-Instruct", "device": str(base.device),
        "threads": torch.get_num_threads(), "max_turns": max_turns, "max_new_tokens": max_new_tokens,
        "conversations": {conv.name: {"calls": len(calls[conv.name]), "title": conv.title, "command": conv.command,
                                      "steering": conv.steering,
                                      "prompt_tokens": [len(c.prompt_ids) for c in calls[conv.name]]}
                          for conv in recorded},
        "llama_cpp": peer.describe() if peer is not None else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    result = AgentBenchResult(names, {arm.name: arm.kind for arm in runners}, [c.name for c in recorded], figures,
                              settings, notes)
    print("\n".join(report_lines(result)))
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {json_path}")
    if chart_path is not None:
        from hvd_agents.bench.agent_chart import write_chart

        write_chart(result, chart_path)
        print(f"wrote {chart_path}")
    return result


def _warm_up(base: Engine, runners: Sequence[Any]) -> None:
    """One short call per arm (kernels, allocator, HF's generation set-up); each conversation starts fresh after."""
    messages = [{"role": "user", "content": "Warm up: say hello."}]
    structure = prepare(_scratch_engine(base), messages)
    call = ReplayCall("warm-up", 0, messages, None, None, "", (), 4, tuple(structure.prompt_ids))
    for arm in runners:
        arm.start()
        arm.run(call)


# ------------------------------------------------------------------ the report


def _f(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def report_lines(result: AgentBenchResult) -> list[str]:
    """The printed report: settings, the per-arm table, the hvd ratio table and the identity check (markdown)."""
    s = result.settings
    convs = s["conversations"]
    sizes = ", ".join(f"{name} {conv['calls']} calls" for name, conv in convs.items())
    lines = [(f"bench-agents: {len(result.conversations)} recorded conversations ({sizes}), greedy, "
             f"{s['model']}, device {s['device']}, {s['threads']} threads, {s['date']}")]
    if s.get("llama_cpp"):
        lines.append(f"llama.cpp: {s['llama_cpp']}")
    lines += ["", ("| arm | end-to-end s | prefill s | decode s | new tok | decode tok/s | tok/step | accepted/drafted "
              "| ms/step | verify ms/step | propose ms/step | observe ms/step | same tokens as ar |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in result.arms:
        t = result.totals(arm)
        kind = result.kinds[arm]
        drafts = f"{t.accepted}/{t.drafted}" if kind == "engine" else f"{t.accepted}/-" if t.accepted else "-"
        engine_only = (lambda v: _f(v)) if kind == "engine" else (lambda v: "-")
        ref = result.reference()
        differs = result.differing(arm)
        same = "-" if ref is None else f"{t.calls - len(differs)}/{t.calls}"
        lines.append(f"| {arm} | {_f(t.latency_s)} | {_f(t.prefill_s)} | {_f(t.decode_s)} | {t.new_tokens} | "
                     f"{_f(t.decode_tokens_per_s, 1)} | {_f(t.tokens_per_step)} | {drafts} | "
                     f"{_f(t.per_step_ms(t.decode_s))} | {engine_only(t.per_step_ms(t.verify_s))} | "
                     f"{engine_only(t.per_step_ms(t.propose_s))} | {engine_only(t.per_step_ms(t.observe_s))} | {same} |")
    if HVD_ARM in result.arms:
        lines += ["", (f"{HVD_ARM} end-to-end agent latency against each arm (arm's seconds / {HVD_ARM}'s; "
                      "above 1: hvd is faster)"), "",
                  "| arm | " + " | ".join(result.conversations) + " | all |",
                  "|---|" + "---|" * (len(result.conversations) + 1)]
        for arm in result.arms:
            if arm == HVD_ARM:
                continue
            cells = [f"{result.speedup(arm, conv):.2f}x" for conv in result.conversations]
            lines.append(f"| {arm} | " + " | ".join(cells) + f" | {result.speedup(arm):.2f}x |")
        lines += ["", *split_lines(result)]
    for arm in result.arms:
        differs = result.differing(arm)
        if differs:
            lines.append(f"{arm}: tokens differ from ar on " + ", ".join(f"{c}#{i}" for c, i in differs))
    lines.append("output tokens sha256: " + "  ".join(
        f"{arm} {output_digest(c.token_ids for c in result.arm_calls(arm))}" for arm in result.arms))
    return lines


def split_lines(result: AgentBenchResult) -> list[str]:
    """Where ``hvd+reuse``'s time goes, per conversation: rendering, prefill, and decode by part of the step."""
    out = [(f"where {HVD_ARM}'s time goes (s): render / prefill (prompt tok, reused) / decode = steps x ms/step "
           "(verify + propose + observe + rest)")]
    for conv in [*result.conversations, None]:
        t = result.totals(HVD_ARM, conv)
        rest = t.decode_s - t.verify_s - t.propose_s - t.observe_s
        out.append(f"  {conv or 'all':<22} {t.latency_s:6.2f} = {t.prepare_s:.2f} / {t.prefill_s:.2f} "
                   f"({t.prompt_tokens}, {t.reused_tokens}) / {t.decode_s:.2f} = {t.steps} x "
                   f"{t.per_step_ms(t.decode_s):.1f} ({t.per_step_ms(t.verify_s):.1f} + {t.per_step_ms(t.propose_s):.2f}"
                   f" + {t.per_step_ms(t.observe_s):.2f} + {t.per_step_ms(rest):.2f}); {t.new_tokens} tokens, "
                   f"{t.tokens_per_step:.2f}/step")
    return out
