"""The examples in examples/, each run short on the embedded model (the session's shared engine).

Each example's ``main(argv, engine)`` runs its workflow and returns its tools' call log
and its report; the checks are on what happened (the steered calls and their
arguments, the answers, the printed summary), and, where a run is short, that the
conversation under ``hvd`` equals the one under plain ``ar`` decoding.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))  # the examples import their helpers (_report, _loop, ...) as top-level modules

pytestmark = pytest.mark.real_model


def _summary_has_numbers(out: str, turns: int) -> None:
    total = re.search(r"^total\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", out,
                      re.MULTILINE)
    assert total, out
    wall, calls, prompt, _, _, new, tok_s, per_step = total.groups()
    assert float(wall) > 0 and int(calls) >= turns and int(prompt) > 0 and int(new) > 0
    assert float(tok_s) > 0 and float(per_step) >= 1.0
    assert re.search(r"^accepted/drafted: \d+/\d+", out, re.MULTILINE)
    assert re.search(r"^  suffix:\S+\s+\d+ accepted of\s+\d+ drafted", out, re.MULTILINE)


def test_airline_langchain_agent_looks_up_the_user_and_compares_with_ar(real_engine, capsys) -> None:
    import airline_langchain

    airline, messages, report = airline_langchain.main(["--max-turns", "1", "--max-new-tokens", "48", "--compare"],
                                                       engine=real_engine)
    assert airline.calls == [("get_user_details", {"user_id": "mia_li_3668"})]
    assert messages[-1].content.strip() and not messages[-1].tool_calls
    assert len(report.turns) == 1 and len(report.turns[0].calls) == 2  # the steered call, then the answer
    out = capsys.readouterr().out
    assert "tool calls: 1 of 1 parsed; each is decoded under the tool's grammar" in out
    assert f"still steered: {airline_langchain.STEERING}" in out and "forced by name" in airline_langchain.STEERING
    _summary_has_numbers(out, turns=1)
    # the side by side: the plain run made the same two calls with the same tokens
    assert re.search(r"^== hvd against plain decoding \(ar\)", out, re.MULTILINE), out
    assert re.search(r"^total\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+yes$", out, re.MULTILINE), out
    assert "identical tokens: yes (2 of 2 model calls)" in out
    assert re.search(r"^speedup: [\d.]+x end to end .* [\d.]+x in decoding$", out, re.MULTILINE), out
    assert "own_model.py --model" in out


def test_side_by_side_says_no_when_a_call_differs() -> None:
    from types import SimpleNamespace

    from _report import Report, side_by_side

    fast, plain = Report("t", "hvd"), Report("t", "ar")
    for report, steps in ((fast, 2), (plain, 4)):
        with report.turn("one"):
            report.add_call({"new_tokens": 4, "decode_s": 0.5, "steps": steps})
    lines = side_by_side(fast, plain, [SimpleNamespace(token_ids=(1, 2, 3, 4))],
                         [SimpleNamespace(token_ids=(1, 2, 3, 5))])
    assert lines[2].split()[-1] == "no" and lines[3].split()[0] == "total" and lines[3].split()[-1] == "no"
    assert lines[4] == "identical tokens: no (0 of 1 model calls)"
    assert lines[2].split()[-2] == "2.00"  # hvd's tokens per step


def test_calculator_llamaindex_agent_multiplies_and_equals_ar(real_engine, capsys) -> None:
    import calculator_llamaindex

    # the model writes the whole call (nothing pre-filled): its opening, name and arguments take ~30 tokens
    argv = ["--max-turns", "1", "--max-new-tokens", "64"]
    workspace, answers, _ = calculator_llamaindex.main(argv, engine=real_engine)
    assert workspace.calls == [("multiply", {"a": 1234, "b": 56})]
    assert "69104" in answers[0]
    _summary_has_numbers(capsys.readouterr().out, turns=1)
    plain, plain_answers, _ = calculator_llamaindex.main([*argv, "--method", "ar"], engine=real_engine)
    assert (plain.calls, plain_answers) == (workspace.calls, answers)


def test_coding_loop_lists_the_sources(real_engine, capsys) -> None:
    import coding_loop

    repo, messages, report = coding_loop.main(["--max-steps", "1", "--max-new-tokens", "32"], engine=real_engine)
    assert repo.calls == [("list_files", {"directory": "src"})]
    assert messages[-2]["role"] == "tool" and "src/tax.py" in messages[-2]["content"]
    assert report.totals()["reused_prefix_tokens"] > 0  # the answer's call reused the first call's prompt KV
    _summary_has_numbers(capsys.readouterr().out, turns=1)


def test_own_model_is_steered_on_the_embedded_model_and_equals_ar(real_engine, capsys) -> None:
    import own_model

    assert own_model.parse_args([]).steer is None and own_model.parse_args(["--free"]).steer is False
    argv = ["--max-turns", "1", "--max-new-tokens", "64"]  # the whole call is the model's (nothing pre-filled)
    airline, messages, _ = own_model.main(argv, engine=real_engine)
    assert airline.calls == [("get_user_details", {"user_id": "mia_li_3668"})]
    out = capsys.readouterr().out
    assert "steered (example exchange + forced tool_choice)" in out
    _summary_has_numbers(out, turns=1)
    _, plain_messages, _ = own_model.main([*argv, "--method", "ar"], engine=real_engine)
    assert plain_messages == messages
