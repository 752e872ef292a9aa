"""Agent-style prompts for the live benchmarks and the demo.

Each is a realistic step of a tool-using agent: a system prompt with tool schemas,
a user request, and earlier tool calls / tool outputs that the answer draws on
(identifiers, code, JSON), which is where copying drafts pay off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH_FILES_TOOL = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search the repository for files whose content matches a pattern.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression to search for"},
                "path": {"type": "string", "description": "Directory to search in"},
            },
            "required": ["pattern"],
        },
    },
}

SYSTEM = "You are a helpful assistant that uses tools to answer questions. Be concise and exact."

_CODE = '''def parse_config(path):
    with open(path) as fh:
        lines = fh.read().splitlines()
    config = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config
'''

_WEATHER_RESULT = {"city": "Paris", "temperature": 18, "unit": "celsius", "condition": "partly cloudy",
                   "humidity": 64, "wind_kmh": 12}

_SEARCH_RESULT = "\n".join(  # noqa: FLY002 (one search hit a line reads as the tool output does)
    [
        "src/app/config.py:12: def load_settings(path: str) -> Settings:",
        "src/app/config.py:40: def save_settings(settings: Settings, path: str) -> None:",
        "src/app/cli.py:8: from app.config import load_settings, save_settings",
        "tests/test_config.py:5: from app.config import load_settings",
        "tests/test_config.py:22: def test_load_settings_roundtrip(tmp_path):",
    ]
)


@dataclass(frozen=True)
class AgentPrompt:
    """One benchmark prompt: OpenAI-style messages and tool schemas."""

    name: str
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)


def _tool_turn(call_id: str, name: str, arguments: dict, result: str) -> list[dict]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def agent_prompts() -> list[AgentPrompt]:
    """The benchmark's prompts (fixed, deterministic)."""
    weather = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the weather in Paris right now? Give all the details."},
        *_tool_turn("call_1", "get_weather", {"city": "Paris", "unit": "celsius"}, json.dumps(_WEATHER_RESULT)),
    ]
    search = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is load_settings defined and used? List every file and line."},
        *_tool_turn("call_1", "search_files", {"pattern": "load_settings"}, _SEARCH_RESULT),
    ]
    code = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Add a docstring to this function and return the whole function:\n\n" + _CODE},
    ]
    json_extract = [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": "Return the tool result below as a JSON object with the same keys and values.\n\n"
            + json.dumps(_WEATHER_RESULT, indent=2),
        },
    ]
    return [
        AgentPrompt("weather-summary", weather, [WEATHER_TOOL]),
        AgentPrompt("search-report", search, [SEARCH_FILES_TOOL]),
        AgentPrompt("code-docstring", code, []),
        AgentPrompt("json-echo", json_extract, [WEATHER_TOOL]),
    ]


# Free-text chat prompts for the model-drafter benchmark. Their topics are not in the
# draft head's training topics (hvd_agents.distill.prompts.TOPICS), and their
# wording follows none of its templates: they are held out from training.
CHAT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("volcano", "Why do some volcanoes erupt explosively while others produce slow lava flows?"),
    ("kitchen-knife", "I just bought my first chef's knife. How should I care for it and keep it sharp?"),
    ("lighthouse", "Tell me a calm bedtime story about an old lighthouse keeper and a lost seagull."),
    ("old-violins", "My sister says violins sound better when they are old. Is that true? Explain."),
    ("moving-abroad", "I am moving to another country for work next month. What should I organise first?"),
    ("origami", "Describe how a beginner can fold a simple paper crane, one step at a time."),
    ("thunder", "What causes thunder, and why do we see lightning before we hear it?"),
    ("board-game-night", "Plan a fun board game evening for six adults who have never met each other."),
)


def chat_prompts() -> list[AgentPrompt]:
    """The held-out free-text chat prompts, as one-turn conversations."""
    return [AgentPrompt(name, [{"role": "user", "content": text}]) for name, text in CHAT_PROMPTS]


# Held-out prompts of the kinds the draft head is trained on, for its acceptance figures
# (``hvd-agents bench-head``). None uses a training template, topic, programming task or tool
# of :mod:`hvd_agents.distill.prompts` (the tools are this module's, which training does not use).
_HELD_OUT_CODE: tuple[tuple[str, str], ...] = (
    ("code-matrix", "Write a Python function that transposes a matrix given as a list of lists."),
    ("code-anagram", "How do I check in JavaScript whether two words are anagrams of each other?"),
    ("code-lru", "Implement a tiny least-recently-used cache class in Python with get and put methods."),
)
_HELD_OUT_JSON: tuple[tuple[str, str], ...] = (
    ("json-recipe", "Give me a pancake recipe as a JSON object with \"ingredients\" (a list) and \"steps\"."),
    ("json-book", ("Turn this into JSON with title, author and year: Moby-Dick was written by Herman Melville "
                   "and published in 1851.")),
    ("json-planets", "List the four inner planets as a JSON array of objects with \"name\" and \"moons\"."),
)
_HELD_OUT_TOOLS: tuple[tuple[str, str, dict], ...] = (
    ("tools-weather-call", "Is it raining in Reykjavik at the moment?", WEATHER_TOOL),
    ("tools-search-call", "Find where the function parse_config is used in the src directory.", SEARCH_FILES_TOOL),
)


def held_out_prompts() -> dict[str, list[AgentPrompt]]:
    """Held-out prompts by kind (``chat``, ``code``, ``json``, ``tools``), fixed and deterministic."""
    agent = {p.name: p for p in agent_prompts()}
    code = [agent["code-docstring"]] + [AgentPrompt(name, [{"role": "user", "content": text}])
                                        for name, text in _HELD_OUT_CODE]
    json_kind = [agent["json-echo"]] + [AgentPrompt(name, [{"role": "user", "content": text}])
                                        for name, text in _HELD_OUT_JSON]
    tools = [agent["weather-summary"], agent["search-report"]] + [
        AgentPrompt(name, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}], [tool])
        for name, text, tool in _HELD_OUT_TOOLS]
    return {"chat": chat_prompts(), "code": code, "json": json_kind, "tools": tools}
