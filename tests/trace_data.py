"""Small hand-written agent traces for the trace-replay tests (written to tmp_path by the tests)."""

from __future__ import annotations

import json
from pathlib import Path

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
SECRET = "The deployment key is QX-7731-ALPHA-0042 and the region is eu-central-7."
REPEATED = "I checked the configuration twice and everything matches the expected deployment settings."


def call(call_id: str, name: str, arguments: dict) -> dict:
    """An OpenAI tool call with JSON-string arguments."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def weather_conversation(conv_id: str, city: str) -> dict:
    """Repeated tool calls: the same call shape twice, then an answer."""
    return {
        "id": conv_id,
        "messages": [
            {"role": "system", "content": "You are a weather agent."},
            {"role": "user", "content": f"What is the weather in {city}? Check twice."},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_weather", {"city": city})]},
            {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"city": city, "temp_c": 21})},
            {"role": "assistant", "content": None, "tool_calls": [call("c2", "get_weather", {"city": city})]},
            {"role": "tool", "tool_call_id": "c2", "content": json.dumps({"city": city, "temp_c": 21})},
            {"role": "assistant", "content": f"It is 21 degrees in {city}."},
        ],
        "tools": [WEATHER_TOOL],
    }


def copy_conversation(conv_id: str) -> dict:
    """A tool output copied verbatim into the answer, and a reply repeated exactly."""
    return {
        "id": conv_id,
        "messages": [
            {"role": "system", "content": "You are a file agent."},
            {"role": "user", "content": "Read /etc/deploy.conf and tell me what it says."},
            {"role": "assistant", "content": None,
             "tool_calls": [call("c1", "read_file", {"path": "/etc/deploy.conf"})]},
            {"role": "tool", "tool_call_id": "c1", "content": SECRET},
            {"role": "assistant", "content": f"The file says: {SECRET}"},
            {"role": "user", "content": "Are you sure?"},
            {"role": "assistant", "content": REPEATED},
            {"role": "user", "content": "Are you really sure?"},
            {"role": "assistant", "content": REPEATED},
        ],
        "tools": [FILE_TOOL],
    }


def conversations() -> list[dict]:
    """Three conversations: two weather agents (cross-request reuse) and the copy case."""
    return [weather_conversation("w1", "Paris"), copy_conversation("f1"), weather_conversation("w2", "Paris")]


def write_jsonl(path: Path, rows: list) -> Path:
    """Write rows (objects, or raw strings written as they are) one per line."""
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
