"""The ``hvd-agents bench-batch`` driver: its bursts of calls go through ``ChatHVD``.

The benchmark itself (engines, prompts, the table) is :mod:`hvd_agents.bench.batch`, which
finds this module through the ``hvd_agents.bench`` entry point ``chat-burst``: the core
imports no integration.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

from langchain_core.messages import convert_to_messages

from hvd_agents.bench.batch import BurstResult
from hvd_agents.engine import Engine
from langchain_hvd.chat_models import ChatHVD


async def burst(engine: Engine, prompts: list[tuple[list[dict], list[dict]]], name: str, *, max_tokens: int,
                method: str) -> BurstResult:
    """Send every prompt at once through ``ChatHVD.ainvoke`` on ``engine``; the arm's figures (see
    :mod:`hvd_agents.bench.batch`)."""
    llm = ChatHVD(engine=engine, max_tokens=max_tokens, method=method)
    gaps: list[float] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.02)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def one(messages, tools):
        start = time.perf_counter()
        model = llm.bind_tools(tools) if tools else llm
        reply = await model.ainvoke(convert_to_messages(messages))
        return time.perf_counter() - start, reply

    beat = asyncio.create_task(heartbeat())
    start = time.perf_counter()
    done = await asyncio.gather(*(one(m, t) for m, t in prompts))
    seconds = time.perf_counter() - start
    stop.set()
    await beat
    latencies = sorted(s for s, _ in done)
    tokens = sum(reply.usage_metadata["output_tokens"] for _, reply in done)
    replies = [json.dumps([reply.content, reply.tool_calls], sort_keys=True, default=str) for _, reply in done]
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]
    prefill = sum(reply.response_metadata.get("hvd_stats", {}).get("prefill_s", 0.0) for _, reply in done)
    return BurstResult(name, seconds, tokens, tokens / seconds, statistics.median(latencies), p95,
                       max(gaps, default=0.0), prefill, replies)


async def cancel_delay(engine: Engine, messages: list[dict], *, max_tokens: int, method: str) -> float:
    """Seconds from cancelling a streaming ``ChatHVD.astream`` (after its first chunk) until ``engine``, a batching
    one, holds no request."""
    llm = ChatHVD(engine=engine, max_tokens=max_tokens, method=method)
    batcher = engine.batcher

    first = asyncio.Event()

    async def reader() -> None:
        async for _ in llm.astream(messages):
            first.set()  # keep reading: the request decodes on

    task = asyncio.create_task(reader())
    await first.wait()
    await asyncio.sleep(0.05)  # into a step
    start = time.perf_counter()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    while batcher.pending:
        await asyncio.sleep(0.001)
    return time.perf_counter() - start
