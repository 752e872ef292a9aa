"""Live benchmark: the engine against HF ``generate``, side by side in one run.

For every prompt, five runs on the same model, greedy, same max_new_tokens:

* HF ``generate(do_sample=False)``: what a langchain-huggingface user gets;
* engine ``ar``: our loop without drafts (overhead check, goal within 10% of HF);
* HF ``generate(prompt_lookup_num_tokens=k)``: the prompt-lookup peer;
* engine ``pld``: the same algorithm inside our loop (goal: at least equal);
* engine ``hvd-cache``: the cache drafter, with the prompt's structure (system
  prompt, tool schemas, call skeletons, turns) registered in a fresh store per run;
* engine ``hvd``: the same cache drafter with the payoff predictor and the measured
  cost model choosing each step's draft length (fresh store per run too).

Each configuration runs once to warm up, then the runs are interleaved prompt by
prompt, in ``rounds`` rounds whose configuration order alternates (forward, then
reversed), so both sides see the same machine state and no side always runs first. Outputs must be identical token
for token; any mismatch is reported. Figures are ratios measured in this run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.prompts import AgentPrompt, agent_prompts
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.template import encode_prompt
from hvd_agents.drafters import CacheStore
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.engine.shared import shared_engine
from hvd_agents.engine.stats import SourceStats

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


@dataclass(frozen=True)
class _Item:
    """One benchmark prompt, rendered once."""

    prompt: AgentPrompt
    ids: list[int]


Runner = Callable[[_Item], tuple[int, ...]]


def _hf_runner(engine: Engine, max_new_tokens: int, **extra) -> Runner:
    model = engine.model
    eos = list(engine.eos_token_ids)

    def run(item: _Item) -> tuple[int, ...]:
        ids = torch.tensor([item.ids], device=engine.device)  # [1, n]
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
                **extra,
            )
        return tuple(out[0, len(item.ids) :].tolist())

    return run


def _engine_runner(engine: Engine, params: GenerationParams) -> Runner:
    def run(item: _Item) -> tuple[int, ...]:
        return engine.generate(item.ids, params).token_ids

    return run


def _cache_runner(
    engine: Engine,
    params: GenerationParams,
    *,
    model_drafter: bool = True,
    sources: dict[str, SourceStats] | None = None,
) -> Runner:
    """A cache method with the prompt's structure registered in a FRESH store (and drafter) per
    run, so no run can copy an earlier run's output of the same prompt; ``model_drafter=False``
    leaves the engine's model drafter out. ``sources`` adds up the runs' steps by draft source
    (``"suffix"``, ``"head"``, ``"none"``, ...)."""
    cost = engine.cost_model()

    def run(item: _Item) -> tuple[int, ...]:
        fresh = Engine(engine.model, engine.tokenizer, eos_token_ids=engine.eos_token_ids,
                       context_window=engine.context_window, cache_store=CacheStore(), cost_model=cost,
                       draft_model=engine.draft_model if model_drafter else None,
                       draft_head=engine.draft_head if model_drafter else None)
        structure = prepare(fresh, item.prompt.messages, item.prompt.tools)
        result = fresh.generate(structure.prompt_ids, params, structure=structure)
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
) -> dict[str, Tally]:
    """Run the benchmark and print its table; returns the tallies by configuration name.

    ``k`` is the draft length of the fixed-length methods; ``hvd_k`` the most draft
    tokens ``hvd`` may verify (its policy picks the length each step; default: its own, 32).
    """
    engine = shared_engine(model, device=device)
    items = [_Item(p, encode_prompt(engine.tokenizer, p.messages, p.tools)) for p in agent_prompts()]
    # prefill reuse across repeated runs of a prompt would favour the engine: off here
    # (measured by bench-prefix); this benchmark compares decoding
    params = GenerationParams(max_new_tokens=max_new_tokens, num_draft_tokens=k, reuse_prefix=False)
    runners = {
        "hf-generate": _hf_runner(engine, max_new_tokens),
        "engine-ar": _engine_runner(engine, replace(params, method="ar")),
        "hf-prompt-lookup": _hf_runner(engine, max_new_tokens, prompt_lookup_num_tokens=k),
        "engine-pld": _engine_runner(engine, replace(params, method="pld")),
        "engine-hvd-cache": _cache_runner(engine, replace(params, method="hvd-cache")),
        "engine-hvd": _cache_runner(engine, GenerationParams(max_new_tokens=max_new_tokens, method="hvd",
                                                             num_draft_tokens=hvd_k, reuse_prefix=False)),
    }
    for run in runners.values():  # warm-up (allocator, kernels)
        run(items[-1])
    tallies = {name: Tally() for name in runners}
    order = list(runners)
    for round_index in range(rounds):
        for i, item in enumerate(items):
            logger.info("round %d, prompt %d/%d (%d tokens)", round_index + 1, i + 1, len(items), len(item.ids))
            for name in order if round_index % 2 == 0 else reversed(order):
                _timed(runners[name], item, tallies[name])
    _print_table(tallies, [item.ids for item in items] * rounds, max_new_tokens, k, engine.device)
    return tallies


def _print_table(
    tallies: dict[str, Tally], prompts: Sequence[list[int]], max_new_tokens: int, k: int, device: torch.device
) -> None:
    reference = tallies["hf-generate"]
    mean_prompt = sum(len(p) for p in prompts) / len(prompts)
    print(f"{len(prompts)} runs of agent-style prompts (mean {mean_prompt:.0f} tokens), greedy, "
          f"max_new_tokens={max_new_tokens}, k={k}, device={device}")
    print(f"{'configuration':<18}{'tokens':>8}{'seconds':>10}{'tok/s':>9}{'vs hf-generate':>16}{'same tokens':>13}")
    for name, tally in tallies.items():
        same = sum(a == b for a, b in zip(tally.outputs, reference.outputs))
        ratio = tally.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s else 0.0
        print(f"{name:<18}{tally.tokens:>8}{tally.seconds:>10.2f}{tally.tokens_per_s:>9.1f}"
              f"{ratio:>15.2f}x{same:>9}/{len(prompts)}")
    ar = tallies["engine-ar"].tokens_per_s / reference.tokens_per_s
    pld = tallies["engine-pld"].tokens_per_s / tallies["hf-prompt-lookup"].tokens_per_s
    cache = tallies["engine-hvd-cache"].tokens_per_s / tallies["hf-prompt-lookup"].tokens_per_s
    hvd = tallies["engine-hvd"].tokens_per_s
    print(f"engine-ar / hf-generate: {ar:.2f}x   engine-pld / hf-prompt-lookup: {pld:.2f}x   "
          f"engine-hvd-cache / hf-prompt-lookup: {cache:.2f}x")
    print(f"engine-hvd / engine-hvd-cache: {hvd / tallies['engine-hvd-cache'].tokens_per_s:.2f}x   "
          f"engine-hvd / engine-pld: {hvd / tallies['engine-pld'].tokens_per_s:.2f}x   "
          f"engine-hvd / hf-generate: {hvd / reference.tokens_per_s:.2f}x")
    print("output tokens sha256: " + "  ".join(f"{name} {output_digest(t.outputs)}" for name, t in tallies.items()))
