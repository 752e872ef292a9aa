"""A bounded hostile run against a server on this machine (docs/server.md, "Hostile input").

    hvd-agents serve --port 18150 --api-key hostile &
    python -m tests.hostile_run --url http://127.0.0.1:18150 --key hostile --pid $! --minutes 20

Concurrent clients send, until the time is up, requests drawn from the served ``/openapi.json``
(schemathesis, schema-valid and schema-breaking), randomized chat requests (the strategy of
tests/test_server_fuzz.py), and hand-made extremes (tests/test_soak.py's kinds plus 10 MB
prompts). It samples the server's resident memory, then prints the requests and statuses from
``/metrics``, any 5xx or request over 60 s, and memory at start, peak and end. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import warnings
from collections import Counter
from urllib.parse import urlparse

import httpx
import schemathesis

from tests.test_server_fuzz import _chat
from tests.test_soak import _KINDS, _send

_TEN_MB = ("lorem ipsum dolor sit amet consectetur adipiscing elit " * 190_000)[:10_000_000]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def one_request(client: httpx.Client, schema_cases, rng: random.Random) -> None:
    """Send one hostile request (its answer is counted by the server's /metrics)."""
    pick = rng.random()
    if pick < 0.35:
        case = schema_cases[rng.randrange(2)].example()
        if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
            case.body["model"] = "SmolLM2-135M-Instruct"  # reach the engine, not only the 404
            if "max_tokens" not in case.body and "max_completion_tokens" not in case.body:
                case.body["max_tokens"] = 16  # a whole context window of tokens would hold the worker for minutes
        case.call(headers=dict(client.headers), timeout=120)
    elif pick < 0.65:
        raw = json.dumps(_chat.example()).encode()
        client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    elif pick < 0.70:
        body = rng.choice([{"messages": [{"role": "user", "content": _TEN_MB}]}, {"prompt": _TEN_MB}])
        route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        client.post(route, json={"model": "SmolLM2-135M-Instruct", **body})
    else:
        _send(client, rng.choice(list(_KINDS)), rng)


def _answered(metrics: str) -> dict[str, float]:
    """``hvd_requests_total`` lines as {labelled name: count}."""
    lines = (line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("hvd_requests_total"))
    return {key: float(value) for key, value in lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server's process id (for its resident memory)")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the hostile run only targets a server on this machine")
    warnings.simplefilter("ignore")  # hypothesis warns that .example() is meant for interactive use
    headers = {"Authorization": f"Bearer {args.key}"}
    schema = schemathesis.openapi.from_url(f"{args.url}/openapi.json")
    cases = [schema.as_strategy(generation_mode=mode) for mode in schemathesis.GenerationMode]
    deadline = time.monotonic() + args.minutes * 60
    memory = {"start": rss_mb(args.pid), "peak": 0.0}
    before = _answered(httpx.get(f"{args.url}/metrics", headers=headers).text)
    slow, errors, sent = Counter(), Counter(), Counter()

    def client_loop(index: int) -> None:
        rng = random.Random(index)
        with httpx.Client(base_url=args.url, headers=headers, timeout=120) as client:
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    one_request(client, cases, rng)
                except Exception as exc:  # noqa: BLE001 - a failed request is counted and reported
                    errors[type(exc).__name__] += 1
                sent[index] += 1
                if time.monotonic() - started > 60:
                    slow[index] += 1

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        memory["peak"] = max(memory["peak"], rss_mb(args.pid))
        time.sleep(0.5)
    memory["end"] = rss_mb(args.pid)
    after = _answered(httpx.get(f"{args.url}/metrics", headers=headers).text)
    answered = {key: count - before.get(key, 0) for key, count in after.items() if count > before.get(key, 0)}
    total = sum(answered.values())
    fives = {key: count for key, count in answered.items() if 'status="5' in key}
    health = httpx.get(f"{args.url}/health").status_code
    print(f"{args.minutes:g} min, {args.clients} clients: {sum(sent.values())} requests sent, {total:.0f} answered "
          f"(/metrics, this run); client-side errors {dict(errors)}; over 60 s: {sum(slow.values())}; /health {health}")
    print("\n".join(f"{key} {count:g}" for key, count in sorted(answered.items())))
    print(f"5xx: {fives or 'none'}")
    print(f"resident memory: start {memory['start']:.0f} MB, peak {memory['peak']:.0f} MB, end {memory['end']:.0f} MB")


if __name__ == "__main__":
    main()
