"""BFCL single-turn results read as conversations, and taken as a kind by ``analyze`` and ``loko`` (small written
BFCL directories)."""

from __future__ import annotations

import json

import pytest

from hvd_agents.cli import main
from hvd_agents.errors import TraceFormatError
from hvd_agents.policy.train import FitSettings
from hvd_agents.trace.bfcl import is_bfcl, load_bfcl
from hvd_agents.trace.loko import KindSource, LokoOptions, run_loko
from hvd_agents.trace.sources import load_source
from tests.helpers import make_byte_tokenizer
from tests.trace_data import conversations, write_jsonl

DOC = {"name": "math.hypot", "description": "Euclidean norm.",
       "parameters": {"type": "dict", "required": ["x", "y"],
                      "properties": {"x": {"type": "float", "description": "x"}, "y": {"type": "integer"},
                                     "point": {"type": "tuple", "items": {"type": "float"}},
                                     "label": {"type": "String", "description": "a Java type"}}}}


def write_lines(path, items) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")


@pytest.fixture()
def bfcl_dir(tmp_path):
    root = tmp_path / "bfcl_v4"
    questions = [{"id": f"simple_python_{i}", "question": [[{"role": "user", "content": f"Hypot of {i} and 4."}]],
                  "function": [DOC]} for i in range(6)]
    write_lines(root / "questions" / "BFCL_v4_simple_python.json", questions)
    results = [{"id": f"simple_python_{i}", "result": [{"math_hypot": json.dumps({"x": i, "y": 4})}]} for i in range(6)]
    results[2]["result"] = []  # answered in text: not kept
    results[4]["result"] = [{"math_hypot": '{"x": 4, "y": 4}'}, {"math_hypot": '{"x": 1, "y": 2}'}]  # parallel
    write_lines(root / "results" / "model-a" / "non_live" / "BFCL_v4_simple_python_result.json", results)
    write_lines(root / "results" / "model-a" / "multi_turn" / "BFCL_v4_multi_turn_base_result.json",
                [{"id": "multi_turn_base_0", "result": [[[{"cd": "{}"}]]]}])  # needs the inference log: not read
    return root


def test_single_turn_results_read_as_one_tool_call_conversation_each(bfcl_dir) -> None:
    assert is_bfcl(bfcl_dir) and not is_bfcl(bfcl_dir / "questions")
    trace = load_bfcl(bfcl_dir)
    ids = [c.id for c in trace.conversations]
    assert ids == [f"model-a/simple_python/simple_python_{i}" for i in (0, 1, 3, 4, 5)]
    first = trace.conversations[0]
    assert [m["role"] for m in first.messages] == ["user", "assistant"] and first.assistant_indices == [1]
    (call,) = first.messages[1]["tool_calls"]
    assert call["function"] == {"name": "math_hypot", "arguments": json.dumps({"x": 0, "y": 4})}
    (tool,) = first.tools
    assert tool["function"]["name"] == "math_hypot"  # as the result names it
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["x", "y"]
    assert {name: p["type"] for name, p in parameters["properties"].items()} == {
        "x": "number", "y": "integer", "point": "array", "label": "string"}
    assert parameters["properties"]["point"]["items"] == {"type": "number"}
    assert len(trace.conversations[3].messages[1]["tool_calls"]) == 2
    assert [c.id for c in load_bfcl(bfcl_dir, limit=2).conversations] == ids[:2]
    assert [c.id for c in load_source(bfcl_dir).conversations] == ids


def test_bfcl_errors_name_the_file_and_line(tmp_path, bfcl_dir) -> None:
    with pytest.raises(TraceFormatError, match="not a BFCL directory"):
        load_bfcl(tmp_path)
    result = bfcl_dir / "results" / "model-a" / "non_live" / "BFCL_v4_simple_python_result.json"
    write_lines(result, [{"id": "simple_python_0", "result": []}, {"id": "simple_python_99", "result": [{"f": "{}"}]}])
    with pytest.raises(TraceFormatError, match=r"BFCL_v4_simple_python_result.json line 2: no question "
                                               r"'simple_python_99'"):
        load_bfcl(bfcl_dir)
    result.write_text('{"id": "simple_python_0", "result": [}\n', encoding="utf-8")
    with pytest.raises(TraceFormatError, match="BFCL_v4_simple_python_result.json line 1"):
        load_bfcl(bfcl_dir)
    result.unlink()
    with pytest.raises(TraceFormatError, match="no single-turn result file"):
        load_bfcl(bfcl_dir)


def test_analyze_and_loko_take_a_bfcl_directory(tmp_path, bfcl_dir) -> None:
    tokenizer = make_byte_tokenizer()
    saved = tmp_path / "tok"
    tokenizer.save_pretrained(saved)
    out = tmp_path / "a.json"
    assert main(["analyze", str(bfcl_dir), "--policy", "suffix", "--tokenizer", str(saved),
                 "--verify-cost", "0.02", "--json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["suffix"]["requests"] == 5
    agents = write_jsonl(tmp_path / "agents.jsonl", conversations())
    options = LokoOptions((KindSource("agents", str(agents)), KindSource("bfcl_single", str(bfcl_dir))),
                          FitSettings(hidden=0, held_out=0.0), rounds=0)
    document = run_loko(options, tokenizer)
    entry = document["kinds"]["bfcl_single"]
    assert entry["fitted_on"] == ["agents"] and entry["conversations"] == 5 and entry["turns"] == 5
    assert entry["costs"]["0.02"]["oracle"]["est_speedup"] > 1.0
