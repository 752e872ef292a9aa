"""The llama.cpp peer arm (hvd_agents.bench.llama_cpp and its use in bench / bench-prefix), with a fake
``llama_cpp.Llama``: none of these tests needs llama-cpp-python."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence

import pytest

import hvd_agents.bench.llama_cpp as peer_module
from hvd_agents.bench.agent_session import agent_tools, first_messages
from hvd_agents.bench.digest import output_digest
from hvd_agents.bench.live import Split, Tally, _Item, _peer_runner, group_rows, merge_tallies
from hvd_agents.bench.llama_cpp import (
    INSTALL_HINT,
    LlamaCppPeer,
    PeerResult,
    check_peers,
    common_prefix,
    gguf_path,
    reply_text,
    same_count,
)
from hvd_agents.bench.prefix import PeerArm, TurnFigures, peer_summary
from hvd_agents.bench.prompts import AgentPrompt
from hvd_agents.chat.render import encode_prompt
from hvd_agents.cli import main
from hvd_agents.errors import HVDError

EOS = 99


class FakeLlama:
    """The part of ``llama_cpp.Llama`` the peer uses, over a deterministic next-token function.

    ``generate`` keeps the longest common prefix of its evaluated tokens with the new
    prompt as ``Llama.generate`` does (at least one prompt token is evaluated again), and
    evaluates each yielded token only when the next one is asked for.
    """

    def __init__(self, next_token: Callable[[list[int]], int]) -> None:
        self.next_token = next_token
        self.input_ids: list[int] = []
        self.n_tokens = 0
        self.evaluated = 0  # tokens run through the model, over all calls
        self.calls: list[dict] = []

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self.input_ids[: self.n_tokens])

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: Sequence[int]) -> None:
        del self.input_ids[self.n_tokens :]
        self.input_ids += list(tokens)
        self.n_tokens += len(tokens)
        self.evaluated += len(tokens)

    def generate(self, tokens: Sequence[int], **kwargs):
        self.calls.append(kwargs)
        tokens = list(tokens)
        reset = kwargs.get("reset", True)
        if reset and self.n_tokens > 0:
            match = common_prefix(self.input_ids[: self.n_tokens], tokens)
            keep = match - 1 if match == len(tokens) else match
            if keep > 0:
                self.n_tokens, tokens, reset = keep, tokens[keep:], False
        if reset:
            self.reset()
        while True:
            self.eval(tokens)
            token = self.next_token(self.input_ids[: self.n_tokens])
            yield token
            tokens = [token]


def counting(seq: list[int]) -> int:
    """Next token: a function of the whole sequence, never EOS."""
    return (sum(seq) * 7 + len(seq)) % 50


def eos_after(n: int) -> Callable[[list[int]], int]:
    """Counts up from the prompt's length, then EOS once ``n`` tokens follow the first prompt token 0."""
    def next_token(seq: list[int]) -> int:
        return EOS if len(seq) - seq.index(0) > n else 10 + len(seq) % 40
    return next_token


def test_greedy_loop_stops_at_max_new_tokens_and_splits_prefill_from_decode() -> None:
    llm = FakeLlama(counting)
    result = LlamaCppPeer(llm).generate([1, 2, 3, 4, 5], max_new_tokens=6, stop_ids={EOS})
    assert len(result.token_ids) == 6 and EOS not in result.token_ids
    # greedy: each token is the fake model's choice after the prompt and the tokens before it
    seq = [1, 2, 3, 4, 5]
    for token in result.token_ids:
        assert token == counting(seq)
        seq.append(token)
    # prefill is the prompt but its last token; decode evaluates the last one and 5 new ones (not the 6th)
    assert result.prefilled_tokens == 4 and result.reused_tokens == 0
    assert llm.evaluated == 5 + 5
    assert result.prefill_s >= 0 and result.decode_s > 0
    assert result.decode_tokens_per_s == pytest.approx(6 / result.decode_s)
    assert llm.calls[0]["temp"] == 0.0 and llm.calls[0]["repeat_penalty"] == 1.0  # greedy, no penalty


def test_greedy_loop_stops_on_a_stop_id_and_keeps_it() -> None:
    llm = FakeLlama(eos_after(3))
    result = LlamaCppPeer(llm).generate([0, 1], max_new_tokens=50, stop_ids={EOS, 98})
    assert result.token_ids[-1] == EOS and EOS not in result.token_ids[:-1]
    assert len(result.token_ids) == 3  # 0, 1 and two tokens make 4 > 3: the third new token is EOS
    assert llm.evaluated == 2 + 2  # EOS itself is never evaluated


def test_generate_starts_fresh_each_call() -> None:
    llm = FakeLlama(counting)
    peer = LlamaCppPeer(llm)
    first = peer.generate([1, 2, 3], 4, {EOS})
    before = llm.evaluated
    again = peer.generate([1, 2, 3], 4, {EOS})
    assert again.token_ids == first.token_ids and again.reused_tokens == 0
    assert llm.evaluated - before == 3 + 3


def test_generate_reusing_prefills_only_past_the_cached_prefix_and_matches_a_fresh_run() -> None:
    llm = FakeLlama(counting)
    peer = LlamaCppPeer(llm)
    turn1 = [5, 6, 7, 8, 9, 10]
    first = peer.generate_reusing(turn1, 5, {EOS})
    assert first.reused_tokens == 0 and first.prefilled_tokens == 5
    # the next turn: the previous prompt, the reply's first tokens, then new ones (as a chat turn would)
    turn2 = [*turn1, *first.token_ids[:3], 40, 41, 42]
    before = llm.evaluated
    second = peer.generate_reusing(turn2, 5, {EOS})
    # cached: turn1 and the 4 reply tokens that were evaluated (the 5th never was); 3 of them match
    assert second.reused_tokens == len(turn1) + 3
    assert second.prefilled_tokens == len(turn2) - 1 - second.reused_tokens == 2
    assert llm.evaluated - before == 2 + 5  # the prefill, then the last prompt token and 4 new tokens
    fresh = LlamaCppPeer(FakeLlama(counting)).generate(turn2, 5, {EOS})
    assert second.token_ids == fresh.token_ids  # reuse changes the work, not the tokens


def test_generate_reusing_a_prompt_the_cache_already_holds() -> None:
    llm = FakeLlama(counting)
    peer = LlamaCppPeer(llm)
    first = peer.generate_reusing([1, 2, 3, 4], 3, {EOS})
    again = peer.generate_reusing([1, 2, 3, 4], 3, {EOS})
    assert again.reused_tokens == 3 and again.prefilled_tokens == 0 and again.token_ids == first.token_ids
    shorter = peer.generate_reusing([1, 2], 3, {EOS})  # the cache is cut back to the new prompt
    assert shorter.reused_tokens == 1
    assert shorter.token_ids == LlamaCppPeer(FakeLlama(counting)).generate([1, 2], 3, {EOS}).token_ids


def test_bad_requests_raise() -> None:
    peer = LlamaCppPeer(FakeLlama(counting))
    with pytest.raises(HVDError, match="max_new_tokens"):
        peer.generate([1, 2], 0, {EOS})
    with pytest.raises(HVDError, match="empty"):
        peer.generate([], 3, {EOS})


def test_missing_package_names_the_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(peer_module, "available", lambda: False)
    with pytest.raises(HVDError, match=r"pip install 'hvd-agents\[peers\]'") as info:
        check_peers(["llama.cpp"])
    assert "llama-cpp-python" in str(info.value)
    check_peers([])  # nothing asked for: nothing to check
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    with pytest.raises(HVDError, match=r"pip install 'hvd-agents\[peers\]'"):
        LlamaCppPeer.load(str(model), n_ctx=512, threads=1)
    assert INSTALL_HINT == "pip install 'hvd-agents[peers]'"


def test_cli_reports_the_missing_package_before_loading_a_model(monkeypatch, capsys) -> None:
    monkeypatch.setattr(peer_module, "available", lambda: False)

    def no_model(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr("hvd_agents.bench.live.shared_engine", no_model)
    monkeypatch.setattr("hvd_agents.bench.prefix.shared_engine", no_model)
    assert main(["bench", "--peers", "llama.cpp", "--max-new-tokens", "4"]) == 2
    assert "pip install 'hvd-agents[peers]'" in capsys.readouterr().err
    assert main(["bench-prefix", "--peers", "llama.cpp", "--turns", "1"]) == 2
    assert "pip install 'hvd-agents[peers]'" in capsys.readouterr().err
    assert main(["bench-prefix", "--peers", "llama.cpp", "--memory-turns", "3"]) == 2
    assert "--memory-turns" in capsys.readouterr().err


def test_unknown_peer_and_non_gguf_models_are_refused(monkeypatch, tmp_path) -> None:
    with pytest.raises(HVDError, match="unknown peer vllm"):
        check_peers(["vllm"])
    monkeypatch.setattr(peer_module, "available", lambda: True)
    with pytest.raises(HVDError, match=r"\.gguf file"):
        check_peers(["llama.cpp"], "HuggingFaceTB/SmolLM2-135M-Instruct")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert gguf_path(str(model)) == model
    check_peers(["llama.cpp"], str(model))


def test_identity_counts_and_the_group_table() -> None:
    assert same_count([(1, 2), (3,)], [[1, 2], [3, 4]]) == 1
    assert same_count([], []) == 0

    def tally(seconds: float, *outputs: tuple[int, ...]) -> Tally:
        return Tally(sum(len(o) for o in outputs), seconds, list(outputs))

    tallies = {
        "agent": {"engine-ar": tally(1.0, (1, 2), (3, 4)), "engine-hvd": tally(0.5, (1, 2), (3, 4)),
                  "llama.cpp": tally(0.8, (1, 2), (3, 4))},
        "chat": {"engine-ar": tally(2.0, (5, 6), (7, 8)), "engine-hvd": tally(1.0, (5, 6), (7, 8)),
                 "llama.cpp": tally(1.0, (5, 6), (7, 9))},
    }
    merged = {name: merge_tallies([tallies[g][name] for g in tallies]) for name in tallies["agent"]}
    assert merged["llama.cpp"].outputs == [(1, 2), (3, 4), (5, 6), (7, 9)] and merged["llama.cpp"].tokens == 8
    splits = {"engine-ar": {"agent": Split(4, 0.2, 0.8)}, "engine-hvd": {"agent": Split(4, 0.2, 0.3)},
              "llama.cpp": {"agent": Split(4, 0.1, 0.5), "chat": Split(4, 0.1, 0.9)}}
    heads, rows = group_rows(tallies, merged, splits)
    assert heads == ["agent (2)", "chat (2)", "all (4)"]
    table = dict(rows)
    assert table["llama.cpp tokens = engine-ar"] == ["2/2", "1/2", "3/4"]
    assert table["engine-hvd / llama.cpp"] == ["1.60x", "1.00x", "1.20x"]  # 8/0.5 over 4/0.8 ...
    assert table["engine-ar / llama.cpp"] == ["0.80x", "0.50x", "0.60x"]
    assert table["llama.cpp decode tok/s"] == ["8.0", "4.4", "5.7"]
    assert table["engine-hvd decode tok/s"][1] == "0.0"  # no split reported for chat
    assert table["decode engine-hvd / llama.cpp"][0] == f"{(4 / 0.3) / 8:.2f}x"
    # without the peer: no peer rows
    _, plain_rows = group_rows({"agent": {"engine-ar": tallies["agent"]["engine-ar"]}},
                               {"engine-ar": tallies["agent"]["engine-ar"]}, {})
    assert [label for label, _ in plain_rows] == ["engine-ar"]


def test_peer_runner_adds_up_by_prompt_group() -> None:
    splits: dict[str, Split] = {}
    run = _peer_runner(LlamaCppPeer(FakeLlama(counting)), 4, [EOS], splits)
    prompt = AgentPrompt("p", [])
    assert len(run(_Item(prompt, [1, 2, 3], "agent"))) == 4
    run(_Item(prompt, [1, 2, 3, 4], "chat"))
    run(_Item(prompt, [1, 2], "chat"))
    assert set(splits) == {"agent", "chat"} and splits["agent"].tokens == 4 and splits["chat"].tokens == 8


def test_reply_text_leaves_out_a_final_stop_id(byte_tokenizer) -> None:
    eos = byte_tokenizer.eos_token_id
    ids = byte_tokenizer("ok, done", add_special_tokens=False).input_ids
    assert reply_text(byte_tokenizer, [*ids, eos], {eos}) == "ok, done"
    assert reply_text(byte_tokenizer, ids, {eos}) == "ok, done"


def test_peer_arm_follows_its_own_replies_and_reuses_its_prefix(byte_tokenizer) -> None:
    eos = byte_tokenizer.eos_token_id
    # replies: lower-case letters, the byte tokenizer's own ids, never EOS
    llm = FakeLlama(lambda seq: ord("a") + len(seq) % 26)
    arm = PeerArm("llama.cpp+reuse", LlamaCppPeer(llm), byte_tokenizer, 1 << 20, 6, frozenset({eos}),
                  first_messages())
    tools = agent_tools()
    arm.run_turn(0, tools)
    arm.run_turn(1, tools)
    one, two = arm.turns
    assert one.reused_tokens == 0 and len(one.token_ids) == len(two.token_ids) == 6
    reply = reply_text(byte_tokenizer, one.token_ids, {eos})
    assert arm.messages[-4]["content"] == reply  # turn 1's reply went back as the assistant message
    assert len(encode_prompt(byte_tokenizer, arm.messages[:-2], tools)) == two.prompt_tokens
    assert one.prompt_tokens < two.reused_tokens < two.prompt_tokens  # the first prompt and more stayed cached


def test_peer_summary_says_where_replies_diverge() -> None:
    class Turns:
        def __init__(self, name: str, outputs: list[tuple[int, ...]], latency: float) -> None:
            self.name = name
            self.turns = [TurnFigures(10, 0, 0.1, latency, o) for o in outputs]

    ours = [(1,), (2,), (3,)]
    plain, reuse, hvd = Turns("ar", ours, 3.0), Turns("ar+reuse", ours, 2.0), Turns("hvd+reuse", ours, 1.0)
    same = peer_summary(plain, reuse, hvd, Turns("llama.cpp+reuse", ours, 1.5))
    assert "hvd+reuse vs llama.cpp+reuse 1.50x" in same[0]
    assert same[1] == "llama.cpp+reuse replies token-identical to ar's: 3/3 turns"
    differ = peer_summary(plain, reuse, hvd, Turns("llama.cpp+reuse", [(1,), (9,), (3,)], 1.5))
    assert "2/3 turns; they first differ at turn 2" in differ[1] and "from turn 3 on" in differ[1]
    assert output_digest(t.token_ids for t in plain.turns) != output_digest([(1,), (9,), (3,)])


def test_peer_result_without_decode_time() -> None:
    assert PeerResult((), 0.0, 0.0).decode_tokens_per_s == 0.0
