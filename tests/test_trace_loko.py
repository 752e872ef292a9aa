"""``hvd-agents loko``: leave one kind of agent trace out, fit on the others, judge on it (small written traces)."""

from __future__ import annotations

import json

import pytest

from hvd_agents.cli import main
from hvd_agents.errors import InvalidRequestError, TraceFormatError
from hvd_agents.policy.payoff import PayoffWeights
from hvd_agents.policy.train import FitSettings
from hvd_agents.trace.api_bank import is_api_bank, load_api_bank
from hvd_agents.trace.loko import KindSource, LokoOptions, evenly_spaced, format_loko, run_loko
from tests.helpers import make_byte_tokenizer
from tests.trace_data import conversations, weather_conversation, write_jsonl

SYSTEM = "You are a helpful assistant.\n1. Name: QueryMeeting\nParameters: {'user_name': {'type': 'str'}}"


def api_bank_items() -> list[dict]:
    dialogue = "<user>Query the meeting of {name} and remind {name}.</user>\n"
    return [{"system": SYSTEM, "user": dialogue.format(name=name), "other": {"id": i},
             "answer": [{"name": "QueryMeeting", "parameters": {"user_name": name}}] if i % 2 else
             {"name": "QueryMeeting", "parameters": {"user_name": name}}}
            for i, name in enumerate(["John", "Anna", "John", "Tony", "John", "Anna"])]


@pytest.fixture()
def api_bank_dir(tmp_path):
    directory = tmp_path / "api_bank"
    directory.mkdir()
    (directory / "level-1-api_processed.json").write_text(json.dumps(api_bank_items()), encoding="utf-8")
    (directory / "README.txt").write_text("not read", encoding="utf-8")
    return directory


def test_api_bank_items_read_as_one_tool_call_conversation_each(api_bank_dir) -> None:
    assert is_api_bank(api_bank_dir) and is_api_bank(api_bank_dir / "level-1-api_processed.json")
    assert not is_api_bank(api_bank_dir / "README.txt")
    trace = load_api_bank(api_bank_dir)
    assert [c.id for c in trace.conversations][:2] == ["level-1-api_processed#0", "level-1-api_processed#1"]
    first = trace.conversations[0]
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant"]
    assert first.messages[0]["content"] == SYSTEM and first.assistant_indices == [2]
    (call,) = first.messages[2]["tool_calls"]
    assert call["function"] == {"name": "QueryMeeting", "arguments": json.dumps({"user_name": "John"})}
    assert len(load_api_bank(api_bank_dir, limit=4).conversations) == 4


def test_analyze_reads_api_bank_data(tmp_path, api_bank_dir, capsys) -> None:
    tokenizer = tmp_path / "tok"
    make_byte_tokenizer().save_pretrained(tokenizer)
    out = tmp_path / "a.json"
    assert main(["analyze", str(api_bank_dir), "--policy", "suffix", "--tokenizer", str(tokenizer),
                 "--verify-cost", "0.02", "--json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["suffix"]["requests"] == 6


def test_api_bank_errors_name_the_file_and_item(tmp_path) -> None:
    with pytest.raises(TraceFormatError, match="no API-Bank file"):
        load_api_bank(tmp_path)
    bad = tmp_path / "level-2-api_processed.json"
    bad.write_text(json.dumps([{"system": "s", "user": "u", "answer": {"name": "A", "parameters": {}}},
                               {"system": "s", "user": "u", "answer": "not a call"}]), encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"level-2-api_processed.json item 1: 'answer' must be a call"):
        load_api_bank(bad)
    bad.write_text("{}", encoding="utf-8")
    with pytest.raises(TraceFormatError, match="expected a JSON array"):
        load_api_bank(bad)


def test_options_are_checked() -> None:
    assert KindSource.parse(" bfcl = a/b.jsonl ") == KindSource("bfcl", "a/b.jsonl")
    with pytest.raises(InvalidRequestError, match="NAME=PATH"):
        KindSource.parse("b.jsonl")
    with pytest.raises(InvalidRequestError, match="at least two kinds"):
        LokoOptions((KindSource("a", "x"),))
    with pytest.raises(InvalidRequestError, match="must differ"):
        LokoOptions((KindSource("a", "x"), KindSource("a", "y")))
    with pytest.raises(InvalidRequestError, match="max_conversations"):
        LokoOptions((KindSource("a", "x"), KindSource("b", "y")), max_conversations=0)
    assert evenly_spaced(list(range(10)), 4) == [0, 2, 5, 7]
    assert evenly_spaced(list(range(3)), 4) == [0, 1, 2] and evenly_spaced(list(range(3)), None) == [0, 1, 2]


def test_leave_one_kind_out_fits_on_the_others_and_is_deterministic(tmp_path, api_bank_dir) -> None:
    tokenizer = make_byte_tokenizer()
    agents = write_jsonl(tmp_path / "agents.jsonl", conversations() * 2)
    weather = write_jsonl(tmp_path / "weather.jsonl", [weather_conversation(f"w{i}", city) for i, city in
                                                        enumerate(["Oslo", "Rome", "Oslo", "Lima"])])
    kinds = (KindSource("agents", str(agents)), KindSource("weather", str(weather)),
             KindSource("api_bank", str(api_bank_dir)))
    options = LokoOptions(kinds, FitSettings(hidden=4, epochs=1, held_out=0.0), rounds=1, max_conversations=3)
    document = run_loko(options, tokenizer)
    assert list(document["kinds"]) == ["agents", "weather", "api_bank"]
    for name, entry in document["kinds"].items():
        assert entry["fitted_on"] == [kind.name for kind in kinds if kind.name != name]  # never on itself
        assert entry["conversations"] == 3 and entry["train_drafts"] > 0
        for cost in ("0.02", "0.005"):
            figures = entry["costs"][cost]
            assert set(figures) == {"hvd", "suffix", "oracle", "oracle-tree"}
            assert figures["oracle-tree"]["est_speedup"] >= figures["oracle"]["est_speedup"] > 1.0
            assert figures["hvd"]["cycles_per_1k"] > 0 and "precision" in figures["hvd"]
    assert document["kinds"]["agents"]["of"] == 6 and document["kinds"]["api_bank"]["of"] == 6
    assert run_loko(options, tokenizer) == document  # replays and fits are deterministic
    table = format_loko(document)
    assert table.splitlines()[0].startswith("leave one kind out") and "api_bank" in table and "0.005" in table


def test_loko_command_prints_the_table_and_writes_json(tmp_path, api_bank_dir, capsys) -> None:
    tokenizer = tmp_path / "tok"
    make_byte_tokenizer().save_pretrained(tokenizer)
    agents = write_jsonl(tmp_path / "agents.jsonl", conversations())
    out = tmp_path / "loko.json"
    weights = tmp_path / "w.json"
    PayoffWeights.default().save(weights)
    code = main(["loko", f"agents={agents}", f"api_bank={api_bank_dir}", "--tokenizer", str(tokenizer),
                 "--rounds", "0", "--hidden", "0", "--costs", "0.02", "--json", str(out), "--drop", "kind=*",
                 "--online-rate", "0.1", "--balance", "conversation", "--text-l2", "30"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "leave one kind out" in printed and "agents" in printed
    document = json.loads(out.read_text())
    assert document["_meta"]["settings"]["drop"] == ["kind=*"] and document["_meta"]["settings"]["online_rate"] == 0.1
    assert document["_meta"]["settings"]["balance"] == "conversation" and document["_meta"]["settings"]["text_l2"] == 30
    assert list(document["kinds"]["api_bank"]["costs"]) == ["0.02"]
    assert main(["loko", f"agents={agents}", f"api_bank={api_bank_dir}", "--tokenizer", str(tokenizer),
                 "--weights", str(weights), "--costs", "0.02"]) == 0
    assert "given weights on every kind" in capsys.readouterr().out
    shipped = tmp_path / "shipped.json"
    assert main(["loko", f"agents={agents}", f"api_bank={api_bank_dir}", "--tokenizer", str(tokenizer),
                 "--rounds", "1", "--epochs", "1", "--online-rate", "0.1", "--online-weighting", "position",
                 "--online-next-label", "--fit-all", str(shipped)]) == 0
    assert "weights written to" in capsys.readouterr().out
    fitted = PayoffWeights.load(shipped)  # fitted on both kinds, with the online step it was chosen with
    assert fitted.meta["sources"] == ["agents", "api_bank"] and fitted.mlp is not None
    assert fitted.online.learning_rate == 0.1 and fitted.online.weighting == "position" and fitted.online.next_label
    assert main(["loko", f"agents={agents}", "--tokenizer", str(tokenizer)]) == 2
    assert "at least two kinds" in capsys.readouterr().err
    assert main(["loko", f"agents={agents}", f"b={agents}", "--drop", "no_such_input", "--tokenizer",
                 str(tokenizer)]) == 2
    assert "names no input" in capsys.readouterr().err
    assert main(["loko", f"agents={agents}", f"b={agents}", "--balance", "conversation", "--tokenizer",
                 str(tokenizer)]) == 2  # the network's fit is not weighted
    assert "needs hidden=0" in capsys.readouterr().err
    assert main(["loko", f"agents={agents}", f"b={agents}", "--text-l2", "30", "--tokenizer",
                 str(tokenizer)]) == 2  # the network reads the text itself
    assert "needs hidden=0" in capsys.readouterr().err
