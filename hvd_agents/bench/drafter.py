"""Micro-benchmark of the cache drafter: propose and update cost at scale.

Builds a store of ``store_tokens`` tokens (spans of agent-like text: a small
vocabulary of repeated phrases with random fill, so lookups find real matches),
starts a request with a ``context_tokens``-token prompt, then times, over
``steps`` decode steps: ``propose`` (lookup in context and store + draft walk)
and ``observe`` per appended token (the incremental index update); and, for every
non-empty draft, the ``hvd`` policy's own work: the payoff prediction with the
length choice (before verification) and the online update (after). Prints
medians. No model is involved.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from hvd_agents.drafters import CacheStore, DraftContext, DraftOutcome, SuffixDrafter
from hvd_agents.drafters.base import Draft
from hvd_agents.policy import CostModel, PayoffPredictor, best_length
from hvd_agents.structure import SpanKind


def _agentlike(rng: np.random.Generator, n: int, phrases: list[np.ndarray], vocab: int) -> np.ndarray:
    """Token stream mixing copies of shared phrases (60%) with random tokens."""
    out: list[np.ndarray] = []
    total = 0
    while total < n:
        piece = phrases[rng.integers(len(phrases))] if rng.random() < 0.6 else rng.integers(0, vocab, 8)
        out.append(piece)
        total += len(piece)
    return np.concatenate(out)[:n]


def run_drafter_benchmark(
    store_tokens: int = 1_000_000, context_tokens: int = 32_000, steps: int = 2_000, k: int = 16, seed: int = 0
) -> dict[str, float]:
    """Run the micro-benchmark, print its figures and return them."""
    rng = np.random.default_rng(seed)
    vocab = 49_152
    phrases = [rng.integers(0, vocab, rng.integers(6, 40)) for _ in range(2_000)]
    store = CacheStore(token_budget=store_tokens + 1)
    start = time.perf_counter()
    data = _agentlike(rng, store_tokens, phrases, vocab)
    for offset in range(0, store_tokens, 500):
        store.add(data[offset : offset + 500].tolist(), SpanKind.GENERATED)
    build_s = time.perf_counter() - start
    drafter = SuffixDrafter(store, register_outputs=False)
    stream = _agentlike(rng, context_tokens + steps * 4, phrases, vocab).tolist()
    context = stream[:context_tokens]
    drafter.start("bench", context)
    predictor, cost = PayoffPredictor(), CostModel.fallback()
    propose_ms, update_ms, predict_us, learn_us, drafted = [], [], [], [], 0
    position = context_tokens
    for _ in range(steps):
        t0 = time.perf_counter()
        draft = drafter.propose(DraftContext("bench", context, context_tokens), k)
        t1 = time.perf_counter()
        new = tuple(stream[position : position + 3])  # as if 2 draft tokens + 1 bonus were accepted
        drafter.observe(DraftOutcome("bench", Draft(), 0, new))
        t2 = time.perf_counter()
        context.extend(new)
        position += len(new)
        drafted += len(draft)
        if draft.token_ids:
            t3 = time.perf_counter()
            best_length(predictor.survival(draft.features, len(draft), "bench"), cost, rate=4.0)
            t4 = time.perf_counter()
            predictor.update(draft.features, len(draft), 2, "bench")
            predict_us.append((t4 - t3) * 1e6)
            learn_us.append((time.perf_counter() - t4) * 1e6)
        propose_ms.append((t1 - t0) * 1e3)
        update_ms.append((t2 - t1) * 1e3 / len(new))
    figures = {
        "store_tokens": float(store.num_tokens),
        "context_tokens": float(context_tokens),
        "store_build_s": build_s,
        "propose_ms_median": statistics.median(propose_ms),
        "propose_ms_p90": float(np.percentile(propose_ms, 90)),
        "update_ms_per_token_median": statistics.median(update_ms),
        "mean_draft_len": drafted / steps,
        "payoff_predict_us_median": statistics.median(predict_us) if predict_us else 0.0,
        "payoff_update_us_median": statistics.median(learn_us) if learn_us else 0.0,
    }
    print(f"store {store.num_tokens:,} tokens (built in {build_s:.1f} s), context {context_tokens:,} tokens, "
          f"{steps} steps, k={k}")
    print(f"propose: median {figures['propose_ms_median']:.3f} ms, p90 {figures['propose_ms_p90']:.3f} ms "
          f"(mean draft {figures['mean_draft_len']:.1f} tokens)")
    print(f"update:  median {figures['update_ms_per_token_median']:.4f} ms per token")
    print(f"hvd policy per drafted step: predict + choose length {figures['payoff_predict_us_median']:.1f} us, "
          f"online update {figures['payoff_update_us_median']:.1f} us (median over {len(predict_us)} drafts)")
    return figures
