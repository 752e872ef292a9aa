"""``hvd-agents demo``: one agent turn with a tool call, on the embedded model.

The conversation already holds an earlier exchange (as in any agent loop). The
user asks a new question; the model is required to answer with a tool call
(``tool_choice="required"``: the turn is pre-filled with ``<tool_call>``), the call
is parsed and executed (a canned weather lookup), the result goes back, and the
model writes the answer. Each generation prints its text and decoding stats.
"""

from __future__ import annotations

import json

from hvd_agents.bench.prompts import SYSTEM, WEATHER_TOOL
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.toolcalls import ToolCall, forced_call_prefix, parse_tool_calls
from hvd_agents.engine import GenerationParams, RequestStats
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


def _print_turn(title: str, text: str, stats: RequestStats) -> None:
    print(f"== {title}\n{text}\n{stats.summary()}\n")


def run_demo(model: str | None = None, device: str | None = None, method: str = "hvd") -> None:
    """Run the demo and print each generation."""
    engine = shared_engine(model, device=device)
    tools = [WEATHER_TOOL]
    messages = _history() + [{"role": "user", "content": "And what's the weather like in Paris today?"}]
    params = GenerationParams(max_new_tokens=64, method=method, stop=("</tool_call>",))
    prefix = forced_call_prefix("required", tools)
    structure = prepare(engine, messages, tools, assistant_prefix=prefix)
    first = engine.generate(structure.prompt_ids, params, structure=structure)
    reply = prefix + first.text + "</tool_call>"
    _print_turn("assistant: tool call (tool_choice=required)", reply, first.stats)
    parsed = parse_tool_calls(reply)
    if not parsed.tool_calls:
        print(f"(the model produced no valid tool call: {parsed.invalid_tool_calls})")
        return
    results = [(call, _run_tool(call)) for call in parsed.tool_calls]
    for call, result in results:
        print(f"-> {call.name}({json.dumps(call.arguments)}) = {json.dumps(result)}\n")
    messages.append({
        "role": "assistant",
        "content": parsed.content,
        "tool_calls": [{"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c, _ in results],
    })
    messages.extend({"role": "tool", "tool_call_id": c.id, "content": json.dumps(r)} for c, r in results)
    structure = prepare(engine, messages, tools)
    final = engine.generate(structure.prompt_ids, GenerationParams(max_new_tokens=64, method=method), structure=structure)
    _print_turn("assistant: answer", final.text, final.stats)
