"""``hvd`` against ``ar`` on a GPU with real weights, projected from a CPU run and a GPU run's measurements.

    python scripts/gpu_projection.py BENCH_GPU_JSON [--max-new-tokens 128] [--chat]

The GPU run (``hvd-agents bench-gpu --model random:smollm2-135m --json F``) measured, on random
weights of the embedded model's configuration: the plain step's milliseconds (``t``), the
verification cost profile ``verify(d)`` in plain steps, and what an ``hvd`` step costs beyond its
forward on that machine's host (``h``: ``hvd``'s milliseconds per step minus ``t``, drafting and
the policy included; random weights draft more than real ones, so ``h`` is generous). Random
weights cannot say how often drafts are accepted. This script runs the embedded SmolLM2-135M
(the real weights) on this CPU, ``ar`` and ``hvd`` on the benchmark's agent prompts, with the
GPU's profile as the cost model and prices taken from it alone, its own work weighed against the GPU's
plain step (so ``hvd`` plans the drafts it would plan on that GPU, capped at its 32-token
verification), and projects:

    ar  = tokens * t              hvd = sum over steps of (t * verify(d) + h)

It prints the projection with ``h`` and without it (a device-bound host), for ``hvd`` and for
``hvd-cache`` (each with its own arm's ``h`` where the report has that arm). Every run's greedy
tokens are compared with ``ar``'s: they must be identical.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace

from hvd_agents import Engine, GenerationParams
from hvd_agents.bench.prompts import agent_prompts, chat_prompts
from hvd_agents.chat.render import encode_prompt
from hvd_agents.drafters import HybridDrafter, SuffixDrafter
from hvd_agents.drafters.hybrid.config import HybridConfig
from hvd_agents.drafters.hybrid.pricing import StepPricing
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.token_text import TokenText
from hvd_agents.runtime.loading import load_model

GPU_TREE_TOKENS = 32  # the static runner verifies at most this many draft tokens per step
METHODS = ("hvd", "hvd-cache")  # projected each, with its own arm's host cost when the report has one


def gpu_cost_model(report: dict) -> CostModel:
    """The bitwise runner's profile from a bench-gpu report, with drafts past the GPU's limit priced out."""
    if report.get("cost_points"):
        points = [tuple(p) for p in report["cost_points"] if p[0] <= GPU_TREE_TOKENS]
        return CostModel((*points, (GPU_TREE_TOKENS + 1, 1e3)), source="the GPU's bitwise runner profile")
    pairs = [(int(r), float(c)) for r, c in re.findall(r"(\d+) rows ([\d.]+)", report["cost_profile"])]
    if not pairs:
        raise SystemExit(f"no cost profile in the report: {report['cost_profile']!r}")
    points, previous = [(0, 1.0)], pairs[0][0]
    for rows, cost in pairs[1:]:
        points += [(previous, cost), (rows - 1, cost)] if rows - 1 > previous else [(previous, cost)]
        previous = rows
    points.append((GPU_TREE_TOKENS + 1, 1e3))
    return CostModel(tuple(points), source="the GPU's bitwise runner profile")


def gpu_step(seconds: float) -> None:
    """Let the policy compare its own timed work with the GPU's plain step (``seconds``), not this CPU's: whether
    planning a cache proposal pays for itself (:meth:`~hvd_agents.drafters.HybridDrafter.propose`) depends on
    that ratio."""
    from hvd_agents.policy.calibration import StepCalibration

    StepCalibration.step_s = property(lambda self: seconds)


def untimed_pricing() -> None:
    """Price every draft from the profile alone, as the GPU's timings would price it (not this CPU's)."""
    def untimed(method):
        return lambda self, timed=True: method(self, False)

    for name in ("target_cost", "model_cost"):
        setattr(StepPricing, name, untimed(getattr(StepPricing, name)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="bench-gpu --json output of random:smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chat", action="store_true", help="the chat prompts instead of the agent prompts")
    args = parser.parse_args()
    with open(args.report, encoding="utf-8") as fh:
        report = json.load(fh)
    arms = report["arms"]

    def ms_per_step(arm: str) -> float:
        a = arms[arm]
        return a["tokens"] / a["decode_tokens_per_s"] / a["steps"] * 1e3

    t = ms_per_step("engine-ar (static)")
    cost = gpu_cost_model(report)
    untimed_pricing()
    gpu_step(t / 1e3)
    loaded = load_model(None)
    prompts = chat_prompts() if args.chat else agent_prompts()
    kind = "chat" if args.chat else "agent"
    print(f"GPU ({report['device']}): plain step {t:.3f} ms; profile {report['cost_profile']}")
    identical = checked = 0
    for method in METHODS:
        arm = f"engine-{method} (static)"
        h = max(0.0, ms_per_step(arm) - t) if arm in arms and arms[arm]["steps"] else None
        # a new engine per method: one method's replies must not be in the other's cross-request store
        engine = Engine.from_loaded(loaded, cost_model=cost, draft_head=None, prefix_cache_bytes=0)
        if method == "hvd":  # as the engine's measured profile would allow it: whole proposals where planning costs more
            engine.add_drafter("hvd", HybridDrafter(
                SuffixDrafter(engine.cache_store, text=lambda: TokenText.from_tokenizer(loaded.tokenizer)),
                cost=cost, config=HybridConfig(whole_proposals=True)))
        tokens = steps = 0
        verify = 0.0
        for prompt in prompts:
            ids = encode_prompt(loaded.tokenizer, prompt.messages, prompt.tools)
            params = GenerationParams(max_new_tokens=args.max_new_tokens, reuse_prefix=False)
            ar = engine.generate(ids, replace(params, method="ar"))
            out = engine.generate(ids, replace(params, method=method))
            identical += ar.token_ids == out.token_ids
            checked += 1
            tokens += len(out.token_ids)
            steps += out.stats.steps
            verify += out.stats.steps * cost.verify(round(out.stats.drafted_tokens / max(out.stats.steps, 1)))
        ar_ms = tokens * t
        print(f"{method}: CPU run, embedded SmolLM2-135M, {len(prompts)} {kind} prompts: {tokens} tokens in {steps} "
              f"steps ({tokens / steps:.2f} tokens per step); host cost per step on the GPU h = "
              + (f"{h:.3f} ms" if h is not None else "not measured (no such arm in the report)"))
        for label, host in (("with h", h), ("device-bound (h = 0)", 0.0)):
            if host is None:
                continue
            ms = verify * t + steps * host
            print(f"  projected {method} / ar on the GPU, {label}: {ar_ms / ms:.2f}x ({ar_ms:.0f} ms vs {ms:.0f} ms)")
    print(f"identical to ar: {identical}/{checked}")
    return 0 if identical == checked else 1


if __name__ == "__main__":
    sys.exit(main())
