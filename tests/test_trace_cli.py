"""The ``hvd-agents analyze`` command-line contract, with a saved byte-level tokenizer (no model)."""

from __future__ import annotations

import html
import json
import re

import pytest

from hvd_agents.cli import main
from tests.helpers import make_byte_tokenizer
from tests.trace_data import conversations, write_jsonl

POLICIES = "ar,pld,suffix-local,hvd-cache,suffix-threshold,oracle"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("tok")
    make_byte_tokenizer().save_pretrained(directory)
    return str(directory)


@pytest.fixture()
def trace_file(tmp_path) -> str:
    return str(write_jsonl(tmp_path / "agent.jsonl", conversations()))


def analyze(*args: str) -> int:
    return main(["analyze", *args])


def test_json_steps_and_html(tmp_path, trace_file, tokenizer_dir, capsys) -> None:
    out_json, out_steps, out_html = tmp_path / "o.json", tmp_path / "s.jsonl", tmp_path / "r.html"
    code = analyze(trace_file, "--policy", POLICIES, "--k", "16", "--verify-cost", "0.02", "--json", str(out_json),
                   "--steps", str(out_steps), "--html", str(out_html), "--tokenizer", tokenizer_dir, "--quiet")
    assert code == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "oracle" in printed and "provenance kind" in printed

    document = json.loads(out_json.read_text())
    policies = ["ar", "pld", "suffix-local", "suffix", "suffix-threshold", "oracle"]
    assert [key for key in document if key != "_meta"] == policies
    for name in policies:
        assert document[name]["est_speedup"] >= 1.0 or name == "suffix-threshold"
        assert isinstance(document[name]["accepted_by_kind"], dict)
    assert document["ar"]["est_speedup"] == 1.0
    meta = document["_meta"]
    assert meta["file"] == trace_file and meta["tokenizer"] == tokenizer_dir
    assert (meta["k"], meta["verify_cost"], meta["conversations"], meta["skipped"]) == (16, 0.02, 3, 0)

    steps = [json.loads(line) for line in out_steps.read_text().splitlines()]
    assert {"policy", "conversation", "turn", "position", "source", "drafted", "accepted", "features"} <= set(steps[0])
    for name in policies:
        mine = [s for s in steps if s["policy"] == name]
        assert len(mine) == document[name]["steps"]
        assert sum(s["accepted"] + 1 for s in mine) == document[name]["output_tokens"]
        assert sum(s["drafted"] for s in mine) == document[name]["drafted_tokens"]

    page = out_html.read_text()
    assert page.count("<img") >= 2 and "data:image/png;base64," in page
    assert "Conversation w1" in page and "What is the weather in Paris?" in page
    reply_text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in reply_text
    assert "background:#dddddd" in page  # target-generated tokens are grey


def test_skip_bad_and_limit(tmp_path, tokenizer_dir, capsys) -> None:
    rows = conversations()
    path = write_jsonl(tmp_path / "agent.jsonl", [rows[0], '{"id": "broken", "messages": [', rows[1], rows[2]])
    out_json = tmp_path / "o.json"
    assert analyze(str(path), "--policy", "ar", "--tokenizer", tokenizer_dir, "--quiet") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "agent.jsonl:2: invalid JSON" in err
    code = analyze(str(path), "--policy", "ar,suffix", "--tokenizer", tokenizer_dir, "--skip-bad", "--limit", "2",
                   "--json", str(out_json), "--quiet")
    assert code == 0
    meta = json.loads(out_json.read_text())["_meta"]
    assert (meta["skipped"], meta["conversations"]) == (1, 2)
    assert "1 malformed conversation(s) skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "pld,warp-drive"], "unknown policy 'warp-drive'"),
        (["--k", "0"], "--k must be >= 1"),
        (["--system-template", "nope"], "unknown template 'nope'; available: agent-system"),
    ],
)
def test_bad_options_exit_2(trace_file, tokenizer_dir, capsys, args, message) -> None:
    assert analyze(trace_file, "--tokenizer", tokenizer_dir, "--quiet", *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_missing_file_and_tokenizer_exit_2(tmp_path, tokenizer_dir, trace_file, capsys) -> None:
    assert analyze(str(tmp_path / "none.jsonl"), "--tokenizer", tokenizer_dir) == 2
    assert "none.jsonl does not exist" in capsys.readouterr().err
    assert analyze(trace_file, "--tokenizer", str(tmp_path / "no-such-dir")) == 2
    assert "error: " in capsys.readouterr().err


def test_prompt_template_flags(trace_file, tokenizer_dir, tmp_path) -> None:
    out_json = tmp_path / "o.json"
    code = analyze(trace_file, "--policy", "suffix", "--tokenizer", tokenizer_dir, "--canonical-tools",
                   "--system-template", "agent-system", "--json", str(out_json), "--quiet")
    assert code == 0
    meta = json.loads(out_json.read_text())["_meta"]
    assert meta["canonical_tools"] is True and meta["system_template"] == "agent-system"
