"""A soak of a batching engine (tiny model): mixed lengths and methods, prompts prefilled in
chunks, some requests cancelled mid-stream, some past their deadline, some invalid. Nothing is
lost: every request is answered in full, ends with its documented error, or was cancelled by its
caller; the engine ends idle, holding no request, and resident memory stays within a stated
bound.

150 requests in the suite; ``HVD_SOAK_REQUESTS=1000 pytest tests/test_soak.py`` runs the long soak."""

from __future__ import annotations

import os
import random
import resource
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from hvd_agents import Engine, GenerationParams
from hvd_agents.errors import ContextLengthError, InvalidRequestError, RequestTimeoutError
from hvd_agents.policy import CostModel
from tests.tiny import make_tiny_llama

VOCAB = 64
REQUESTS = int(os.environ.get("HVD_SOAK_REQUESTS", "150"))
RSS_GROWTH_BOUND_MB = 200  # the prefix cache's budget below, plus room for allocator noise


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def test_a_thousand_mixed_requests_lose_nothing(capsys) -> None:
    model = make_tiny_llama(VOCAB, seed=4, dtype=__import__("torch").float32)
    engine = Engine(model, eos_token_ids=(), draft_head=None, max_batch=16, cost_model=CostModel.linear(0.1),
                    prefix_cache_bytes=64 << 20, prefill_chunk=16)
    rng = random.Random(0)
    jobs = []
    for i in range(REQUESTS):
        kind = rng.choices(["ok", "cancel", "late", "empty", "too-long", "bad-method"], [76, 10, 4, 4, 3, 3])[0]
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 60))]
        jobs.append((i, kind, prompt, rng.randint(1, 12), rng.choice(["ar", "pld", "hvd-cache", "hvd"])))

    def run(i, kind, prompt, n, method):
        try:
            if kind == "empty":
                prompt = []
            elif kind == "too-long":
                prompt = prompt * 600  # over the 512-token window
            params = GenerationParams(max_new_tokens=n if kind != "late" else 400, timeout_s=0.05 if kind == "late" else None,
                                      method="nope" if kind == "bad-method" else method)
            stream = engine.stream(prompt, params)
            tokens = []
            for event in stream:
                tokens.extend(event.token_ids)
                if kind == "cancel" and len(tokens) >= 1:
                    stream.close()
                    return i, "cancelled", len(tokens)
                if event.finish_reason is not None:
                    return i, event.finish_reason, len(tokens)
            return i, "cancelled" if kind == "cancel" else "lost", len(tokens)
        except (InvalidRequestError, ContextLengthError, RequestTimeoutError) as exc:
            return i, type(exc).__name__, 0

    before = rss_mb()
    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(lambda job: run(*job), jobs))
    growth = rss_mb() - before
    assert sorted(i for i, _, _ in outcomes) == list(range(REQUESTS))  # every request came back
    expected = {"ok": "length", "cancel": "cancelled", "late": "RequestTimeoutError", "empty": "InvalidRequestError",
                "too-long": "ContextLengthError", "bad-method": "InvalidRequestError"}
    for (i, kind, _, n, _), (_, outcome, count) in zip(jobs, outcomes):
        assert outcome == expected[kind] or (kind == "cancel" and outcome == "length"), (i, kind, outcome)
        if kind == "ok":
            assert count == n  # answered in full
    for _ in range(500):  # the worker updates the batch just after it delivers a last event
        if engine._batcher.pending == 0:
            break
        time.sleep(0.01)
    assert engine._batcher.pending == 0  # nothing left running or waiting
    assert engine._batcher.largest_batch > 1
    with capsys.disabled():
        counts = Counter(outcome for _, outcome, _ in outcomes)
        print(f"\n{REQUESTS} requests: {dict(sorted(counts.items()))}; largest batch {engine._batcher.largest_batch}, "
              f"{engine._batcher.steps} steps; peak resident memory grew {growth:.0f} MB (bound {RSS_GROWTH_BOUND_MB})")
    assert growth < RSS_GROWTH_BOUND_MB, f"resident memory grew {growth:.0f} MB"
