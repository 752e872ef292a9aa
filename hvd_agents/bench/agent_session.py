"""A long multi-turn agent session, built in code, for the prefix-reuse benchmark.

A repository-maintenance agent: a system prompt, a dozen tool schemas, a task, then
per turn the model's reply followed by the agent's next tool call and that tool's
(long) output, as a real agent loop would send them back. The first prompt is about
3K tokens on the embedded model's tokenizer and each turn adds about 450.
Everything is deterministic: the same calls and outputs on every run.
"""

from __future__ import annotations

import json

SYSTEM = (
    "You are a careful repository maintenance agent. You work in small steps: call one tool, read its "
    "output, then decide the next step. Quote file paths, line numbers and identifiers exactly as the "
    "tools print them. When you have enough information, answer with a short report."
)

TASK = (
    "The nightly job fails while loading settings. Find where settings are loaded and saved, read the "
    "relevant code and logs, find the cause, and propose a minimal fix with the exact lines to change."
)

_TOOL_SPECS = [
    ("search_files", "Search the repository for lines matching a regular expression.",
     {"pattern": "Regular expression to search for", "path": "Directory to search in, relative to the root",
      "max_results": "Most matching lines to return"}),
    ("read_file", "Read a file of the repository, optionally a range of lines.",
     {"path": "File path relative to the repository root", "start_line": "First line to read (1-based)",
      "end_line": "Last line to read (inclusive)"}),
    ("list_directory", "List the files and directories under a path.",
     {"path": "Directory path relative to the repository root", "recursive": "List subdirectories too"}),
    ("run_tests", "Run the test suite or a subset of it and return the report.",
     {"selector": "pytest node id or keyword expression", "timeout_s": "Seconds before the run is stopped"}),
    ("read_logs", "Read the most recent lines of a service log.",
     {"service": "Service name, e.g. nightly-job", "lines": "Number of lines to return",
      "level": "Minimum level: debug, info, warning or error"}),
    ("git_log", "Show recent commits touching a path.",
     {"path": "File or directory path", "limit": "Most commits to show"}),
    ("git_diff", "Show the diff of a commit or between two revisions.",
     {"revision": "Commit id or range such as a1b2c3..d4e5f6", "path": "Restrict the diff to this path"}),
    ("edit_file", "Replace an exact snippet of a file with new text.",
     {"path": "File path", "old_text": "Exact text to replace", "new_text": "Replacement text"}),
    ("get_config", "Read a deployed configuration value.",
     {"key": "Dotted configuration key", "environment": "staging or production"}),
    ("open_issue", "Open an issue in the tracker.",
     {"title": "Issue title", "body": "Issue description in Markdown", "labels": "Comma-separated labels"}),
    ("query_metrics", "Query a time series of the monitoring system.",
     {"metric": "Metric name", "window": "Time window such as 24h", "aggregation": "avg, max or p95"}),
    ("notify", "Send a message to the team channel.",
     {"channel": "Channel name", "message": "Message text"}),
]


def agent_tools() -> list[dict]:
    """The session's tool schemas (OpenAI shape)."""
    tools = []
    for name, description, params in _TOOL_SPECS:
        properties = {key: {"type": "string", "description": text} for key, text in params.items()}
        tools.append({"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": [next(iter(params))]},
        }})
    return tools


def _listing(turn: int, lines: int) -> str:
    return "\n".join(f"src/app/module_{turn}_{i}.py:{10 + 7 * i}: def handler_{i}(settings: Settings) -> None:"
                     for i in range(lines))


def _code(turn: int, lines: int) -> str:
    out = [f"# src/app/config_{turn}.py"]
    for i in range(lines // 5):
        out += [f"def load_section_{i}(path: str) -> dict:",
                "    with open(path, encoding='utf-8') as fh:",
                "        data = json.load(fh)",
                f"    return data.get('section_{i}', {{}})", ""]
    return "\n".join(out)


def _logs(turn: int, lines: int) -> str:
    return "\n".join(f"2026-11-2{turn % 10}T03:{i:02d}:17Z ERROR nightly-job settings.load failed: "
                     f"KeyError 'retry_policy' in /etc/app/settings_{i % 4}.json (attempt {i})" for i in range(lines))


def _records(turn: int, lines: int) -> str:
    return json.dumps([{"commit": f"{turn:02x}{i:06x}", "author": f"dev{i % 5}", "files": i % 7 + 1,
                        "message": f"config: rename key retry_{i} in section {i % 3}"} for i in range(lines)])


# (tool, arguments, output builder, output lines): each later turn adds about 450 tokens
_TURN_CALLS = [
    ("read_file", {"path": "src/app/config.py"}, _code, 30),
    ("read_logs", {"service": "nightly-job", "lines": "200", "level": "error"}, _logs, 6),
    ("git_log", {"path": "src/app/config.py", "limit": "8"}, _records, 8),
    ("search_files", {"pattern": "retry_policy", "path": "src"}, _listing, 10),
    ("read_file", {"path": "src/app/retry.py"}, _code, 30),
]
# the calls the agent made before the first model call (tool outputs of about 1.7K tokens)
_OPENING_CALLS = [
    ("search_files", {"pattern": "load_settings|save_settings", "path": "src"}, _listing, 24),
    ("read_logs", {"service": "nightly-job", "lines": "200", "level": "error"}, _logs, 16),
]


def first_messages() -> list[dict]:
    """The conversation before the first model call (about 3K tokens with the tool schemas)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for number, spec in enumerate(_OPENING_CALLS):
        messages += _exchange(f"call_0_{number}", "", spec, number)
    return messages


def tool_exchange(turn: int, reply: str) -> list[dict]:
    """The agent's tool call after turn ``turn``'s model ``reply`` (its content), and the tool's output."""
    return _exchange(f"call_{turn + 1}", reply, _TURN_CALLS[turn % len(_TURN_CALLS)], turn + 1)


def _exchange(call_id: str, reply: str, spec: tuple, seed: int) -> list[dict]:
    name, arguments, output, lines = spec
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return [{"role": "assistant", "content": reply, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": output(seed, lines)}]
