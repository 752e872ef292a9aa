"""Model-drafter benchmark (``hvd-agents bench-model``): side by side in one run, on the embedded model.

Two workloads, greedy, same ``max_new_tokens``, no prefix reuse (this measures decoding):

* **chat**: free-text prompts held out from the draft head's training
  (:data:`hvd_agents.bench.prompts.CHAT_PROMPTS`), where the context offers
  little to copy;
* **agent**: the agent-style prompts of ``bench`` (tool schemas, tool outputs).

Arms: ``ar`` (no drafts), ``model`` (the model drafter alone, timed),
``hvd-cache`` (the cache drafter alone, fixed K), ``hvd-no-model`` (the payoff
policy over the cache drafter only) and ``hvd`` (payoff-guided choice between
both drafters); "best single" is the best of the three single-drafter arms. The cache arms start from a fresh store per run (no copying an earlier
run's answer). Reported, per workload and for the two together (mixed): tokens
per second of each arm and the ratios; for ``model``: mean accepted tokens per
model draft and the drafter's time per step as a fraction of a target step;
for ``hvd`` and ``hvd-no-model``: their steps by draft source per workload (which
drafter each chose, how often: where they match, the two arms did the same work).
Runs are interleaved prompt by prompt with the arm order alternating per round;
outputs must match ``ar`` token for token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.live import Tally, _cache_runner, _engine_runner, _Item, _timed
from hvd_agents.bench.prompts import agent_prompts, chat_prompts
from hvd_agents.bench.timed import TimedDrafter
from hvd_agents.chat.render import encode_prompt
from hvd_agents.engine import GenerationParams
from hvd_agents.engine.shared import shared_engine
from hvd_agents.engine.stats import SourceStats
from hvd_agents.errors import HVDError

logger = logging.getLogger(__name__)
ARMS = ("ar", "model", "hvd-cache", "hvd-no-model", "hvd")


@dataclass
class ModelFigures:
    """What the ``model`` arm's drafts did."""

    drafts: int = 0
    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    decode_s: float = 0.0

    @property
    def accepted_per_draft(self) -> float:
        return self.accepted / self.drafts if self.drafts else 0.0


def run_model_benchmark(
    model: str | None = None,
    device: str | None = None,
    draft_model: str | None = None,
    max_new_tokens: int = 128,
    k: int = 6,
    rounds: int = 2,
) -> dict[str, dict[str, Tally]]:
    """Run the benchmark and print its tables; returns tallies by workload and arm."""
    engine = shared_engine(model, device=device, draft_model=draft_model)
    inner = engine.model_drafter()
    if inner is None:
        raise HVDError("this model has no model drafter: pass --draft-model, or train a head with train-drafter")
    timed = TimedDrafter(inner)
    engine.add_drafter("model-timed", timed)
    workloads = {
        "chat": [_Item(p, encode_prompt(engine.tokenizer, p.messages, p.tools)) for p in chat_prompts()],
        "agent": [_Item(p, encode_prompt(engine.tokenizer, p.messages, p.tools)) for p in agent_prompts()],
    }
    figures = ModelFigures()
    # steps by draft source, per policy arm and workload: what the model drafter changed inside hvd
    sources: dict[str, dict[str, dict[str, SourceStats]]] = {arm: {w: {} for w in workloads}
                                                             for arm in ("hvd-no-model", "hvd")}

    def run_model(item: _Item) -> tuple[int, ...]:
        params = GenerationParams(max_new_tokens=max_new_tokens, reuse_prefix=False, method="model-timed",
                                  num_draft_tokens=k)
        result = engine.generate(item.ids, params)
        source = result.stats.per_source.get(getattr(inner, "source", ""))
        if source is not None:
            figures.drafts += source.steps
            figures.accepted += source.accepted
            figures.drafted += source.drafted
        figures.steps += result.stats.steps
        figures.decode_s += result.stats.decode_s
        return result.token_ids

    runners = {
        "ar": _engine_runner(engine, GenerationParams(max_new_tokens=max_new_tokens, reuse_prefix=False, method="ar")),
        "model": run_model,
        "hvd-cache": _cache_runner(engine, GenerationParams(max_new_tokens=max_new_tokens, reuse_prefix=False,
                                                            method="hvd-cache", num_draft_tokens=10)),
    }
    hvd_params = GenerationParams(max_new_tokens=max_new_tokens, reuse_prefix=False, method="hvd")
    policy_runners = {(arm, w): _cache_runner(engine, hvd_params, model_drafter=arm == "hvd", sources=sources[arm][w])
                      for arm in sources for w in workloads}
    for run in [*runners.values(), *(policy_runners[arm, "chat"] for arm in sources)]:  # warm-up
        run(workloads["chat"][0])
    figures.__init__()
    for by_workload in sources.values():
        for per_source in by_workload.values():
            per_source.clear()
    timed.reset()
    tallies = {w: {arm: Tally() for arm in ARMS} for w in workloads}
    for round_index in range(rounds):
        order = ARMS if round_index % 2 == 0 else tuple(reversed(ARMS))
        for workload, items in workloads.items():
            for i, item in enumerate(items):
                logger.info("round %d, %s prompt %d/%d", round_index + 1, workload, i + 1, len(items))
                for arm in order:
                    run = policy_runners[arm, workload] if arm in sources else runners[arm]
                    _timed(run, item, tallies[workload][arm])
    _print(tallies, figures, timed, inner, max_new_tokens, k, engine.device, sources)
    return tallies


def _merge(tallies: Sequence[Tally]) -> Tally:
    merged = Tally()
    for tally in tallies:
        merged.tokens += tally.tokens
        merged.seconds += tally.seconds
        merged.outputs += tally.outputs
    return merged


def _print(tallies, figures: ModelFigures, timed: TimedDrafter, inner, max_new_tokens: int, k: int, device,
           sources: dict[str, dict[str, dict[str, SourceStats]]]) -> None:
    source = getattr(inner, "source", type(inner).__name__)
    print(f"model drafter: {source}; greedy, max_new_tokens={max_new_tokens}, model k={k}, hvd k=32, device={device}")
    rows = dict(tallies)
    rows["mixed"] = {arm: _merge([tallies[w][arm] for w in tallies]) for arm in ARMS}
    print(f"{'workload':<8}{'runs':>5}" + "".join(f"{arm + ' tok/s':>20}" for arm in ARMS)
          + f"{'model/ar':>10}{'hvd/best single':>17}{'hvd/hvd-no-model':>18}{'same tokens':>13}")
    # hvd vs hvd-no-model isolates what the model drafter adds inside hvd
    for workload, arms in rows.items():
        ref = arms["ar"]
        same = min(sum(a == b for a, b in zip(arms[arm].outputs, ref.outputs)) for arm in ARMS)
        best_single = max(arms["model"].tokens_per_s, arms["hvd-cache"].tokens_per_s, arms["hvd-no-model"].tokens_per_s)
        print(f"{workload:<8}{len(ref.outputs):>5}" + "".join(f"{arms[arm].tokens_per_s:>20.1f}" for arm in ARMS)
              + f"{arms['model'].tokens_per_s / ref.tokens_per_s:>9.2f}x"
              + f"{arms['hvd'].tokens_per_s / best_single:>16.2f}x"
              + f"{arms['hvd'].tokens_per_s / arms['hvd-no-model'].tokens_per_s:>17.2f}x{same:>9}/{len(ref.outputs)}")
    target_step = (figures.decode_s - timed.propose_s) / max(figures.steps, 1)
    draft_step = timed.propose_s / max(timed.calls, 1)
    print(f"model drafts: {figures.drafts} drafts, {figures.accepted_per_draft:.2f} accepted tokens per draft "
          f"({figures.accepted}/{figures.drafted} drafted tokens), {figures.steps} steps; drafting "
          f"{draft_step * 1e3:.1f} ms per step = {draft_step / target_step:.2f} of a target step ({target_step * 1e3:.1f} ms)")
    for arm, by_workload in sources.items():
        for workload, per_source in by_workload.items():
            parts = [f"{name} {per.steps}" + (f" ({per.accepted}/{per.drafted} drafted tokens accepted)" if per.drafted else "")
                     for name, per in sorted(per_source.items())]
            print(f"{arm} steps by draft source, {workload}: {', '.join(parts)}, "
                  f"of {sum(per.steps for per in per_source.values())}")
    print("output tokens sha256: " + "  ".join(f"{arm} {output_digest(rows['mixed'][arm].outputs)}" for arm in ARMS))
