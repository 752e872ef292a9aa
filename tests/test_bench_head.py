"""``hvd-agents bench-head``: the draft head's acceptance per prompt kind, along the target's greedy path."""

from __future__ import annotations

import pytest
import torch

from hvd_agents.bench.head_acceptance import Acceptance, forced_agreement, run_head_benchmark
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


def test_forced_agreement_counts_the_positions_after_a_miss() -> None:
    tally = Acceptance(k=2)
    tally.add_forced([True, False, True, False, False, True])
    assert tally.forced == [3, 6] and tally.after_miss == [2, 3]  # positions 2, 4 and 5 follow a miss
    other = Acceptance(k=2)
    other.add_forced([False])
    tally.merge(other)
    assert tally.forced == [3, 7] and tally.forced_rate == 3 / 7 and tally.after_miss_rate == 2 / 3


def test_forced_agreement_is_the_heads_teacher_forced_prediction() -> None:
    """Step by step through the head's cache, as drafting runs it, the prediction at each answer index equals
    the training's teacher-forced pass over the whole sequence at once."""
    from hvd_agents.distill.data import Sample
    from hvd_agents.distill.train import ttt_forward
    from tests.test_draft_head import VOCAB, random_head
    from tests.tiny import make_tiny_llama

    target = make_tiny_llama(VOCAB, seed=11)
    head = random_head(target)
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, VOCAB, (30,), generator=generator)
    with torch.no_grad():
        hidden = target(input_ids=tokens[None], output_hidden_states=True).hidden_states[-1][0]  # [T, d]
    predicted_ids = head.draft_vocab[
        head.logits(ttt_forward(head, hidden[None, :-1], tokens[None, 1:], torch.ones(1, 29, dtype=torch.bool), 1)[0][0])
        .argmax(-1)]  # [T - 1]: head index t's prediction of token t + 2
    start = 12
    for label in (predicted_ids, torch.randint(0, VOCAB, (29,), generator=generator)):
        greedy = torch.cat([torch.zeros(1, dtype=torch.long), label])  # greedy[t + 1] is index t's label
        agreed = forced_agreement(head, Sample(tokens, hidden, greedy, start))
        expected = [bool(predicted_ids[t] == greedy[t + 1]) for t in range(start - 1, 29)]
        assert agreed == expected and len(agreed) == 30 - start
    assert all(forced_agreement(head, Sample(tokens, hidden, torch.cat([torch.zeros(1, dtype=torch.long),
                                                                        predicted_ids]), start)))


def test_forced_agreement_reads_the_layers_each_head_fuses() -> None:
    # rows recorded with layers 0 and 1 tapped: a head fusing layer 1 reads its block (its zero fusion agrees with
    # the untapped head on the last-layer states), one fusing layer 2 is refused by name
    from hvd_agents.distill.data import Sample
    from hvd_agents.draft_head.model import with_taps
    from tests.test_draft_head import VOCAB, random_head
    from tests.tiny import make_tiny_llama

    target = make_tiny_llama(VOCAB, seed=11)
    head = random_head(target)
    tapped = with_taps(head, (1,)).attach(target)
    tokens = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        states = target(input_ids=tokens[None], output_hidden_states=True).hidden_states
    wide = torch.cat([states[-1][0], states[0][0], states[1][0]], dim=-1)
    greedy = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(7))
    recorded = Sample(tokens, wide, greedy, 10, taps=(0, 1))
    assert forced_agreement(tapped, recorded) == forced_agreement(head, Sample(tokens, states[-1][0], greedy, 10))
    with torch.no_grad():
        tapped.fuse.weight.normal_(0, 1.0)
    assert torch.equal(recorded.features((1,)), torch.cat([states[-1][0], states[1][0]], dim=-1))
    with pytest.raises(ValueError, match=r"hold the inputs of layers \(0, 1\), not \(2,\)"):
        recorded.features((2,))


@pytest.mark.real_model
def test_bench_head_measures_the_shipped_head_per_kind_losslessly(real_engine, capsys) -> None:
    tallies = run_head_benchmark(k=2, max_new_tokens=8)
    by_kind = tallies["shipped"]
    assert set(by_kind) == {"chat", "code", "json", "tools"}
    for kind, tally in by_kind.items():
        assert tally.same == tally.prompts > 0, kind  # every output equals ar's
        assert tally.drafts > 0 and tally.drafted <= 2 * tally.drafts, kind
    assert sum(t.accepted for t in by_kind.values()) > 0
    for kind, tally in by_kind.items():  # teacher-forced at each answer position after the first
        assert tally.forced[1] > 0 and tally.after_miss[1] <= tally.forced[1], kind
    out = capsys.readouterr().out
    assert "acc@1" in out and "shipped" in out and " all " in out and "forced@1" in out


@pytest.mark.real_model
def test_bench_head_compares_a_head_file_and_refuses_nothing_to_measure(real_engine, capsys) -> None:
    path = next(p for p in shipped_heads() if p.name.startswith("smollm2-135m"))
    assert main(["bench-head", "--no-shipped", "--head", str(path), "--k", "1", "--max-new-tokens", "4"]) == 0
    assert path.stem in capsys.readouterr().out
    assert main(["bench-head", "--no-shipped", "--k", "1"]) == 2
    assert "no head to measure" in capsys.readouterr().err
