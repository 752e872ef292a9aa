"""Many agents at once: concurrent ``ChatHVD.ainvoke`` calls on a serial and on a batching engine, one run.

``hvd-agents bench-batch`` sends the same ``--requests`` agent and chat requests at once
through LangChain's ``ChatHVD.ainvoke`` (what parallel branches of a LangGraph agent do)
to two engines over the same loaded model: one that serialises requests
(``max_batch=1``) and one that decodes them together (``max_batch=--requests``). For
each it prints aggregate tokens per second (all output tokens over the wall time of the
whole burst), p50 and p95 request latency, and the longest gap of a 20 ms heartbeat
task on the event loop (the loop stays responsive while requests decode) and the seconds
the engine spent prefilling prompts, then the ratio of aggregate throughputs, whether
every request's reply is identical in both arms, and the bound the prefills put on the
ratio (they are compute-bound, the same work in both arms, and run one after another).
Last, a streaming request is cancelled after its first chunk on the batching engine, and
the time until its slot is free is printed (it leaves at the end of the step in progress),
and a one-token decode step is timed on the main thread and on a worker thread (where
async calls, the batcher and the server run their forwards).

The calls go through the chat integration's driver (``langchain_hvd.bench``, found by
its entry point: the core imports no integration). Each arm gets a fresh engine, so neither copies replies the other generated; the
prompts are distinct, so no request can copy another's reply within an arm either.
By default neither arm reuses prefix KV. With ``--reuse-prefix`` both do, as a default
engine does: each request's prompt KV is kept once its prefill is done, so requests
that share a system prompt or tool schemas prefill it once, serial or batched. Which
request reuses which then depends on the order the concurrent calls reach the engine,
which differs between the arms, and on the quantized CPU runner a prompt computed whole
and one resumed from stored KV round differently (the long-prefill path reads float32
weights, the step path the quantized blocks), so a reply can differ on a near tie for a
reason that is not batching: the identical-replies count is then informative only.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from typing import Protocol

import torch

from hvd_agents.bench.prompts import agent_prompts, chat_prompts
from hvd_agents.engine import Engine
from hvd_agents.engine.engine import DEFAULT_PREFIX_CACHE_BYTES
from hvd_agents.errors import InvalidRequestError
from hvd_agents.runtime.loading import load_model

DRIVER_GROUP, DRIVER_NAME = "hvd_agents.bench", "chat-burst"  # the entry point of a chat integration's driver
CITIES = ("Lyon", "Oslo", "Kyoto", "Lima", "Cairo", "Perth", "Quebec", "Turin")


def burst_prompts(n: int) -> list[tuple[list[dict], list[dict]]]:
    """``n`` distinct (messages, tools) requests: the bench's agent and chat prompts, then weather turns for more cities."""
    base = [(p.messages, p.tools) for p in agent_prompts() + chat_prompts()]
    weather = agent_prompts()[0]
    extra = []
    for city in CITIES:
        messages = json.loads(json.dumps(weather.messages).replace("Paris", city))
        extra.append((messages, weather.tools))
    prompts = (base + extra)[:n]
    if len(prompts) < n:
        raise InvalidRequestError(f"--requests is at most {len(base) + len(extra)}, got {n}")
    return prompts


@dataclass
class BurstResult:
    """One arm's figures."""

    name: str
    seconds: float
    output_tokens: int
    tokens_per_s: float
    p50_s: float
    p95_s: float
    heartbeat_max_gap_s: float
    prefill_s: float  # seconds the engine spent prefilling prompts, summed over the requests
    replies: list[str]


class ChatDriver(Protocol):
    """What drives the burst through a chat integration (``langchain_hvd.bench`` for ``ChatHVD``): found
    through the ``hvd_agents.bench`` entry point ``chat-burst``, so the core imports no integration."""

    async def burst(self, engine: Engine, prompts: list[tuple[list[dict], list[dict]]], name: str, *,
                    max_tokens: int, method: str) -> BurstResult:
        """Send every prompt at once through the integration's async call on ``engine``; the arm's figures."""

    async def cancel_delay(self, engine: Engine, messages: list[dict], *, max_tokens: int, method: str) -> float:
        """Seconds from cancelling a streaming request (after its first chunk) until ``engine`` holds none."""


def chat_driver() -> ChatDriver:
    """The installed chat integration's burst driver.

    Raises:
        InvalidRequestError: no installed package provides one (langchain-hvd does).
    """
    found = entry_points(group=DRIVER_GROUP, name=DRIVER_NAME)
    if not found:
        raise InvalidRequestError("bench-batch drives ChatHVD: pip install -e integrations/langchain-hvd")
    return next(iter(found)).load()


def step_ms_by_thread(engine: Engine, context: int = 300, steps: int = 20) -> tuple[float, float]:
    """Median milliseconds of a one-token decode step on the calling thread, then on a new thread.

    Async chat calls, the batcher and the server run forwards on worker threads, so a step
    must cost there what it costs on the main thread (see ``runtime/cpu/native/team.h``).
    """
    kv = engine.runner.new_kv()
    engine.runner.forward(kv, [(7 * i) % 1000 + 1 for i in range(context)], logits_to_keep=1)

    def median_ms() -> float:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.runner.forward(kv, [5])
            times.append(time.perf_counter() - start)
            kv.rollback(context)
        return statistics.median(times) * 1e3

    here = median_ms()
    there: list[float] = []
    worker = threading.Thread(target=lambda: there.append(median_ms()))
    worker.start()
    worker.join()
    kv.release()
    return here, there[0]


def run_batch_benchmark(model: str | None = None, *, device: str | None = None, requests: int = 16,
                        max_tokens: int = 64, method: str = "hvd", json_path: str | None = None,
                        reuse_prefix: bool = False) -> dict:
    """Run the benchmark (see the module docstring) and print its table."""
    driver = chat_driver()
    loaded = load_model(model, device=device)
    prompts = burst_prompts(requests)

    def engine(max_batch: int) -> Engine:
        return Engine.from_loaded(loaded, max_batch=max_batch,
                                  prefix_cache_bytes=DEFAULT_PREFIX_CACHE_BYTES if reuse_prefix else 0)

    results, timed = {}, {}
    for name, max_batch in (("serial", 1), ("batched", requests)):
        warm = engine(max_batch)  # kernels, the cost profile, first-use costs; its replies stay in its own store
        asyncio.run(driver.burst(warm, prompts[:2], name, max_tokens=max_tokens, method=method))
        timed[name] = engine(max_batch)
        results[name] = asyncio.run(driver.burst(timed[name], prompts, name, max_tokens=max_tokens, method=method))
    step_main, step_worker = step_ms_by_thread(timed["serial"])
    cancel_s = asyncio.run(driver.cancel_delay(timed["batched"], prompts[0][0], max_tokens=2000, method=method))
    serial, batched = results["serial"], results["batched"]
    same = sum(a == b for a, b in zip(serial.replies, batched.replies))
    print(f"{requests} concurrent requests through ChatHVD.ainvoke, method {method}, max_tokens {max_tokens}, "
          f"{torch.get_num_threads()} threads, {loaded.device}, prefix reuse {'on' if reuse_prefix else 'off'}")
    print("| engine | wall s | prefill s | output tokens | aggregate tok/s | p50 s | p95 s | heartbeat max gap s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in (serial, batched):
        print(f"| {r.name} | {r.seconds:.2f} | {r.prefill_s:.2f} | {r.output_tokens} | {r.tokens_per_s:.1f} | "
              f"{r.p50_s:.2f} | {r.p95_s:.2f} | {r.heartbeat_max_gap_s:.3f} |")
    print(f"batched / serial aggregate throughput: {batched.tokens_per_s / serial.tokens_per_s:.2f}x; "
          f"identical replies: {same}/{requests}")
    if batched.prefill_s > 0:  # prefill is compute-bound and the same work in both arms
        print(f"the burst's prefills alone bound the ratio: serial wall / batched prefill = "
              f"{serial.seconds / batched.prefill_s:.2f}x, however fast the batched decode")
    print(f"a cancelled streaming request left the batch {cancel_s * 1e3:.0f} ms after its cancellation")
    print(f"a one-token decode step: {step_main:.1f} ms on the main thread, {step_worker:.1f} ms on a worker thread")
    report = {"requests": requests, "max_tokens": max_tokens, "method": method, "reuse_prefix": reuse_prefix,
              "serial": {k: v for k, v in asdict(serial).items() if k != "replies"},
              "batched": {k: v for k, v in asdict(batched).items() if k != "replies"},
              "ratio": batched.tokens_per_s / serial.tokens_per_s, "identical": same, "cancel_s": cancel_s,
              "step_ms_main_thread": step_main, "step_ms_worker_thread": step_worker}
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return report
