"""``hvd-agents demo``: the agent turn by ``hvd``, the same turn by plain decoding, and the side-by-side."""

from __future__ import annotations

import re

import pytest

from hvd_agents import demo
from hvd_agents.engine import GenerationResult, RequestStats


def _call(label: str, token_ids: tuple[int, ...], wall_s: float, steps: int) -> demo.DemoCall:
    stats = RequestStats(new_tokens=len(token_ids), decode_s=wall_s, steps=steps)
    return demo.DemoCall(label, label, "", GenerationResult(token_ids, "", "stop", stats), wall_s)


def test_side_by_side_reports_speedup_rates_and_a_token_difference() -> None:
    fast = [_call("tool call", (1, 2, 3, 4), 1.0, 2), _call("answer", (5, 6), 1.0, 2)]
    plain = [_call("tool call", (1, 2, 3, 4), 2.0, 4), _call("answer", (5, 7), 1.0, 2)]
    lines = demo.side_by_side(fast, plain, "hvd")
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert rows["tool"][3:] == ["1.00", "2.00x", "2.0", "4.0", "2.00", "yes"]
    assert rows["answer"][-1] == "no" and rows["total"][-1] == "no"
    assert rows["total"][3] == "1.50x"
    assert "identical tokens: no" in lines


@pytest.mark.real_model
def test_demo_runs_hvd_then_ar_with_identical_tokens(real_engine, monkeypatch, capsys) -> None:
    monkeypatch.setattr(demo, "shared_engine", lambda *args, **kwargs: real_engine)
    demo.run_demo()
    out = capsys.readouterr().out
    # nothing pre-filled: the model wrote the call's opening and name itself, under the tools' grammar
    assert "== assistant: tool call (tool_choice=required, under the tools' grammar)\n<tool_call>\n" \
        '{"name": "get_weather", "arguments": {' in out and "-> get_weather(" in out
    table = out.split("== hvd against plain greedy decoding (ar)", 1)[1]
    assert re.search(r"^tool call .* yes$", table, re.MULTILINE), table
    assert re.search(r"^answer .* yes$", table, re.MULTILINE), table
    assert "identical tokens: yes" in table and "--model" in table
    assert demo.GRAMMAR_NOTE in table
