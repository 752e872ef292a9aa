"""``hvd-agents bench-head``: the draft head's acceptance per prompt kind, along the target's greedy path."""

from __future__ import annotations

import pytest

from hvd_agents.bench.head_acceptance import Acceptance, run_head_benchmark
from hvd_agents.cli import main
from hvd_agents.draft_head.weights import shipped_heads


def test_acceptance_counts_each_position_given_the_ones_before() -> None:
    tally = Acceptance(k=3)
    tally.add(3, 0)
    tally.add(3, 1)
    tally.add(3, 3)
    tally.add(2, 2)  # a draft cut short: it offers no third token
    assert tally.drafts == 4 and tally.drafted == 11 and tally.accepted == 6
    assert tally.rate(1) == 3 / 4  # first tokens: 3 of 4 accepted
    assert tally.rate(2) == 2 / 3  # second tokens offered after an accepted first: 3, accepted 2
    assert tally.rate(3) == 1 / 1  # only the first draft had a third token after two accepted
    assert tally.per_token == 6 / 11 and tally.per_draft == 6 / 4
    other = Acceptance(k=3)
    other.add(1, 1)
    tally.merge(other)
    assert tally.drafts == 5 and tally.rate(1) == 4 / 5


@pytest.mark.real_model
def test_bench_head_measures_the_shipped_head_per_kind_losslessly(real_engine, capsys) -> None:
    tallies = run_head_benchmark(k=2, max_new_tokens=8)
    by_kind = tallies["shipped"]
    assert set(by_kind) == {"chat", "code", "json", "tools"}
    for kind, tally in by_kind.items():
        assert tally.same == tally.prompts > 0, kind  # every output equals ar's
        assert tally.drafts > 0 and tally.drafted <= 2 * tally.drafts, kind
    assert sum(t.accepted for t in by_kind.values()) > 0
    out = capsys.readouterr().out
    assert "acc@1" in out and "shipped" in out and " all " in out


@pytest.mark.real_model
def test_bench_head_compares_a_head_file_and_refuses_nothing_to_measure(real_engine, capsys) -> None:
    path = next(p for p in shipped_heads() if p.name.startswith("smollm2-135m"))
    assert main(["bench-head", "--no-shipped", "--head", str(path), "--k", "1", "--max-new-tokens", "4"]) == 0
    assert path.stem in capsys.readouterr().out
    assert main(["bench-head", "--no-shipped", "--k", "1"]) == 2
    assert "no head to measure" in capsys.readouterr().err
