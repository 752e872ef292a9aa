"""A bounded load test of a running server (``hvd-agents load-test``): many clients, checked answers.

``clients`` concurrent clients send ``requests`` greedy chat requests in all (half of
them streamed) over a few distinct prompts, each with its own ``X-Request-ID``, and the
run stops by itself after ``time_cap_s``. Every answer is checked:

* HTTP 200, the ``X-Request-ID`` echoed back, a well-formed body (a stream: one id over
  all chunks, a finish reason, ``data: [DONE]`` last);
* nothing lost: one answer per request, every completion id distinct;
* nothing mixed up: greedy decoding gives one reply per prompt, so every answer to a
  prompt, streamed or not, must be the same text (an answer meant for another request
  would differ; how many prompts share a reply is reported, as those could not tell).

It prints p50 / p95 latency and throughput. Only point it at a server of your own:
it is meant for loopback.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = (
    "Name one planet of the solar system.",
    "Give one word that rhymes with cat.",
    "What is two plus three?",
    "Name a primary colour.",
    "Say hello in French.",
    "Name a fruit that is yellow.",
    "What is the capital of France?",
    "Name an animal that can fly.",
)


@dataclass
class RequestResult:
    """One load-test request's answer, as the client saw it."""

    index: int
    prompt: int
    stream: bool
    seconds: float
    text: str = ""
    completion_id: str = ""
    error: str | None = None


@dataclass
class LoadReport:
    """What a load test found."""

    requests: int
    clients: int
    wall_s: float
    outcomes: list[RequestResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def latency(self, quantile: float) -> float:
        """A latency quantile (seconds) over the answered requests."""
        times = sorted(o.seconds for o in self.outcomes if o.error is None)
        if not times:
            return float("nan")
        if len(times) == 1:
            return times[0]
        return statistics.quantiles(times, n=100, method="inclusive")[round(quantile * 100) - 1]

    def summary(self) -> str:
        answered = sum(o.error is None for o in self.outcomes)
        good = [o for o in self.outcomes if o.error is None]
        shared = len({o.prompt for o in good}) - len({o.text for o in good})
        lines = [
            (f"{self.requests} requests from {self.clients} clients in {self.wall_s:.1f} s "
             f"({answered / self.wall_s if self.wall_s else 0:.1f} req/s): {answered} answered, "
             f"{len(self.problems)} problems"),
            (f"latency p50 {self.latency(0.5):.3f} s, p95 {self.latency(0.95):.3f} s, "
             f"max {max((o.seconds for o in self.outcomes), default=float('nan')):.3f} s"),
            f"prompts sharing a reply with another prompt: {max(shared, 0)}",
        ]
        lines += [f"  problem: {problem}" for problem in self.problems[:20]]
        return "\n".join(lines)


async def _one(client: httpx.AsyncClient, index: int, model: str, max_tokens: int) -> RequestResult:
    prompt = index % len(PROMPTS)
    stream = index % 2 == 1
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPTS[prompt]}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    request_id = f"load-{index}"
    start = time.perf_counter()
    outcome = RequestResult(index, prompt, stream, 0.0)
    try:
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"X-Request-ID": request_id}) as response:
                _check_status(response, request_id)
                outcome.completion_id, outcome.text = _read_events([line async for line in response.aiter_lines()])
        else:
            response = await client.post("/v1/chat/completions", json=body, headers={"X-Request-ID": request_id})
            _check_status(response, request_id)
            data = response.json()
            outcome.completion_id = data["id"]
            outcome.text = data["choices"][0]["message"]["content"] or ""
    except Exception as exc:  # noqa: BLE001 - every failure is a finding of the test, reported per request
        outcome.error = f"request {index}: {type(exc).__name__}: {exc}"
    outcome.seconds = time.perf_counter() - start
    return outcome


def _check_status(response: httpx.Response, request_id: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}")
    if response.headers.get("x-request-id") != request_id:
        raise RuntimeError(f"X-Request-ID {response.headers.get('x-request-id')!r}, sent {request_id!r}")


def _read_events(lines: list[str]) -> tuple[str, str]:
    """The completion id and text of an SSE chat stream; raises on a malformed one."""
    events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        raise RuntimeError("the stream did not end with [DONE]")
    chunks = [json.loads(event) for event in events[:-1]]
    ids = {chunk["id"] for chunk in chunks}
    if len(ids) != 1:
        raise RuntimeError(f"chunks of one stream carry {len(ids)} ids")
    if not any(choice.get("finish_reason") for chunk in chunks for choice in chunk["choices"]):
        raise RuntimeError("no chunk has a finish_reason")
    text = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
    return ids.pop(), text


async def run_load_test_async(base_url: str, requests: int = 200, clients: int = 16, max_tokens: int = 24,
                              time_cap_s: float = 60.0, api_key: str | None = None,
                              model: str | None = None) -> LoadReport:
    """Run the load test against ``base_url`` (``http://127.0.0.1:8000``); see the module docstring."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=time_cap_s, limits=limits) as client:
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        todo = iter(range(requests))
        outcomes: list[RequestResult] = []

        async def worker() -> None:
            for index in todo:
                outcomes.append(await _one(client, index, model, max_tokens))

        start = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(clients)]
        _, unfinished = await asyncio.wait(tasks, timeout=time_cap_s)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        wall = time.perf_counter() - start
    report = LoadReport(requests, clients, wall, sorted(outcomes, key=lambda o: o.index))
    report.problems = _problems(report, requests, time_cap_s)
    return report


def _problems(report: LoadReport, requests: int, time_cap_s: float) -> list[str]:
    problems = [o.error for o in report.outcomes if o.error is not None]
    if len(report.outcomes) < requests:
        problems.append(f"{requests - len(report.outcomes)} requests not answered within {time_cap_s:g} s")
    answered = [o for o in report.outcomes if o.error is None]
    if len({o.completion_id for o in answered}) != len(answered):
        problems.append("completion ids repeat across requests")
    replies: dict[int, set[str]] = defaultdict(set)
    for outcome in answered:
        replies[outcome.prompt].add(outcome.text)
    for prompt, texts in sorted(replies.items()):
        if len(texts) != 1:
            problems.append(f"prompt {prompt} got {len(texts)} different greedy replies: {sorted(texts)[:3]!r}")
    return problems


def run_load_test(base_url: str, **options: Any) -> LoadReport:
    """:func:`run_load_test_async` from synchronous code."""
    return asyncio.run(run_load_test_async(base_url, **options))
