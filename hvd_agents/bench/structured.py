"""``hvd-agents bench-structured``: structured output judged through the server, and its speed.

Three parts, each optional, all on one engine in one run:

* **Schemas** (``--schemas DIR``): each JSON schema file of a directory (sorted, the first
  ``--limit``) sent as ``response_format`` ``json_schema`` to ``/v1/chat/completions`` of the
  in-process server (its validation, errors and shaping). Counted: answered, refused with a
  400 (grouped by reason), server errors (5xx), replies cut by ``max_tokens``, and replies
  that validate against their schema (``jsonschema``).
* **Function calls** (``--bfcl FILE``): BFCL questions (``live_simple`` format: ``question``,
  ``function``) with their functions as strict tools and ``tool_choice: "required"``; counted:
  calls whose arguments validate against the function's schema, the expected function picked,
  and (with ``--answers FILE``) every argument among BFCL's accepted values.
* **Speed** (``--speed``): the same chat requests decoded by ``ar`` without and with their
  grammar, and by ``hvd`` with it (greedy; identical tokens checked): the mask's cost per token
  and its share of a step, and ``hvd``'s decoding speed over constrained ``ar`` with the share
  of accepted tokens each draft source gave.
"""

from __future__ import annotations

import collections
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvd_agents.chat.delta_stream import collect, stream_reply_deltas
from hvd_agents.chat.request import ChatSettings, build_chat_request
from hvd_agents.engine import Engine

logger = logging.getLogger(__name__)

BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


@dataclass
class SchemaTally:
    """What happened to the schemas sent as ``response_format``."""

    sent: int = 0
    answered: int = 0
    valid: int = 0
    cut: int = 0
    server_errors: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)
    invalid: list[str] = field(default_factory=list)


def bfcl_schema(schema: Any) -> Any:
    """A BFCL parameter schema as JSON Schema (``dict`` -> ``object``, ``float`` -> ``number``, ...)."""
    if isinstance(schema, list):
        return [bfcl_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: bfcl_schema(value) for key, value in schema.items() if key not in ("default", "optional")}
    if isinstance(out.get("type"), str) and out["type"] in BFCL_TYPES:
        kind = BFCL_TYPES[out["type"]]
        if kind is None:
            out.pop("type")
        else:
            out["type"] = kind
    return out


def refusal_reason(message: str) -> str:
    """A 400's message reduced to its kind (the keyword or format named, else its first words)."""
    match = re.search(r"unsupported (keyword|format) '([^']+)'", message)
    if match:
        return f"unsupported {match.group(1)} '{match.group(2)}'"
    return " ".join(message.split()[:8])


def _answered(client: Any, body: Mapping[str, Any], tally: SchemaTally | CallTally) -> dict[str, Any] | None:
    """The chat completion of ``body``, or None after counting a refusal (by its reason) or a server error."""
    reply = client.post("/v1/chat/completions", json=body)
    if reply.status_code >= 500:
        tally.server_errors += 1
        return None
    if reply.status_code != 200:
        tally.refused[refusal_reason(reply.json().get("error", {}).get("message", ""))] += 1
        return None
    return reply.json()


def run_schemas(client: Any, model: str, files: Sequence[Path], max_tokens: int) -> SchemaTally:
    """Send each schema as ``response_format`` and tally the outcomes (see the module docstring)."""
    import jsonschema

    tally = SchemaTally()
    for path in files:
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(schema, dict):
            continue
        tally.sent += 1
        title = schema.get("title") or schema.get("description") or path.stem
        body = {"model": model, "max_tokens": max_tokens, "messages": [
            {"role": "user", "content": f"Write a short example JSON document for: {str(title)[:200]}"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "doc", "schema": schema}}}
        answer = _answered(client, body, tally)
        if answer is None:
            continue
        tally.answered += 1
        choice = answer["choices"][0]
        if choice["finish_reason"] == "length":
            tally.cut += 1
            continue
        try:
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
            tally.valid += 1
        except Exception as exc:  # noqa: BLE001 (any failure to parse or validate is an invalid reply)
            tally.invalid.append(f"{path.name}: {str(exc).splitlines()[0][:120]}")
    return tally


@dataclass
class CallTally:
    """What happened to the BFCL questions."""

    asked: int = 0
    valid: int = 0
    expected_function: int = 0
    expected_values: int = 0
    server_errors: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)


def _matches(arguments: Mapping[str, Any], answer: Mapping[str, Sequence[Any]]) -> bool:
    """Every argument among BFCL's accepted values (a missing optional one is accepted when "" is)."""
    for key, accepted in answer.items():
        if key in arguments:
            if arguments[key] not in accepted:
                return False
        elif "" not in accepted:
            return False
    return all(key in answer for key in arguments)


def run_bfcl(client: Any, model: str, questions: Iterable[Mapping[str, Any]], answers: Mapping[str, Any],
             max_tokens: int) -> CallTally:
    """Ask each question with its functions as strict tools and a forced call; tally the calls."""
    import jsonschema

    tally = CallTally()
    for question in questions:
        functions = [dict(f, parameters=bfcl_schema(f.get("parameters") or {"type": "object"}), strict=True)
                     for f in question["function"]]
        tools = [{"type": "function", "function": f} for f in functions]
        body = {"model": model, "max_tokens": max_tokens, "messages": question["question"][0], "tools": tools,
                "tool_choice": "required"}
        tally.asked += 1
        answer = _answered(client, body, tally)
        if answer is None:
            continue
        calls = answer["choices"][0]["message"].get("tool_calls") or []
        if not calls:
            continue
        name, arguments = calls[0]["function"]["name"], calls[0]["function"]["arguments"]
        schema = next(f["parameters"] for f in functions if f["name"] == name)
        try:
            args = json.loads(arguments)
            jsonschema.validate(args, schema)
        except Exception as exc:  # noqa: BLE001 (not JSON, or not valid against the schema)
            logger.info("%s: arguments not valid: %s", question["id"], str(exc).splitlines()[0][:120])
            continue
        tally.valid += 1
        expected = answers.get(question["id"])
        if expected:
            (expected_name, expected_args), = expected[0].items()
            if name == expected_name:
                tally.expected_function += 1
                tally.expected_values += _matches(args, expected_args)
    return tally


@dataclass
class SpeedRow:
    """One workload's decoding under each arm."""

    name: str
    tokens: int
    ar_s: float
    ar_grammar_s: float
    mask_s: float
    hvd_s: float
    same_tokens: bool  # hvd's reply is constrained ar's
    steps: int
    sources: dict[str, int]


def speed_workloads(engine: Engine, workloads: Sequence[tuple[str, dict[str, Any]]], rounds: int) -> list[SpeedRow]:
    """Decode each workload (keyword arguments of ``build_chat_request``) by ``ar`` without its grammar, ``ar``
    with it and ``hvd`` with it, ``rounds`` times each (best time kept), each run on a fresh engine over the same
    target (an empty cross-request store and prefix cache), and compare."""
    rows = []
    for name, call in workloads:
        runs: dict[str, tuple[float, Any, Any]] = {}
        for arm, method, grammar in (("ar", "ar", False), ("ar+g", "ar", True), ("hvd+g", "hvd", True)):
            best = None
            for _ in range(rounds):
                settings = ChatSettings(max_tokens=call.get("max_tokens", 128), method=method)
                kwargs = {k: v for k, v in call.items() if k != "max_tokens"}
                if not grammar:
                    kwargs.pop("response_format", None)
                    kwargs["tool_choice"] = "none" if kwargs.get("tools") else None
                # a fresh engine over the same target: no arm drafts from another arm's reply in the store
                request = build_chat_request(engine.sibling(), settings=settings, **kwargs)
                reply = collect(stream_reply_deltas(request))
                stats = reply.summary.hvd_stats
                if best is None or stats["decode_s"] < best[0]:
                    best = (stats["decode_s"], stats, (reply.content, [(c.name, c.arguments) for c in reply.tool_calls]))
            runs[arm] = best
        ar, grammar_ar, hvd = runs["ar"][1], runs["ar+g"][1], runs["hvd+g"][1]
        same = runs["ar+g"][2] == runs["hvd+g"][2]
        sources = {source: per["accepted"] for source, per in hvd["per_source"].items() if per["accepted"]}
        rows.append(SpeedRow(name, grammar_ar["new_tokens"], ar["decode_s"] / max(ar["new_tokens"], 1),
                             grammar_ar["decode_s"] / max(grammar_ar["new_tokens"], 1),
                             grammar_ar["grammar_s"] / max(grammar_ar["new_tokens"], 1),
                             hvd["decode_s"] / max(hvd["new_tokens"], 1),
                             same, hvd["steps"], sources))
    return rows


def format_speed(rows: Sequence[SpeedRow]) -> str:
    """The speed table: per workload, ms per token of each arm, the mask's share, hvd's speedup."""
    lines = [("workload | tokens | ar ms/tok | ar+grammar ms/tok | mask ms/tok (share of an ar+grammar step) | "
              "hvd+grammar ms/tok | hvd / ar, both under the grammar | tokens/step | accepted by source")]
    for r in rows:
        lines.append(f"{r.name} | {r.tokens} | {r.ar_s * 1e3:.2f} | {r.ar_grammar_s * 1e3:.2f} | "
                     f"{r.mask_s * 1e3:.3f} ({r.mask_s / r.ar_grammar_s:.1%}) | {r.hvd_s * 1e3:.2f} | "
                     f"{r.ar_grammar_s / r.hvd_s:.2f}x | {r.tokens / max(r.steps, 1):.2f} | {r.sources}")
    return "\n".join(lines)


JSON_WORKLOADS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("flight search", "Find a direct flight from JFK to SEA on 2024-05-20 for two adults in economy.",
     {"type": "object", "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                       "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                       "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                                       "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                                       "cabin": {"enum": ["economy", "business", "first"]}},
      "required": ["origin", "destination", "date", "passengers", "cabin"]}),
    ("contact card", "Ann Lee is a nurse at Oslo General Hospital; her email is ann.lee@example.org.",
     {"type": "object", "properties": {"name": {"type": "string"}, "job": {"type": "string"},
                                       "employer": {"type": "string"}, "email": {"type": "string"}},
      "required": ["name", "job", "employer", "email"]}),
    ("joke", "Tell me a joke about cats.",
     {"type": "object", "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"}},
      "required": ["setup", "punchline"]}),
    ("order", "Order 3 blue t-shirts in size M and 1 red cap for delivery to 12 Main Street.",
     {"type": "object", "properties": {"items": {"type": "array", "maxItems": 4, "items": {
         "type": "object", "properties": {"product": {"type": "string"}, "color": {"type": "string"},
                                          "quantity": {"type": "integer"}},
         "required": ["product", "color", "quantity"]}}, "address": {"type": "string"}},
      "required": ["items", "address"]}),
)


def tool_workloads(limit: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The examples' recorded model calls that had tools, as chat calls with strict tools and the recorded call's
    tool forced by name (``"required"`` where the recording did not name one)."""
    from hvd_agents.bench.recorded import load_conversations

    workloads = []
    for conversation in load_conversations():
        for index, call in enumerate(conversation.calls):
            if call.tools is None:
                continue
            tools = [dict(tool, function=dict(tool["function"], strict=True)) if "function" in tool else tool
                     for tool in conversation.tool_sets[call.tools]]
            named = re.match(r'<tool_call>\n\{"name": "([^"]+)"', call.assistant_prefix)
            messages = conversation.messages[: call.messages] if isinstance(call.messages, int) else call.messages
            workloads.append((f"{conversation.name}[{index}]", {
                "messages": messages, "tools": tools, "tool_choice": named.group(1) if named else "required",
                "max_tokens": call.max_new_tokens, "session_id": f"bench-structured-{conversation.name}"}))
    return workloads[:limit]


def json_workloads() -> list[tuple[str, dict[str, Any]]]:
    """Schema-driven JSON replies (:data:`JSON_WORKLOADS`), as chat calls with a ``json_schema`` response format."""
    return [(name, {"messages": [{"role": "user", "content": prompt}], "max_tokens": 128,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}})
            for name, prompt, schema in JSON_WORKLOADS]


def run_structured_benchmark(*, model: str | None, schemas: str | None, bfcl: str | None, answers: str | None,
                             limit: int, questions: int, speed: bool, rounds: int, max_tokens: int,
                             tool_calls: int) -> None:
    """Run the parts asked for (see the module docstring) and print their tables."""
    from fastapi.testclient import TestClient

    from hvd_agents.engine.shared import shared_engine
    from hvd_agents.server.app import create_app
    from hvd_agents.server.config import ServerConfig

    engine = shared_engine(model, device="cpu")
    with TestClient(create_app(ServerConfig(port=0), engine=engine)) as client:
        name = client.get("/v1/models").json()["data"][0]["id"]
        if schemas:
            files = sorted(Path(schemas).glob("*.json"))[:limit]
            tally = run_schemas(client, name, files, max_tokens)
            print(f"schemas: {tally.sent} sent, {tally.answered} answered, {sum(tally.refused.values())} refused "
                  f"(400), {tally.server_errors} server errors (5xx); of the answered: {tally.valid} valid "
                  f"(jsonschema), {tally.cut} cut by max_tokens={max_tokens}, {len(tally.invalid)} invalid")
            for reason, count in tally.refused.most_common():
                print(f"  refused {count}: {reason}")
            for line in tally.invalid[:10]:
                print(f"  invalid: {line}")
        if bfcl:
            asked = [json.loads(line) for line in Path(bfcl).read_text(encoding="utf-8").splitlines() if line][:questions]
            expected = {}
            if answers:
                for line in Path(answers).read_text(encoding="utf-8").splitlines():
                    if line:
                        row = json.loads(line)
                        expected[row["id"]] = row["ground_truth"]
            calls = run_bfcl(client, name, asked, expected, max_tokens)
            print(f"BFCL: {calls.asked} questions, {calls.valid} calls with valid arguments, "
                  f"{calls.expected_function} the expected function, {calls.expected_values} the expected values; "
                  f"{sum(calls.refused.values())} refused, {calls.server_errors} server errors")
            for reason, count in calls.refused.most_common():
                print(f"  refused {count}: {reason}")
    if speed:
        rows = speed_workloads(engine, tool_workloads(tool_calls) + json_workloads(), rounds)
        print(format_speed(rows))
        total = {key: sum(getattr(r, key) * r.tokens for r in rows) for key in ("ar_s", "ar_grammar_s", "mask_s",
                                                                                 "hvd_s")}
        print(f"all: mask {total['mask_s'] / total['ar_grammar_s']:.1%} of constrained ar's decoding; constrained ar "
              f"{total['ar_grammar_s'] / total['ar_s']:.2f}x unconstrained ar's time per token; hvd "
              f"{total['ar_grammar_s'] / total['hvd_s']:.2f}x constrained ar (decoding); "
              f"same replies {sum(r.same_tokens for r in rows)}/{len(rows)}")
