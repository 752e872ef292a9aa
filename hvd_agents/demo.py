"""``hvd-agents demo``: one agent turn with a tool call, on the embedded model.

The conversation already holds an earlier exchange (as in any agent loop). The
user asks a new question; the model is required to answer with a tool call
(``tool_choice="required"``): the reply is decoded under the tools' grammar
(:func:`~hvd_agents.chat.constraints.reply_constraint`), so the model writes the whole
call, ``<tool_call>`` and name and arguments, nothing pre-filled, and it parses by
construction (a declared tool, arguments valid against its schema). The call is
executed (a canned weather lookup), the result goes back, and the model writes the
answer. What is still steered: the forced ``tool_choice`` (the embedded 135M model does
not choose to call a tool on its own). Each generation prints its text and decoding
stats; then the same two calls run again with plain greedy decoding (``ar``), and a
side-by-side shows the time of each call, its decoding rate, the tokens per target
forward pass and whether both methods produced the same tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from hvd_agents.bench.prompts import SYSTEM, WEATHER_TOOL
from hvd_agents.chat.constraints import reply_constraint
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.toolcalls import ToolCall, parse_tool_calls
from hvd_agents.engine import Engine, GenerationParams, GenerationResult
from hvd_agents.engine.shared import shared_engine


def get_weather(city: str, unit: str = "celsius") -> dict:
    """The demo's tool: a canned weather report."""
    temperature = {"Paris": 18, "London": 14}.get(city, 21)
    if unit == "fahrenheit":
        temperature = round(temperature * 9 / 5 + 32)
    return {"city": city, "temperature": temperature, "unit": unit, "condition": "partly cloudy"}


def _run_tool(call: ToolCall) -> dict:
    """Execute a parsed call, passing only the arguments the schema declares."""
    if call.name != "get_weather":
        return {"error": f"unknown tool {call.name}"}
    known = WEATHER_TOOL["function"]["parameters"]["properties"]
    arguments = {key: value for key, value in call.arguments.items() if key in known}
    try:
        return get_weather(**arguments)
    except TypeError as exc:  # a required argument is missing
        return {"error": str(exc)}


def _history() -> list[dict]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "London", "unit": "celsius"})}}
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather like in London today?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(get_weather("London"))},
        {"role": "assistant", "content": "It is 14 degrees celsius and partly cloudy in London."},
    ]


GRAMMAR_NOTE = ("The call is decoded under the tools' grammar (tool_choice=required): nothing of it is pre-filled, "
                "and it parses by construction. Still steered: the forced tool_choice (the embedded model does not "
                "call a tool on its own).")

MODEL_NOTE = ("The embedded SmolLM2-135M shows the speed and the identical tokens; forced to call, it writes a valid "
              "call, but it often misreads results. For an agent that reasons, point it at your model: "
              "hvd-agents demo --model HUB_ID_OR_PATH_OR_GGUF")


@dataclass(frozen=True)
class DemoCall:
    """One model call of the demo turn: what it printed, what it generated and how long it took."""

    label: str
    title: str
    text: str
    result: GenerationResult
    wall_s: float


def _generate(engine: Engine, label: str, title: str, messages: list[dict], params: GenerationParams) -> DemoCall:
    started = time.perf_counter()
    structure = prepare(engine, messages, [WEATHER_TOOL])
    result = engine.generate(structure.prompt_ids, params, structure=structure)
    return DemoCall(label, title, result.text, result, time.perf_counter() - started)


def run_turn(engine: Engine, method: str) -> list[DemoCall]:
    """The demo's agent turn by ``method``: a forced tool call, the tool, the answer."""
    messages = _history() + [{"role": "user", "content": "And what's the weather like in Paris today?"}]
    grammar = reply_constraint(engine, [WEATHER_TOOL], "required", None, json_mode=False, json_strict=False)
    params = GenerationParams(max_new_tokens=64, method=method, constraint=grammar)
    call = _generate(engine, "tool call", "assistant: tool call (tool_choice=required, under the tools' grammar)",
                     messages, params)
    parsed = parse_tool_calls(call.text)
    if not parsed.tool_calls:
        return [call]
    results = [(c, _run_tool(c)) for c in parsed.tool_calls]
    messages.append({
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [{"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c, _ in results],
    })
    messages.extend({"role": "tool", "tool_call_id": c.id, "content": json.dumps(r)} for c, r in results)
    tool_lines = "".join(f"-> {c.name}({json.dumps(c.arguments)}) = {json.dumps(r)}\n" for c, r in results)
    answer = _generate(engine, "answer", "assistant: answer", messages, GenerationParams(max_new_tokens=64, method=method))
    return [DemoCall(call.label, call.title, call.text + "\n" + tool_lines.rstrip(), call.result, call.wall_s), answer]


def side_by_side(fast: list[DemoCall], plain: list[DemoCall], method: str) -> list[str]:
    """Each call of the two runs against each other, then the totals and whether every token was the same."""
    out = [f"== {method} against plain greedy decoding (ar): same model, same prompts",
           (f"{'call':<14} {'ar s':>6} {method + ' s':>7} {'speedup':>8} {'ar tok/s':>9} {method + ' tok/s':>10} "
            f"{method + ' tok/step':>13} {'same tokens':>11}")]
    for f, p in zip(fast, plain):
        out.append(_pair(f.label, [f], [p]))
    out.append(_pair("total", fast, plain))
    identical = len(fast) == len(plain) and all(f.result.token_ids == p.result.token_ids for f, p in zip(fast, plain))
    out.append(f"identical tokens: {'yes' if identical else 'no'}")
    out.extend((GRAMMAR_NOTE, MODEL_NOTE))
    return out


def _pair(label: str, fast: list[DemoCall], plain: list[DemoCall]) -> str:
    def rate(calls: list[DemoCall], per: str) -> float:
        total = sum(getattr(c.result.stats, per) for c in calls)
        return sum(c.result.stats.new_tokens for c in calls) / total if total else 0.0

    fast_s, plain_s = sum(c.wall_s for c in fast), sum(c.wall_s for c in plain)
    same = all(f.result.token_ids == p.result.token_ids for f, p in zip(fast, plain)) and len(fast) == len(plain)
    return (f"{label:<14} {plain_s:>6.2f} {fast_s:>7.2f} {plain_s / fast_s if fast_s else 0.0:>7.2f}x "
            f"{rate(plain, 'decode_s'):>9.1f} {rate(fast, 'decode_s'):>10.1f} {rate(fast, 'steps'):>13.2f} "
            f"{'yes' if same else 'no':>11}")


def run_demo(model: str | None = None, device: str | None = None, method: str = "hvd", compare: bool = True) -> None:
    """Run the demo turn and print each generation; with ``compare``, the same turn by ``ar`` beside it."""
    engine = shared_engine(model, device=device)
    fast = run_turn(engine, method)
    for call in fast:
        print(f"== {call.title}\n{call.text}\n{call.result.stats.summary()}\n", flush=True)
    if len(fast) == 1:
        print("(the model produced no valid tool call)")
    if not compare or method == "ar":
        return
    engine.prefix_cache.clear()  # the plain run computes its prompts as the first run did
    print("(the same turn again with plain greedy decoding ...)\n", flush=True)
    plain = run_turn(engine, "ar")
    print("\n".join(side_by_side(fast, plain, method)))
