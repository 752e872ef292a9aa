"""tau-bench results read as conversations, with the tool schemas of the checkout they sit in, and taken as a kind
by ``analyze`` and ``loko`` (small written checkouts)."""

from __future__ import annotations

import json
import logging

import pytest

from hvd_agents.cli import main
from hvd_agents.errors import TraceFormatError
from hvd_agents.policy.train import FitSettings
from hvd_agents.trace.loko import KindSource, LokoOptions, run_loko
from hvd_agents.trace.sources import load_source
from hvd_agents.trace.tau_bench import is_tau_bench, load_tau_bench
from tests.helpers import make_byte_tokenizer
from tests.trace_data import conversations, write_jsonl

TOOL = '''
from typing import Any, Dict


class {cls}:
    @staticmethod
    def invoke(data: Dict[str, Any], user_id: str) -> str:
        return data["users"][user_id]

    @staticmethod
    def get_info() -> Dict[str, Any]:
        return {{
            "type": "function",
            "function": {{
                "name": "{name}",
                "description": "{name} for a user.",
                "parameters": {{"type": "object", "properties": {{"user_id": {{"type": "string"}}}},
                               "required": ["user_id"]}},
            }},
        }}
'''


def result(task: int, trial: int, policy: str = "# Airline Agent Policy\n\nBe kind.") -> dict:
    call = {"id": f"call_{task}", "type": "function", "function": {"name": "get_user_details",
                                                                      "arguments": json.dumps({"user_id": f"u{task}"})}}
    traj = [{"role": "system", "content": policy},
            {"role": "user", "content": f"Hi, I am u{task}. Where is my booking?"},
            {"role": "assistant", "content": None, "tool_calls": [call], "function_call": None},
            {"role": "tool", "tool_call_id": f"call_{task}", "name": "get_user_details",
             "content": json.dumps({"reservations": ["ABC123"]})},
            {"role": "assistant", "content": "Your reservation is ABC123.", "tool_calls": None}]
    return {"task_id": task, "reward": 1.0, "info": {"task": {"user_id": f"u{task}"}}, "traj": traj, "trial": trial}


@pytest.fixture()
def checkout(tmp_path):
    root = tmp_path / "tau-bench"
    for domain, names in (("airline", ("get_user_details", "book_reservation")), ("retail", ("get_order_details",))):
        tools = root / "tau_bench" / "envs" / domain / "tools"
        tools.mkdir(parents=True)
        (tools / "__init__.py").write_text("ALL_TOOLS = []\n")
        for name in names:
            (tools / f"{name}.py").write_text(TOOL.format(cls=name.title().replace("_", ""), name=name))
    results = root / "historical_trajectories"
    results.mkdir()
    (results / "gpt-4o-airline.json").write_text(json.dumps([result(t, k) for t in range(3) for k in range(2)],
                                                            indent=2))
    return root


def test_results_read_as_conversations_with_the_checkouts_tool_schemas(checkout) -> None:
    path = checkout / "historical_trajectories" / "gpt-4o-airline.json"
    assert is_tau_bench(path)
    trace = load_source(path)
    assert [c.id for c in trace.conversations] == [f"gpt-4o-airline/{t}/{k}" for t in range(3) for k in range(2)]
    first = trace.conversations[0]
    assert first.line == 2 and trace.conversations[1].line > first.line
    assert [t["function"]["name"] for t in first.tools] == ["book_reservation", "get_user_details"]
    assert first.assistant_indices == [2, 4]
    call_message, tool_message = first.messages[2], first.messages[3]
    assert call_message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_user_details", "arguments": '{"user_id": "u0"}'}}]}
    assert tool_message == {"role": "tool", "content": '{"reservations": ["ABC123"]}', "tool_call_id": "call_0"}
    assert len(load_tau_bench(path, limit=4).conversations) == 4


def test_the_domain_is_the_one_the_system_message_names(checkout) -> None:
    path = checkout / "results" / "run.json"
    path.parent.mkdir()
    path.write_text(json.dumps([result(0, 0, policy="# Retail agent policy\n\nHelp with orders.")]))
    assert [t["function"]["name"] for t in load_tau_bench(path).conversations[0].tools] == ["get_order_details"]


def test_outside_a_checkout_the_conversations_have_no_tools(tmp_path, caplog) -> None:
    path = tmp_path / "gpt-4o-airline.json"
    path.write_text(json.dumps([result(0, 0)]))
    with caplog.at_level(logging.WARNING):
        trace = load_tau_bench(path)
    assert trace.conversations[0].tools == [] and "no tau-bench checkout" in caplog.text


def test_a_trace_files_json_array_is_not_read_as_tau_bench(tmp_path) -> None:
    items = conversations()[:2]
    array = tmp_path / "trace.json"
    array.write_text(json.dumps(items))
    assert not is_tau_bench(array) and not is_tau_bench(write_jsonl(tmp_path / "t.jsonl", items))
    assert [c.id for c in load_source(array).conversations] == [c["id"] for c in items]


def test_tau_bench_errors_name_the_file_and_line(checkout, tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([result(0, 0), {"task_id": 1, "traj": "not a list"}], indent=1))
    with pytest.raises(TraceFormatError, match=r"bad\.json:\d+: a tau-bench result is an object"):
        load_tau_bench(bad)
    bad.write_text(json.dumps([result(0, 0), {"task_id": 1, "traj": [{"content": "no role"}]}]))
    with pytest.raises(TraceFormatError, match="a message of 'traj' is an object with a 'role'"):
        load_tau_bench(bad)
    broken = result(1, 0)
    broken["traj"][2]["tool_calls"] = [{"name": "get_user_details"}]  # not OpenAI's shape
    bad.write_text(json.dumps([result(0, 0), broken]))
    with pytest.raises(TraceFormatError, match="'tool_calls' is a list of"):
        load_tau_bench(bad)
    bad.write_text('[\n' + json.dumps(result(0, 0)) + ',\n{"task_id": 1, "traj": [}\n]')
    with pytest.raises(TraceFormatError, match=r"bad\.json:3: invalid JSON"):
        load_tau_bench(bad)
    bad.write_text('[' + json.dumps(result(0, 0)))
    with pytest.raises(TraceFormatError, match="unterminated JSON array"):
        load_tau_bench(bad)
    tool = checkout / "tau_bench" / "envs" / "airline" / "tools" / "get_user_details.py"
    tool.write_text("def get_info():\n    return make_schema()\n")
    with pytest.raises(TraceFormatError, match=r"get_user_details\.py: cannot read its tool schema"):
        load_tau_bench(checkout / "historical_trajectories" / "gpt-4o-airline.json")
    with pytest.raises(TraceFormatError, match="does not exist"):
        load_tau_bench(tmp_path / "missing.json")


def test_analyze_and_loko_take_a_tau_bench_results_file(tmp_path, checkout) -> None:
    path = checkout / "historical_trajectories" / "gpt-4o-airline.json"
    tokenizer = make_byte_tokenizer()
    saved = tmp_path / "tok"
    tokenizer.save_pretrained(saved)
    out = tmp_path / "a.json"
    assert main(["analyze", str(path), "--policy", "suffix", "--tokenizer", str(saved),
                 "--verify-cost", "0.02", "--json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["suffix"]["requests"] == 12
    agents = write_jsonl(tmp_path / "agents.jsonl", conversations())
    options = LokoOptions((KindSource("agents", str(agents)), KindSource("tau", str(path))),
                          FitSettings(hidden=0, held_out=0.0), rounds=0)
    entry = run_loko(options, tokenizer)["kinds"]["tau"]
    assert entry["fitted_on"] == ["agents"] and entry["conversations"] == 6 and entry["turns"] == 12
    assert entry["costs"]["0.02"]["oracle"]["est_speedup"] > 1.0
