"""Live benchmark: the engine against HF ``generate``, side by side in one run.

For every prompt, five runs on the same model, greedy, same max_new_tokens:

* HF ``generate(do_sample=False)``: what a langchain-huggingface user gets;
* engine ``ar``: our loop without drafts (overhead check, goal within 10% of HF);
* HF ``generate(prompt_lookup_num_tokens=k)``: the prompt-lookup peer;
* engine ``pld``: the same algorithm inside our loop (goal: at least equal);
* engine ``hvd-cache``: the cache drafter, with the prompt's structure (system
  prompt, tool schemas, call skeletons, turns) registered in a fresh store per run;
* engine ``hvd``: the same cache drafter with the payoff predictor and the measured
  cost model choosing each step's draft length (fresh store per run too);
* with ``peers=("llama.cpp",)``: llama.cpp (llama-cpp-python, :mod:`hvd_agents.bench.llama_cpp`)
  on the model's GGUF file, fed the same prompt token ids, greedy, on the CPU with torch's
  thread count. Its kernels differ from ours, so its outputs may differ: the number of runs
  whose tokens equal ``engine-ar``'s is printed, not required.

The prompts are the 4 agent prompts; ``chat=True`` adds the 8 held-out chat prompts and the
figures are then also printed per prompt group.

Two figures per configuration, kept apart: end-to-end tok/s (new tokens / seconds of the whole
calls, prefill included) and decode tok/s (new tokens / decode seconds, from each arm's own split:
the engine's :class:`~hvd_agents.engine.stats.RequestStats`, llama.cpp's clock, and for HF the time
after its first new token, which its prefill yields). On these prompts (123 to 401 tokens, replies of
32 to 128) the prefill is close to half of every call, so the two differ by about 2x; the decode
figure is the one to compare with ``Engine.generate``'s stats.

Each configuration runs once to warm up, then the runs are interleaved prompt by
prompt, in ``rounds`` rounds whose configuration order alternates (forward, then
reversed), so both sides see the same machine state and no side always runs first. Outputs must be identical token
for token; any mismatch is reported. Figures are ratios measured in this run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch

from hvd_agents.bench.agent_arms import FirstTokenClock, StopRule
from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.llama_cpp import PEER_NAME, LlamaCppPeer, check_peers, same_count
from hvd_agents.bench.prompts import AgentPrompt, agent_prompts, chat_prompts
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.render import encode_prompt
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.engine.shared import shared_engine
from hvd_agents.engine.stats import RequestStats, SourceStats

logger = logging.getLogger(__name__)


@dataclass
class Tally:
    """Tokens and seconds of one configuration over all prompts."""

    tokens: int = 0
    seconds: float = 0.0
    outputs: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class Split:
    """Prefill and decode seconds of one configuration's runs (those that report them)."""

    tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s else 0.0

    def add(self, tokens: int, prefill_s: float, decode_s: float) -> None:
        self.tokens += tokens
        self.prefill_s += prefill_s
        self.decode_s += decode_s


Splits = dict[str, Split]  # by prompt group


@dataclass(frozen=True)
class _Item:
    """One benchmark prompt, rendered once."""

    prompt: AgentPrompt
    ids: list[int]
    group: str = "agent"


Runner = Callable[[_Item], tuple[int, ...]]


def _record(splits: Splits | None, item: _Item, stats: RequestStats) -> None:
    if splits is not None:
        splits.setdefault(item.group, Split()).add(stats.new_tokens, stats.prefill_s, stats.decode_s)


def _hf_runner(engine: Engine, max_new_tokens: int, splits: Splits | None = None, **extra) -> Runner:
    """HF ``generate``; ``splits`` gets its prefill (up to the first new token, which the prompt's forward
    yields) and decode (the other new tokens) seconds by prompt group."""
    from transformers import StoppingCriteriaList

    model = engine.model
    eos = list(engine.eos_token_ids)

    def run(item: _Item) -> tuple[int, ...]:
        clock = FirstTokenClock(len(item.ids), StopRule(engine.tokenizer, eos, ()))
        start = time.perf_counter()
        ids = torch.tensor([item.ids], device=engine.device)  # [1, n]
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos or None,
                pad_token_id=eos[0] if eos else 0,
                stopping_criteria=StoppingCriteriaList([clock]),
                **extra,
            )
        end = time.perf_counter()
        tokens = tuple(out[0, len(item.ids) :].tolist())
        if splits is not None:
            first = clock.first if clock.first is not None else end
            splits.setdefault(item.group, Split()).add(max(len(tokens) - 1, 0), first - start, end - first)
        return tokens

    return run


def _engine_runner(engine: Engine, params: GenerationParams, splits: Splits | None = None) -> Runner:
    def run(item: _Item) -> tuple[int, ...]:
        result = engine.generate(item.ids, params)
        _record(splits, item, result.stats)
        return result.token_ids

    return run


def _peer_runner(peer: LlamaCppPeer, max_new_tokens: int, stop_ids: Sequence[int],
                 splits: Splits | None = None) -> Runner:
    """llama.cpp from a fresh state per run (no prefix reuse, like the engine's arms here)."""
    stops = frozenset(stop_ids)

    def run(item: _Item) -> tuple[int, ...]:
        result = peer.generate(item.ids, max_new_tokens, stops)
        if splits is not None:
            splits.setdefault(item.group, Split()).add(len(result.token_ids), result.prefill_s, result.decode_s)
        return result.token_ids

    return run


def _cache_runner(
    engine: Engine,
    params: GenerationParams,
    *,
    model_drafter: bool = True,
    sources: dict[str, SourceStats] | None = None,
    splits: Splits | None = None,
) -> Runner:
    """A cache method with the prompt's structure registered in a FRESH store (and drafter) per
    run, so no run can copy an earlier run's output of the same prompt; ``model_drafter=False``
    leaves the engine's model drafter out. ``sources`` adds up the runs' steps by draft source
    (``"suffix"``, ``"head"``, ``"none"``, ...); ``splits`` their prefill and decode seconds by prompt group."""
    cost = engine.cost_model()

    def run(item: _Item) -> tuple[int, ...]:
        fresh = engine.sibling(cost_model=cost, draft_model=engine.draft_model if model_drafter else None,
                       draft_head=engine.draft_head if model_drafter else None)
        structure = prepare(fresh, item.prompt.messages, item.prompt.tools)
        result = fresh.generate(structure.prompt_ids, params, structure=structure)
        _record(splits, item, result.stats)
        if sources is not None:
            for name, per in result.stats.per_source.items():
                total = sources.setdefault(name.split(":")[0], SourceStats())
                total.steps += per.steps
                total.drafted += per.drafted
                total.accepted += per.accepted
        return result.token_ids

    return run


def _timed(run: Runner, item: _Item, tally: Tally) -> None:
    start = time.perf_counter()
    out = run(item)
    tally.seconds += time.perf_counter() - start
    tally.tokens += len(out)
    tally.outputs.append(out)


def run_live_benchmark(
    model: str | None = None,
    device: str | None = None,
    max_new_tokens: int = 128,
    k: int = 10,
    rounds: int = 2,
    hvd_k: int | None = None,
    chat: bool = False,
    peers: Sequence[str] = (),
) -> dict[str, Tally]:
    """Run the benchmark and print its table; returns the tallies by configuration name (all prompts).

    ``k`` is the draft length of the fixed-length methods; ``hvd_k`` the most draft
    tokens ``hvd`` may verify (its policy picks the length each step; default: its own, 32).
    ``chat`` adds the 8 held-out chat prompts to the 4 agent prompts; ``peers`` adds other
    engines as arms (``"llama.cpp"``: needs ``pip install 'hvd-agents[peers]'``).

    Raises:
        HVDError: an unknown peer, or llama.cpp asked for and not installed or ``model`` not
            a GGUF file (checked before the model loads).
    """
    check_peers(peers, model)
    engine = shared_engine(model, device=device)
    groups = {"agent": agent_prompts(), **({"chat": chat_prompts()} if chat else {})}
    items = [_Item(p, encode_prompt(engine.tokenizer, p.messages, p.tools), group)
             for group, prompts in groups.items() for p in prompts]
    # prefill reuse across repeated runs of a prompt would favour the engine: off here
    # (measured by bench-prefix); this benchmark compares decoding
    params = GenerationParams(max_new_tokens=max_new_tokens, num_draft_tokens=k, reuse_prefix=False)
    # every configuration's prefill and decode seconds, by prompt group: the table reports decode tok/s
    # (new tokens / decode seconds) apart from end-to-end tok/s (new tokens / seconds of the whole call)
    names = ("hf-generate", "engine-ar", "hf-prompt-lookup", "engine-pld", "engine-hvd-cache", "engine-hvd")
    splits: dict[str, Splits] = {name: {} for name in names}
    runners = {
        "hf-generate": _hf_runner(engine, max_new_tokens, splits["hf-generate"]),
        "engine-ar": _engine_runner(engine, replace(params, method="ar"), splits["engine-ar"]),
        "hf-prompt-lookup": _hf_runner(engine, max_new_tokens, splits["hf-prompt-lookup"], prompt_lookup_num_tokens=k),
        "engine-pld": _engine_runner(engine, replace(params, method="pld"), splits["engine-pld"]),
        "engine-hvd-cache": _cache_runner(engine, replace(params, method="hvd-cache"), splits=splits["engine-hvd-cache"]),
        "engine-hvd": _cache_runner(engine, GenerationParams(max_new_tokens=max_new_tokens, method="hvd",
                                                             num_draft_tokens=hvd_k, reuse_prefix=False),
                                    splits=splits["engine-hvd"]),
    }
    peer = None
    if PEER_NAME in peers:
        longest = max(len(item.ids) for item in items) + max_new_tokens
        peer = LlamaCppPeer.load(model, n_ctx=min(engine.context_window, -(-longest // 256) * 256),
                                 threads=torch.get_num_threads())
        splits[PEER_NAME] = {}
        runners[PEER_NAME] = _peer_runner(peer, max_new_tokens, engine.eos_token_ids, splits[PEER_NAME])
    for run in runners.values():  # warm-up (allocator, kernels)
        run(items[-1])
    for by_group in splits.values():
        by_group.clear()
    tallies = {group: {name: Tally() for name in runners} for group in groups}
    order = list(runners)
    for round_index in range(rounds):
        for i, item in enumerate(items):
            logger.info("round %d, prompt %d/%d (%d tokens)", round_index + 1, i + 1, len(items), len(item.ids))
            for name in order if round_index % 2 == 0 else reversed(order):
                _timed(runners[name], item, tallies[item.group][name])
    merged = {name: merge_tallies([tallies[group][name] for group in groups]) for name in runners}
    what = "agent-style prompts" if len(groups) == 1 else " + ".join(f"{len(p)} {g}" for g, p in groups.items()) + " prompts"
    whole = {name: _merge_splits(by_group.values()) for name, by_group in splits.items()}
    _print_table(merged, whole, [item.ids for item in items] * rounds, max_new_tokens, k, engine.device, what)
    if peer is not None:
        print(f"{PEER_NAME}: {peer.describe()}; the engine on {engine.device} with {torch.get_num_threads()} torch "
              "threads")
    if peer is not None or len(groups) > 1:
        _print_groups(tallies, merged, {name: splits[name] for name in ("engine-ar", "engine-hvd", PEER_NAME)
                                        if name in splits})
    return merged


def merge_tallies(tallies: Sequence[Tally]) -> Tally:
    """One tally over several (outputs in their order)."""
    merged = Tally()
    for tally in tallies:
        merged.tokens += tally.tokens
        merged.seconds += tally.seconds
        merged.outputs += tally.outputs
    return merged


def table_rows(tallies: dict[str, Tally], splits: dict[str, Split]) -> list[dict[str, float | int | str]]:
    """One row per configuration: tokens, end-to-end seconds and tok/s (whole calls, prefill included),
    prefill and decode seconds, decode tok/s (decode tokens / decode seconds: prefill excluded) and the
    decode and end-to-end ratios to HF ``generate``; ``same`` counts outputs equal to HF ``generate``'s."""
    reference, ref_split = tallies["hf-generate"], splits.get("hf-generate", Split())
    rows = []
    for name, tally in tallies.items():
        split = splits.get(name, Split())
        rows.append({
            "name": name, "tokens": tally.tokens, "seconds": tally.seconds, "tokens_per_s": tally.tokens_per_s,
            "prefill_s": split.prefill_s, "decode_s": split.decode_s, "decode_tokens_per_s": split.decode_tokens_per_s,
            "decode_vs_hf": (split.decode_tokens_per_s / ref_split.decode_tokens_per_s
                             if ref_split.decode_tokens_per_s else 0.0),
            "end_to_end_vs_hf": tally.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s else 0.0,
            "same": sum(a == b for a, b in zip(tally.outputs, reference.outputs)),
        })
    return rows


def _print_table(
    tallies: dict[str, Tally], splits: dict[str, Split], prompts: Sequence[list[int]], max_new_tokens: int, k: int,
    device: torch.device, what: str = "agent-style prompts",
) -> None:
    mean_prompt = sum(len(p) for p in prompts) / len(prompts)
    print(f"{len(prompts)} runs of {what} (mean {mean_prompt:.0f} tokens), greedy, "
          f"max_new_tokens={max_new_tokens}, k={k}, device={device}")
    print("end-to-end = whole calls (prefill + decode): tok/s = new tokens / their seconds; decode tok/s = new tokens "
          "/ decode seconds (HF: after its first token)")
    print(f"{'configuration':<18}{'tokens':>8}{'e2e s':>9}{'e2e tok/s':>10}{'prefill s':>10}{'decode s':>10}"
          f"{'decode tok/s':>13}{'decode vs hf':>13}{'e2e vs hf':>10}{'same tokens':>13}")
    rows = table_rows(tallies, splits)
    for row in rows:
        print(f"{row['name']:<18}{row['tokens']:>8}{row['seconds']:>9.2f}{row['tokens_per_s']:>10.1f}"
              f"{row['prefill_s']:>10.2f}{row['decode_s']:>10.2f}{row['decode_tokens_per_s']:>13.1f}"
              f"{row['decode_vs_hf']:>12.2f}x{row['end_to_end_vs_hf']:>9.2f}x{row['same']:>9}/{len(prompts)}")
    by = {row["name"]: row for row in rows}

    def ratio(a: str, b: str, key: str) -> str:
        return _ratio(float(by[a][key]), float(by[b][key]))

    for key, label in (("decode_tokens_per_s", "decode"), ("tokens_per_s", "end-to-end")):
        print(f"{label}: engine-ar / hf-generate {ratio('engine-ar', 'hf-generate', key)}   engine-pld / "
              f"hf-prompt-lookup {ratio('engine-pld', 'hf-prompt-lookup', key)}   engine-hvd-cache / hf-prompt-lookup "
              f"{ratio('engine-hvd-cache', 'hf-prompt-lookup', key)}   engine-hvd / engine-hvd-cache "
              f"{ratio('engine-hvd', 'engine-hvd-cache', key)}   engine-hvd / engine-pld "
              f"{ratio('engine-hvd', 'engine-pld', key)}   engine-hvd / hf-generate {ratio('engine-hvd', 'hf-generate', key)}")
    print("output tokens sha256: " + "  ".join(f"{name} {output_digest(t.outputs)}" for name, t in tallies.items()))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def group_rows(
    tallies: dict[str, dict[str, Tally]], merged: dict[str, Tally], splits: dict[str, Splits]
) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The per-group table: column heads and ``(label, cells)`` rows (the ``all`` column when several groups).

    Rows: tok/s of every configuration (whole calls); with the llama.cpp arm, engine-hvd and
    engine-ar over it and how many of its runs equal engine-ar's tokens; then decode tok/s
    (prefill excluded) and prefill seconds of the configurations that report them.
    """
    columns = {**tallies, "all": merged} if len(tallies) > 1 else dict(tallies)
    heads = [f"{group} ({len(next(iter(column.values())).outputs)})" for group, column in columns.items()]
    rows = [(name, [f"{column[name].tokens_per_s:.1f}" for column in columns.values()]) for name in merged]
    if PEER_NAME in merged:
        for arm in ("engine-hvd", "engine-ar"):
            rows.append((f"{arm} / {PEER_NAME}", [_ratio(c[arm].tokens_per_s, c[PEER_NAME].tokens_per_s)
                                                 for c in columns.values()]))
        rows.append((f"{PEER_NAME} tokens = engine-ar", [
            f"{same_count(c[PEER_NAME].outputs, c['engine-ar'].outputs)}/{len(c['engine-ar'].outputs)}"
            for c in columns.values()]))
    split_columns = {name: {**by_group, "all": _merge_splits(by_group.values())} for name, by_group in splits.items()}
    for name, by_group in split_columns.items():
        cells = [by_group.get(group, Split()) for group in columns]
        rows.append((f"{name} decode tok/s", [f"{s.decode_tokens_per_s:.1f}" for s in cells]))
        rows.append((f"{name} prefill s", [f"{s.prefill_s:.2f}" for s in cells]))
    if PEER_NAME in split_columns:
        peer = split_columns[PEER_NAME]
        rows.append((f"decode engine-hvd / {PEER_NAME}", [
            _ratio(split_columns["engine-hvd"].get(g, Split()).decode_tokens_per_s,
                   peer.get(g, Split()).decode_tokens_per_s) for g in columns]))
    return heads, rows


def _merge_splits(splits: Iterable[Split]) -> Split:
    total = Split()
    for split in splits:
        total.add(split.tokens, split.prefill_s, split.decode_s)
    return total


def _print_groups(tallies: dict[str, dict[str, Tally]], merged: dict[str, Tally], splits: dict[str, Splits]) -> None:
    heads, rows = group_rows(tallies, merged, splits)
    width = max(len(label) for label, _ in rows) + 2
    print("by prompt group (runs): tok/s = new tokens / seconds of the whole call; decode tok/s = new tokens / "
          "decode seconds (prefill excluded)")
    print(f"{'':<{width}}" + "".join(f"{head:>14}" for head in heads))
    for label, cells in rows:
        print(f"{label:<{width}}" + "".join(f"{cell:>14}" for cell in cells))
