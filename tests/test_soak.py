"""A soak of a batching engine (tiny model): mixed lengths and methods, prompts prefilled in
chunks, some requests cancelled mid-stream, some past their deadline, some invalid. Nothing is
lost: every request is answered in full, ends with its documented error, or was cancelled by its
caller; the engine ends idle, holding no request, and resident memory stays within a stated
bound.

150 requests in the suite; ``HVD_SOAK_REQUESTS=1000 pytest tests/test_soak.py`` runs the long soak.

The server soak sends the server (tiny model, loopback) a mix of good, huge and malformed
requests from concurrent clients (10 MB-class prompts, token-id floods, deep nesting, bad JSON,
lone surrogates, huge seeds, unknown models, clients that leave mid-stream): no answer is a
5xx, ``/health`` stays live, and resident memory stays under the bound docs/server.md states
(the prefix cache's and the store's budgets plus a margin over the starting point). 80 requests
in the suite; ``HVD_SOAK_SERVER_REQUESTS=2000`` runs the long one."""

from __future__ import annotations

import os
import random
import resource
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from hvd_agents import Engine, GenerationParams
from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.errors import ContextLengthError, InvalidRequestError, RequestTimeoutError
from hvd_agents.policy import CostModel
from tests.helpers import IM_END_ID
from tests.server_helpers import running_server
from tests.tiny import make_tiny_llama

VOCAB = 64
REQUESTS = int(os.environ.get("HVD_SOAK_REQUESTS", "150"))
RSS_GROWTH_BOUND_MB = 200  # the prefix cache's budget below, plus room for allocator noise


SERVER_REQUESTS = int(os.environ.get("HVD_SOAK_SERVER_REQUESTS", "80"))
# The server's resident-memory bound over its starting point (docs/server.md): the prefix cache's
# budget, the store's (at most twice its token budget indexed, ~0.5 KB per indexed token), and a
# margin for the requests in flight (8 clients, 2 MB bodies and their parsed copies) and the allocator.
PREFIX_CACHE_BYTES = 64 << 20
STORE_TOKENS = 100_000
SERVER_BOUND_MB = PREFIX_CACHE_BYTES / 2**20 + 2 * STORE_TOKENS * 512 / 2**20 + 200


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mb() -> float:
    """Resident memory now (Linux), not the peak."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


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
        if engine.batcher.pending == 0:
            break
        time.sleep(0.01)
    assert engine.batcher.pending == 0  # nothing left running or waiting
    assert engine.batcher.largest_batch > 1
    with capsys.disabled():
        counts = Counter(outcome for _, outcome, _ in outcomes)
        print(f"\n{REQUESTS} requests: {dict(sorted(counts.items()))}; largest batch {engine.batcher.largest_batch}, "
              f"{engine.batcher.steps} steps; peak resident memory grew {growth:.0f} MB (bound {RSS_GROWTH_BOUND_MB})")
    assert growth < RSS_GROWTH_BOUND_MB, f"resident memory grew {growth:.0f} MB"


_MODEL = "SmolLM2-135M-Instruct"
_HUGE = "lorem ipsum dolor sit amet " * 80_000  # 2.2 MB
_KINDS = {  # kind: (weight, statuses it may get)
    "chat": (30, {200}), "stream": (15, {200}), "completion": (10, {200}), "leave": (6, {200}),
    "huge-chat": (6, {400}), "huge-completion": (5, {400}), "id-flood": (4, {400}), "near-bound": (4, {400}),
    "bad-json": (4, {400}), "deep": (3, {400}), "wrong-type": (4, {400}), "surrogate": (3, {400}),
    "big-seed": (3, {400}), "unknown-model": (3, {404}),
}


def _send(client: httpx.Client, kind: str, rng: random.Random) -> int:
    chat, headers = "/v1/chat/completions", {"content-type": "application/json"}
    short = {"model": _MODEL, "messages": [{"role": "user", "content": f"Say {rng.randrange(10**6)}."}],
             "max_tokens": rng.randint(1, 6)}
    if kind in ("chat", "stream"):
        return client.post(chat, json={**short, "stream": kind == "stream"}).status_code
    if kind == "completion":
        return client.post("/v1/completions", json={"model": _MODEL, "prompt": "Once", "max_tokens": 3}).status_code
    if kind == "leave":  # a client that reads the first event and goes away
        with client.stream("POST", chat, json={**short, "max_tokens": 200, "stream": True}) as response:
            next(response.iter_bytes(), None)
            return response.status_code
    bodies = {
        "huge-chat": (chat, {"model": _MODEL, "messages": [{"role": "user", "content": _HUGE}]}),
        "huge-completion": ("/v1/completions", {"model": _MODEL, "prompt": _HUGE}),
        "id-flood": ("/v1/completions", {"model": _MODEL, "prompt": [rng.randrange(200) for _ in range(100_000)]}),
        "near-bound": (chat, {"model": _MODEL, "messages": [{"role": "user", "content": "ab " * 1_500}]}),
        "wrong-type": (chat, {"model": _MODEL, "messages": "hello"}),
        "big-seed": (chat, {**short, "seed": 2**64 + rng.randrange(10**9)}),
        "unknown-model": (chat, {**short, "model": "gpt-4o"}),
    }
    if kind in bodies:
        route, body = bodies[kind]
        return client.post(route, json=body).status_code
    raw = {
        "bad-json": b'{"model": "m", "messages": [',
        "deep": b'{"model": "m", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        "surrogate": b'{"model": "%s", "prompt": "a\\udc80b"}' % _MODEL.encode(),
    }[kind]
    return client.post(chat if kind != "surrogate" else "/v1/completions", content=raw, headers=headers).status_code


def test_the_server_under_huge_and_malformed_requests(tiny_model, byte_tokenizer, capsys) -> None:
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(IM_END_ID,), prefix_cache_bytes=PREFIX_CACHE_BYTES,
                    cache_store=CacheStore(token_budget=STORE_TOKENS))
    rng = random.Random(1)
    kinds = rng.choices(list(_KINDS), [weight for weight, _ in _KINDS.values()], k=SERVER_REQUESTS)
    with running_server(engine) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            _send(client, "chat", rng)  # warm up before the starting point
        start = peak = current_rss_mb()
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not done.wait(0.05):
                peak = max(peak, current_rss_mb())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        def run(job: tuple[int, str]) -> tuple[str, int]:
            index, kind = job
            with httpx.Client(base_url=url, timeout=120) as client:
                return kind, _send(client, kind, random.Random(index))

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(run, enumerate(kinds)))
        done.set()
        watcher.join()
        end = current_rss_mb()
        health = httpx.get(f"{url}/health", timeout=60).status_code
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
    wrong = [(kind, status) for kind, status in outcomes if status not in _KINDS[kind][1]]
    assert not wrong, wrong
    assert health == 200
    assert not [line for line in metrics.splitlines() if line.startswith("hvd_requests_total") and 'status="5' in line]
    with capsys.disabled():
        print(f"\nserver soak, {SERVER_REQUESTS} requests {dict(sorted(Counter(kinds).items()))}: resident memory "
              f"{start:.0f} MB at start, peak {peak:.0f}, end {end:.0f} (bound start + {SERVER_BOUND_MB:.0f} MB)")
    assert peak - start < SERVER_BOUND_MB, f"resident memory peaked {peak - start:.0f} MB over its start"
