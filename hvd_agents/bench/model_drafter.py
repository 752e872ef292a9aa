"""Model-drafter benchmark (``hvd-agents bench-model``): side by side in one run, on the embedded model.

Two workloads, greedy unless ``temperature`` is given, same ``max_new_tokens``, no prefix reuse (this measures
decoding):

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
greedy outputs must match ``ar`` token for token. Sampled (``--temperature``, with ``--top-p`` and a seed per
request), every arm draws from the same distribution p, so its tokens differ from ``ar``'s and the arms'
tokens a second are what compare.

Head files given with ``--head FILE`` add an arm each, ``model:<file stem>``: the ``model`` arm drafting with
that head instead of the engine's own (its layers tapped while it runs, see
:mod:`hvd_agents.bench.head_files`), timed and counted like ``model``: a retrained head's decoding speed
beside the shipped one's, in one run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.head_files import head_files, tapped
from hvd_agents.bench.live import Tally, _cache_runner, _engine_runner, _Item, _timed
from hvd_agents.bench.prompts import agent_prompts, chat_prompts
from hvd_agents.bench.timed import TimedDrafter
from hvd_agents.chat.render import encode_prompt
from hvd_agents.drafters.model.head import DraftHeadDrafter
from hvd_agents.engine import GenerationParams
from hvd_agents.engine.sampling import GREEDY, SamplingParams
from hvd_agents.engine.shared import shared_engine
from hvd_agents.engine.stats import SourceStats
from hvd_agents.errors import HVDError

logger = logging.getLogger(__name__)
ARMS = ("ar", "model", "hvd-cache", "hvd-no-model", "hvd")


@dataclass
class ModelFigures:
    """What a model arm's drafts did."""

    timed: TimedDrafter
    source: str
    taps: tuple[int, ...] = ()  # the layers its head fuses, tapped while it runs
    drafts: int = 0
    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    decode_s: float = 0.0

    @property
    def accepted_per_draft(self) -> float:
        return self.accepted / self.drafts if self.drafts else 0.0

    def reset(self) -> None:
        self.drafts = self.accepted = self.drafted = self.steps = 0
        self.decode_s = 0.0
        self.timed.reset()


def run_model_benchmark(
    model: str | None = None,
    device: str | None = None,
    draft_model: str | None = None,
    max_new_tokens: int = 128,
    k: int = 6,
    rounds: int = 2,
    heads: Sequence[str | Path] = (),
    sampling: SamplingParams = GREEDY,
) -> dict[str, dict[str, Tally]]:
    """Run the benchmark and print its tables; returns tallies by workload and arm.

    ``heads``: head files, each an arm ``model:<file stem>`` beside ``model`` (the module docstring).
    ``sampling``: every arm's temperature, top-p, top-k and seed (greedy by default).
    """
    engine = shared_engine(model, device=device, draft_model=draft_model)
    inner = engine.model_drafter()
    if inner is None:
        raise HVDError("this model has no model drafter: pass --draft-model, or train a head with train-drafter")
    own = engine.draft_head
    models = {"model": ModelFigures(TimedDrafter(inner), getattr(inner, "source", type(inner).__name__),
                                    own.config.taps if own is not None and draft_model is None else ())}
    for stem, head in head_files(engine, heads).items():
        models[f"model:{stem}"] = ModelFigures(TimedDrafter(DraftHeadDrafter(head)), DraftHeadDrafter.source,
                                               head.config.taps)
    for arm, figures in models.items():
        engine.add_drafter(f"{arm}-timed", figures.timed)
    arms = ARMS + tuple(arm for arm in models if arm != "model")
    workloads = {
        "chat": [_Item(p, encode_prompt(engine.tokenizer, p.messages, p.tools)) for p in chat_prompts()],
        "agent": [_Item(p, encode_prompt(engine.tokenizer, p.messages, p.tools)) for p in agent_prompts()],
    }
    # steps by draft source, per policy arm and workload: what the model drafter changed inside hvd
    sources: dict[str, dict[str, dict[str, SourceStats]]] = {arm: {w: {} for w in workloads}
                                                             for arm in ("hvd-no-model", "hvd")}

    def params(method: str, **kw) -> GenerationParams:
        return GenerationParams(max_new_tokens=max_new_tokens, reuse_prefix=False, method=method,
                                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                seed=sampling.seed, **kw)

    def model_runner(arm: str):
        figures = models[arm]
        arm_params = params(f"{arm}-timed", num_draft_tokens=k)

        def run(item: _Item) -> tuple[int, ...]:
            with tapped(engine, figures.taps):
                result = engine.generate(item.ids, arm_params)
            source = result.stats.per_source.get(figures.source)
            if source is not None:
                figures.drafts += source.steps
                figures.accepted += source.accepted
                figures.drafted += source.drafted
            figures.steps += result.stats.steps
            figures.decode_s += result.stats.decode_s
            return result.token_ids

        return run

    runners = {
        "ar": _engine_runner(engine, params("ar")),
        **{arm: model_runner(arm) for arm in models},
        "hvd-cache": _cache_runner(engine, params("hvd-cache", num_draft_tokens=10)),
    }
    hvd_params = params("hvd")
    policy_runners = {(arm, w): _cache_runner(engine, hvd_params, model_drafter=arm == "hvd", sources=sources[arm][w])
                      for arm in sources for w in workloads}
    for run in [*runners.values(), *(policy_runners[arm, "chat"] for arm in sources)]:  # warm-up
        run(workloads["chat"][0])
    for figures in models.values():
        figures.reset()
    for by_workload in sources.values():
        for per_source in by_workload.values():
            per_source.clear()
    tallies = {w: {arm: Tally() for arm in arms} for w in workloads}
    for round_index in range(rounds):
        order = arms if round_index % 2 == 0 else tuple(reversed(arms))
        for workload, items in workloads.items():
            for i, item in enumerate(items):
                logger.info("round %d, %s prompt %d/%d", round_index + 1, workload, i + 1, len(items))
                for arm in order:
                    run = policy_runners[arm, workload] if arm in sources else runners[arm]
                    _timed(run, item, tallies[workload][arm])
    _print(tallies, arms, models, max_new_tokens, k, engine.device, sources, sampling)
    return tallies


def _merge(tallies: Sequence[Tally]) -> Tally:
    merged = Tally()
    for tally in tallies:
        merged.tokens += tally.tokens
        merged.seconds += tally.seconds
        merged.outputs += tally.outputs
    return merged


def _print(tallies, arms: Sequence[str], models: dict[str, ModelFigures], max_new_tokens: int, k: int, device,
           sources: dict[str, dict[str, dict[str, SourceStats]]], sampling: SamplingParams) -> None:
    how = "greedy" if sampling.greedy else (
        f"sampled (temperature={sampling.temperature}, top_p={sampling.top_p}, top_k={sampling.top_k}, "
        f"seed={sampling.seed}: every arm draws from the same p, so tokens differ between arms)")
    print(f"model drafter: {models['model'].source}; {how}, max_new_tokens={max_new_tokens}, model k={k}, hvd k=32, "
          f"device={device}")
    rows = dict(tallies)
    rows["mixed"] = {arm: _merge([tallies[w][arm] for w in tallies]) for arm in arms}
    extra = [arm for arm in models if arm != "model"]
    print(f"{'workload':<8}{'runs':>5}" + "".join(f"{arm + ' tok/s':>20}" for arm in arms)
          + f"{'model/ar':>10}" + "".join(f"{arm + '/ar':>{max(len(arm) + 5, 10)}}" for arm in extra)
          + f"{'hvd/best single':>17}{'hvd/hvd-no-model':>18}{'same tokens':>13}")
    # hvd vs hvd-no-model isolates what the model drafter adds inside hvd
    for workload, by_arm in rows.items():
        ref = by_arm["ar"]
        same = min(sum(a == b for a, b in zip(by_arm[arm].outputs, ref.outputs)) for arm in arms)
        best_single = max(by_arm["model"].tokens_per_s, by_arm["hvd-cache"].tokens_per_s,
                          by_arm["hvd-no-model"].tokens_per_s)
        print(f"{workload:<8}{len(ref.outputs):>5}" + "".join(f"{by_arm[arm].tokens_per_s:>20.1f}" for arm in arms)
              + f"{by_arm['model'].tokens_per_s / ref.tokens_per_s:>9.2f}x"
              + "".join(f"{by_arm[arm].tokens_per_s / ref.tokens_per_s:>{max(len(arm) + 5, 10) - 1}.2f}x" for arm in extra)
              + f"{by_arm['hvd'].tokens_per_s / best_single:>16.2f}x"
              + f"{by_arm['hvd'].tokens_per_s / by_arm['hvd-no-model'].tokens_per_s:>17.2f}x{same:>9}/{len(ref.outputs)}")
    for arm, figures in models.items():
        timed = figures.timed
        target_step = (figures.decode_s - timed.propose_s) / max(figures.steps, 1)
        draft_step = timed.propose_s / max(timed.calls, 1)
        print(f"{arm} drafts: {figures.drafts} drafts, {figures.accepted_per_draft:.2f} accepted tokens per draft "
              f"({figures.accepted}/{figures.drafted} drafted tokens), {figures.steps} steps; drafting "
              f"{draft_step * 1e3:.1f} ms per step = {draft_step / target_step:.2f} of a target step "
              f"({target_step * 1e3:.1f} ms)")
    for arm, by_workload in sources.items():
        for workload, per_source in by_workload.items():
            parts = [f"{name} {per.steps}" + (f" ({per.accepted}/{per.drafted} drafted tokens accepted)" if per.drafted else "")
                     for name, per in sorted(per_source.items())]
            print(f"{arm} steps by draft source, {workload}: {', '.join(parts)}, "
                  f"of {sum(per.steps for per in per_source.values())}")
    print("output tokens sha256: " + "  ".join(f"{arm} {output_digest(rows['mixed'][arm].outputs)}" for arm in arms))
