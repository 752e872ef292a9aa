"""Prometheus metrics of the server, in the text exposition format (``GET /metrics``).

Counters: requests by endpoint and status, prompt and completion tokens, drafted and
accepted draft tokens by draft source, prompt tokens whose KV was reused (prefix
cache) or prefilled, cancelled requests. A histogram of accepted length (tokens
emitted per verification step: the accepted draft tokens plus the target's own) and
one of request latency; gauges for requests queued or running.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hvd_agents.chat.reply import ReplySummary

# Upper bounds of the histograms' buckets: tokens per step (1 = no draft token accepted;
# hvd verifies at most 32 draft tokens a step by default) and seconds per request.
STEP_TOKEN_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 33)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    escaped = (value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, value in pairs)
    return "{" + ",".join(f'{name}="{value}"' for (name, _), value in zip(pairs, escaped)) + "}"


class _Family:
    """One metric: a name, a help line, a type and its labelled values."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def add(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        if not self.values and self.kind != "counter":
            return lines
        for key, value in sorted(self.values.items()) or [((), 0.0)]:
            lines.append(f"{self.name}{_labels(key)} {value:g}")
        return lines


class _Histogram:
    """A histogram without labels: cumulative buckets, sum and count."""

    def __init__(self, name: str, help_text: str, bounds: Sequence[float]) -> None:
        self.name, self.help, self.bounds = name, help_text, tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for bound, count in zip(self.bounds, self.counts):
            lines.append(f'{self.name}_bucket{{le="{bound:g}"}} {count}')
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum:g}",
                  f"{self.name}_count {self.count}"]
        return lines


class ServerMetrics:
    """The server's metrics; every method is thread-safe (the worker and the event loop both report)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = _Family("hvd_requests_total", "counter", "Requests answered, by endpoint and HTTP status.")
        self.cancelled = _Family("hvd_requests_cancelled_total", "counter",
                                 "Generations stopped because the client went away.")
        self.prompt_tokens = _Family("hvd_prompt_tokens_total", "counter", "Prompt tokens of finished requests.")
        self.completion_tokens = _Family("hvd_completion_tokens_total", "counter",
                                         "Tokens generated, cancelled requests included.")
        self.drafted = _Family("hvd_drafted_tokens_total", "counter", "Draft tokens verified, by draft source.")
        self.accepted = _Family("hvd_accepted_tokens_total", "counter", "Draft tokens accepted, by draft source.")
        self.reused = _Family("hvd_prefix_reused_tokens_total", "counter",
                              "Prompt tokens whose KV was reused from the prefix cache.")
        self.prefilled = _Family("hvd_prefilled_tokens_total", "counter", "Prompt tokens prefilled.")
        self.pending = _Family("hvd_requests_pending", "gauge", "Generation requests queued or running.")
        self.accepted_length = _Histogram("hvd_accepted_length", "Tokens emitted per verification step "
                                          "(accepted draft tokens plus the target's token).", STEP_TOKEN_BUCKETS)
        self.latency = _Histogram("hvd_request_seconds", "Time from a generation request's arrival to its last byte.",
                                  LATENCY_BUCKETS)

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests.add(endpoint=endpoint, status=str(status))

    def step(self, tokens: int) -> None:
        """One engine step that emitted ``tokens``."""
        with self._lock:
            self.completion_tokens.add(tokens)
            if tokens:
                self.accepted_length.observe(tokens)

    def finished(self, summary: ReplySummary | None, seconds: float) -> None:
        """A generation that ran to its end."""
        with self._lock:
            self.latency.observe(seconds)
            if summary is None:
                return
            stats = summary.hvd_stats
            self.prompt_tokens.add(summary.prompt_tokens)
            self.reused.add(stats.get("reused_prefix_tokens", 0))
            self.prefilled.add(stats.get("prefilled_tokens", 0))
            for source, per in stats.get("per_source", {}).items():
                self.drafted.add(per["drafted"], source=source)
                self.accepted.add(per["accepted"], source=source)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled.add()

    def set_pending(self, count: int) -> None:
        with self._lock:
            self.pending.set(count)

    def render(self) -> str:
        """The exposition text."""
        with self._lock:
            families = (self.requests, self.cancelled, self.prompt_tokens, self.completion_tokens, self.drafted,
                        self.accepted, self.reused, self.prefilled, self.pending, self.accepted_length, self.latency)
            return "\n".join(line for family in families for line in family.render()) + "\n"


class StatusCountMiddleware:
    """ASGI middleware counting every HTTP answer in ``hvd_requests_total`` by route and status.

    Paths outside ``routes`` are counted as ``other``, so unknown URLs cannot grow the label set.
    """

    def __init__(self, app, metrics: ServerMetrics, routes: Sequence[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(routes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in self.routes else "other"

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.request(endpoint, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)
