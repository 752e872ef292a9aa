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


def test_proposals_label_every_cache_proposal_verified_or_not(tmp_path, trace_file, tokenizer_dir, capsys) -> None:
    """``--proposals`` writes the whole cache proposal of every step that had one, as a train-payoff record
    labelled by the reply: at a verify cost that makes hvd decline every draft, the proposals are all still there."""
    from hvd_agents.policy.train import read_samples

    for cost in ("0.02", "50"):
        steps, proposals, out_json = tmp_path / f"s{cost}.jsonl", tmp_path / f"p{cost}.jsonl", tmp_path / "o.json"
        assert analyze(trace_file, "--policy", "hvd", "--k", "16", "--verify-cost", cost, "--tokenizer", tokenizer_dir,
                       "--steps", str(steps), "--proposals", str(proposals), "--json", str(out_json), "--quiet") == 0
        rows = [json.loads(line) for line in steps.read_text().splitlines()]
        records = [json.loads(line) for line in proposals.read_text().splitlines()]
        proposed = [row for row in rows if row["cache_drafted"] > 0]
        assert len(records) == len(proposed) > 0
        for row, record in zip(proposed, records):
            assert (record["conversation"], record["turn"], record["position"]) == (
                row["conversation"], row["turn"], row["position"])
            assert (record["drafted"], record["accepted"]) == (row["cache_drafted"], row["cache_accepted"])
            assert record["features"]["match_len"] >= 1 and "text_0" in record["features"]
        assert "proposal" not in rows[0]  # --steps lines keep their format
        samples = read_samples([proposals])
        assert [s.drafted for s in samples] == [r["drafted"] for r in records]
        if cost == "50":  # nothing verified, every proposal labelled
            assert json.loads(out_json.read_text())["hvd"]["drafted_tokens"] == 0
            assert sum(r["accepted"] for r in records) > 0
    assert main(["train-payoff", str(tmp_path / "p0.02.jsonl"), "-o", str(tmp_path / "w.json"), "--held-out", "0.3",
                 "--epochs", "2"]) == 0


def test_payoff_weights_set_the_hvd_policys_predictor(tmp_path, trace_file, tokenizer_dir, capsys) -> None:
    import numpy as np

    from hvd_agents.policy.features import FEATURE_NAMES
    from hvd_agents.policy.payoff import PayoffWeights

    sure = tmp_path / "sure.json"  # every draft token predicted accepted: every proposal is verified whole
    PayoffWeights(np.where(np.array(FEATURE_NAMES) == "bias", 30.0, 0.0)).save(sure)
    whole = {}
    for name, extra in (("packaged", ()), ("sure", ("--payoff-weights", str(sure)))):
        steps = tmp_path / f"{name}.jsonl"
        assert analyze(trace_file, "--policy", "hvd", "--verify-cost", "0.02", "--tokenizer", tokenizer_dir,
                       "--steps", str(steps), "--quiet", *extra) == 0
        rows = [json.loads(line) for line in steps.read_text().splitlines()]
        whole[name] = all(row["drafted"] == row["cache_drafted"] for row in rows if row["cache_drafted"])
    assert whole == {"packaged": False, "sure": True}
    capsys.readouterr()
    assert analyze(trace_file, "--policy", "suffix", "--payoff-weights", str(sure), "--tokenizer", tokenizer_dir) == 2
    assert "--policy does not include hvd" in capsys.readouterr().err
    assert analyze(trace_file, "--policy", "hvd", "--payoff-weights", str(tmp_path / "none.json"),
                   "--tokenizer", tokenizer_dir) == 2
    err = capsys.readouterr().err
    assert "cannot read payoff weights" in err and "none.json" in err
    assert analyze(trace_file, "--policy", "ar,pld", "--proposals", str(tmp_path / "p.jsonl"),
                   "--tokenizer", tokenizer_dir) == 2
    assert "--proposals writes the cache proposals of suffix or hvd" in capsys.readouterr().err
