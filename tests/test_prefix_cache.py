"""Prefix KV cache: unit tests on hand-made token arrays, losslessness, memory bound.

Unit tests fill caches with KV whose keys ENCODE their token id (every element of
position i is ``token_ids[i]``), so a copied prefix can be checked position by position.
"""

from __future__ import annotations

import random
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from hvd_agents import Engine, GenerationParams
from hvd_agents.engine.prefix_cache import PrefixCache, common_prefix_length
from hvd_agents.runtime.kv import new_cache
from tests.tiny import make_tiny_llama

VOCAB = 64
SYS = [50, 51, 52, 53, 54, 55]  # a "system prompt" every conversation starts with


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(VOCAB)


def encoded_cache(config, token_ids: list[int]) -> DynamicCache:
    """A cache whose keys and values at position i are filled with ``token_ids[i]``."""
    cache = new_cache(config)
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    kv = torch.tensor(token_ids, dtype=torch.float64).view(1, 1, -1, 1).expand(1, heads, -1, dim).contiguous()
    for layer in cache.layers:
        layer.update(kv.clone(), kv.clone())
    return cache


def decoded(cache: DynamicCache) -> list[int]:
    """The token ids a cache built by :func:`encoded_cache` encodes (checked identical in every layer)."""
    first = cache.layers[0].keys[0, 0, :, 0].long().tolist()
    for layer in cache.layers:
        assert layer.keys[0, 0, :, 0].long().tolist() == first
        assert layer.values[0, 0, :, 0].long().tolist() == first
    return first


def entry_bytes(config, n: int) -> int:
    """Storage bytes of an n-token entry of the tiny model (float64 keys + values)."""
    per_layer = 2 * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * 8
    return n * per_layer * config.num_hidden_layers


def put(pc: PrefixCache, config, ids: list[int], prompt_len: int | None = None, session: str | None = None) -> bool:
    return pc.insert(ids, encoded_cache(config, ids), prompt_len=prompt_len or len(ids), session_id=session)


def look(pc: PrefixCache, config, ids: list[int], session: str | None = None):
    cache = new_cache(config)
    match = pc.lookup(ids, cache, session_id=session)
    assert cache.get_seq_length() == match.length
    if match.length:
        assert decoded(cache) == ids[: match.length]  # the copied KV is exactly that of the shared prefix
    return match


# ---------------------------------------------------------------- unit tests on hand-made arrays


def test_common_prefix_length() -> None:
    import numpy as np

    assert common_prefix_length(np.array([1, 2, 3]), np.array([1, 2, 4])) == 2
    assert common_prefix_length(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix_length(np.array([9]), np.array([1])) == 0


def test_longest_match_wins_and_only_the_shared_prefix_is_copied(tiny) -> None:
    pc = PrefixCache(1 << 20)
    put(pc, tiny.config, SYS + [1, 2, 3])
    put(pc, tiny.config, SYS + [1, 2, 7, 8])  # shares SYS + [1, 2] with the first
    put(pc, tiny.config, [9, 9, 9])
    assert look(pc, tiny.config, SYS + [1, 2, 7, 8, 10]).length == len(SYS) + 4  # the second, extended
    assert look(pc, tiny.config, SYS + [1, 2, 3, 4]).length == len(SYS) + 3  # the first
    assert look(pc, tiny.config, SYS + [1, 5]).length == len(SYS) + 1  # diverges inside both
    assert look(pc, tiny.config, [4, 4]).length == 0
    stats = pc.stats()
    assert stats.lookups == 4 and stats.hits == 3 and stats.reused_tokens == 3 * len(SYS) + 8


def test_branches_sharing_only_the_system_prompt_both_find_it(tiny) -> None:
    # copy, not consume: after agent A's turn is reused, agent B still finds the shared system prompt
    pc = PrefixCache(1 << 20)
    put(pc, tiny.config, SYS + [1, 1, 1])
    assert look(pc, tiny.config, SYS + [1, 1, 1, 2]).length == len(SYS) + 3
    assert look(pc, tiny.config, SYS + [3, 3]).length == len(SYS)
    assert look(pc, tiny.config, SYS + [4]).length == len(SYS)
    assert pc.stats().entries == 1


def test_a_growing_conversation_occupies_one_entry(tiny) -> None:
    pc = PrefixCache(1 << 20)
    ids = list(SYS)
    for turn in range(5):
        ids += [turn, turn + 1, turn + 2]
        put(pc, tiny.config, ids)
    stats = pc.stats()
    assert stats.entries == 1 and stats.subsumed == 4
    assert stats.bytes == entry_bytes(tiny.config, len(ids))
    assert not put(pc, tiny.config, ids[:5])  # already covered by the stored entry: nothing new kept
    assert pc.stats().entries == 1


def test_lru_eviction_keeps_bytes_within_budget(tiny) -> None:
    budget = entry_bytes(tiny.config, 25)  # room for two 10-token entries, not three
    pc = PrefixCache(budget)
    a, b, c = [1] * 10, [2] * 10, [3] * 10
    put(pc, tiny.config, a)
    put(pc, tiny.config, b)
    look(pc, tiny.config, a + [5])  # a is now more recently used than b
    put(pc, tiny.config, c)
    assert look(pc, tiny.config, a).length == 10
    assert look(pc, tiny.config, b).length == 0  # b was the least recently used: evicted
    assert look(pc, tiny.config, c).length == 10
    stats = pc.stats()
    assert stats.evicted == 1 and stats.bytes <= budget and stats.peak_bytes <= budget


def test_an_entry_larger_than_the_budget_keeps_the_prefix_that_fits(tiny) -> None:
    pc = PrefixCache(entry_bytes(tiny.config, 8))
    put(pc, tiny.config, SYS + list(range(20)))
    stats = pc.stats()
    assert stats.truncated == 1 and stats.bytes == entry_bytes(tiny.config, 8)
    assert look(pc, tiny.config, SYS + list(range(20))).length == 8


@pytest.mark.parametrize("budget", [0, None])
def test_disabled_cache_keeps_and_finds_nothing(tiny, budget) -> None:
    pc = PrefixCache(budget)
    assert not pc.enabled
    assert not put(pc, tiny.config, SYS)
    assert look(pc, tiny.config, SYS).length == 0
    assert pc.stats().bytes == 0


def test_lookups_copy_so_stored_entries_never_change(tiny) -> None:
    pc = PrefixCache(1 << 20)
    put(pc, tiny.config, SYS + [1, 2, 3])
    cache = new_cache(tiny.config)
    pc.lookup(SYS + [1, 2, 3], cache)
    with torch.inference_mode():  # scribble over the copy in place (the engine's caches hold inference tensors)
        for layer in cache.layers:
            layer.keys.fill_(-1.0)
            layer.values.fill_(-1.0)
    cache.crop(-2)
    assert look(pc, tiny.config, SYS + [1, 2, 3]).length == len(SYS) + 3  # look() checks the content


def test_insert_needs_a_cache_covering_the_tokens(tiny) -> None:
    pc = PrefixCache(1 << 20)
    with pytest.raises(ValueError):
        pc.insert([1, 2, 3], encoded_cache(tiny.config, [1, 2]), prompt_len=3)
    with pytest.raises(ValueError):
        pc.lookup([1], encoded_cache(tiny.config, [1]))  # lookups fill an EMPTY cache


def test_history_rewrite_is_a_prefix_break_and_a_rerendered_reply_a_reply_mismatch(tiny) -> None:
    pc = PrefixCache(1 << 20)
    prompt, reply = SYS + [1, 2, 3, 4], [20, 21, 22]
    put(pc, tiny.config, prompt + reply, prompt_len=len(prompt), session="s")
    extended = look(pc, tiny.config, prompt + reply + [30, 31], session="s")
    assert extended.prefix_break_at is None and extended.reply_mismatch_at is None
    reply_changed = look(pc, tiny.config, prompt + [20, 25, 30], session="s")  # reply tokenized differently
    assert reply_changed.reply_mismatch_at == len(prompt) + 1 and reply_changed.prefix_break_at is None
    rewritten = look(pc, tiny.config, SYS + [1, 9, 3, 4, 20], session="s")  # earlier turn dropped / edited
    assert rewritten.prefix_break_at == len(SYS) + 1 and rewritten.reply_mismatch_at is None
    assert rewritten.length == len(SYS) + 1  # the unchanged part is still reused
    other = look(pc, tiny.config, SYS + [1, 9], session="other")  # a branch of another session: no break
    assert other.prefix_break_at is None and other.length == len(SYS) + 1
    assert look(pc, tiny.config, prompt[:-1], session="s").prefix_break_at is None  # a retry of a shorter prompt


def test_concurrent_lookups_only_ever_see_complete_entries(tiny) -> None:
    # inserts and lookups from several threads; every copied KV must be exactly that of
    # its tokens (look() checks it), never a mix or a partially written entry
    pc = PrefixCache(entry_bytes(tiny.config, 120))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                ids = SYS + [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
                if rng.random() < 0.5:
                    put(pc, tiny.config, ids, session=str(seed))
                else:
                    look(pc, tiny.config, ids, session=str(seed))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert pc.stats().peak_bytes <= pc.budget_bytes


# ---------------------------------------------------------------- engine: lossless, stats, memory


def twin_engines(model) -> tuple[Engine, Engine]:
    """Same model, separate drafter stores fed the same requests: one with prefix reuse, one without."""
    return Engine(model, eos_token_ids=()), Engine(model, eos_token_ids=(), prefix_cache_bytes=0)


turn_strategy = st.tuples(
    st.lists(st.integers(0, 9), min_size=1, max_size=10),  # new messages appended to the conversation
    st.integers(1, 12),  # max_new_tokens
    st.sampled_from(["extend", "extend", "rewrite", "drop-reply", "branch"]),  # how the next prompt is made
    st.integers(0, 1000),  # position / seed material
)


@pytest.mark.parametrize("method", ["ar", "pld", "hvd-cache", "hvd"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.lists(st.integers(0, 9), min_size=1, max_size=12), turns=st.lists(turn_strategy, min_size=1, max_size=5))
def test_reuse_equals_no_reuse_over_random_conversation_growth(tiny, method, temperature, start, turns) -> None:
    reuse, plain = twin_engines(tiny)
    prompt = SYS + start
    computed = 0  # tokens of the prompt whose KV an earlier request of this conversation computed
    for new, max_new, how, salt in turns:
        params = GenerationParams(max_new_tokens=max_new, method=method, temperature=temperature, seed=salt,
                                  num_draft_tokens=6)
        got = reuse.generate(prompt, params, req_id="r")
        expected = plain.generate(prompt, params, req_id="r")
        assert got.token_ids == expected.token_ids
        stats = got.stats
        assert stats.reused_prefix_tokens + stats.prefilled_tokens == len(prompt) - 1
        assert expected.stats.reused_prefix_tokens == 0
        assert stats.reused_prefix_tokens >= computed
        computed = 0
        if how == "extend":  # the agent loop: the whole conversation plus the reply plus new messages
            computed = len(prompt) + len(got.token_ids) - 1  # all but the reply's last token
            prompt = prompt + list(got.token_ids) + new
        elif how == "rewrite":  # an earlier token edited
            prompt = prompt + list(got.token_ids) + new
            prompt[salt % len(prompt)] = (prompt[salt % len(prompt)] + 1) % 10
        elif how == "drop-reply":  # the reply not sent back (e.g. reasoning dropped)
            prompt = prompt + new
        else:  # another conversation sharing the system prompt
            prompt = SYS + new


def test_agent_loop_reuses_all_but_the_new_messages(tiny) -> None:
    reuse, _ = twin_engines(tiny)
    prompt = SYS + [1, 2, 3]
    for turn in range(4):
        result = reuse.generate(prompt, GenerationParams(max_new_tokens=5, method="ar"))
        if turn:  # computed before: all but the reply's last token (never fed) and the 3 new tokens;
            # the prompt's own last token is fed with the first draft, not prefilled
            assert result.stats.prefilled_tokens == 1 + 3 - 1
            assert result.stats.reused_prefix_tokens == len(prompt) - 4
        prompt = prompt + list(result.token_ids) + [turn, 7, 8]
    off = reuse.generate(prompt, GenerationParams(max_new_tokens=5, method="ar", reuse_prefix=False))
    assert off.stats.reused_prefix_tokens == 0 and off.stats.prefilled_tokens == len(prompt) - 1
    data = off.stats.to_dict()
    assert {"reused_prefix_tokens", "prefilled_tokens", "prefix_break_at", "reply_mismatch_at"} <= set(data)


def test_stop_mid_draft_and_closed_stream_keep_a_consistent_entry(tiny) -> None:
    # a stop token inside an accepted draft leaves extra verified positions in the cache,
    # and a stream closed between steps leaves a partial output: both entries must still
    # hold exactly the KV of their tokens, so a later request equals a fresh computation
    reuse, plain = twin_engines(tiny)
    prompt = SYS + [1, 2, 3, 1, 2, 3]
    reference = plain.generate(prompt, GenerationParams(max_new_tokens=20, method="ar")).token_ids
    stop = GenerationParams(max_new_tokens=20, method="pld", stop_token_ids=(reference[4],))
    reuse.generate(prompt, stop)
    stream = reuse.stream(prompt + [4], GenerationParams(max_new_tokens=20, method="ar"))
    next(stream)
    stream.close()
    for follow in (prompt + list(reference[:8]) + [5], prompt + [4, 6]):
        params = GenerationParams(max_new_tokens=10, method="ar")
        got = reuse.generate(follow, params)
        assert got.stats.reused_prefix_tokens >= len(prompt)
        assert got.token_ids == plain.generate(follow, params).token_ids


def test_memory_stays_within_budget_over_a_200_turn_loop(tiny, capsys) -> None:
    budget = entry_bytes(tiny.config, 300)
    engine = Engine(tiny, eos_token_ids=(), prefix_cache_bytes=budget)
    rng = random.Random(0)
    sessions: dict[int, list[int]] = {}
    reused = 0
    for turn in range(200):
        session = rng.randrange(6)  # six interleaved agent conversations
        prompt = sessions.get(session, SYS + [session]) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 8))]
        if len(prompt) > 200:  # the conversation ends; a new one starts
            prompt = SYS + [session]
        result = engine.generate(prompt, GenerationParams(max_new_tokens=4, method="ar"))
        reused += result.stats.reused_prefix_tokens
        sessions[session] = prompt + list(result.token_ids)
        assert engine.prefix_cache.stats().bytes <= budget
    stats = engine.prefix_cache.stats()
    with capsys.disabled():
        print(f"\n200 turns: budget {budget} B, peak {stats.peak_bytes} B, now {stats.bytes} B in {stats.entries} "
              f"entries, evicted {stats.evicted}, subsumed {stats.subsumed}, reused {reused} tokens")
    assert stats.peak_bytes <= budget
    assert stats.evicted > 0 and reused > 0


# ---------------------------------------------------------------- the embedded model, through the chat layer


@pytest.mark.real_model
def test_embedded_model_agent_conversation_is_lossless_with_reuse(real_engine) -> None:
    from hvd_agents.bench.prompts import SEARCH_FILES_TOOL, SYSTEM, WEATHER_TOOL
    from hvd_agents.chat.conversation import prepare

    real_engine.prefix_cache.clear()
    tools = [WEATHER_TOOL, SEARCH_FILES_TOOL]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Find where load_settings is defined, then check the weather in Oslo."}]
    results = ["src/app/config.py:12: def load_settings(path: str) -> Settings:\n" * 3,
               '{"city": "Oslo", "temperature": 4, "unit": "celsius", "condition": "rain"}']
    previous_prompt = 0
    for turn, result in enumerate([*results, None]):
        structure = prepare(real_engine, messages, tools, session_id="kv-test")
        greedy = GenerationParams(max_new_tokens=8, method="hvd")
        got = real_engine.generate(structure.prompt_ids, greedy, structure=structure)
        if turn:  # the whole earlier prompt (and the reply as rendered back) was reused
            assert got.stats.reused_prefix_tokens >= previous_prompt
            assert got.stats.prefix_break_at is None
        plain = real_engine.generate(structure.prompt_ids, GenerationParams(max_new_tokens=8, method="ar",
                                                                            reuse_prefix=False))
        assert got.token_ids == plain.token_ids
        previous_prompt = got.stats.prompt_tokens
        if result is None:
            break
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": "search_files" if turn == 0 else "get_weather",
                             "arguments": '{"pattern": "load_settings"}' if turn == 0 else '{"city": "Oslo"}'}}
        messages += [{"role": "assistant", "content": got.text, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": result}]
    sampled = GenerationParams(max_new_tokens=8, method="ar", temperature=0.8, seed=7)
    with_reuse = real_engine.generate(structure.prompt_ids, sampled)
    assert with_reuse.stats.reused_prefix_tokens == len(structure.prompt_ids) - 1
    without = real_engine.generate(structure.prompt_ids, GenerationParams(**{**sampled.__dict__, "reuse_prefix": False}))
    assert with_reuse.token_ids == without.token_ids


def test_chathvd_reports_reuse_in_hvd_stats() -> None:
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_hvd import ChatHVD

    from tests.helpers import make_byte_tokenizer

    tokenizer = make_byte_tokenizer()
    engine = Engine(make_tiny_llama(len(tokenizer), seed=7), tokenizer, eos_token_ids=())
    llm = ChatHVD(engine=engine, max_tokens=6, method="ar")
    history = [HumanMessage("List two colours.")]
    first = llm.invoke(history, session_id="colours")
    history += [AIMessage(first.content), HumanMessage("And a third?")]
    stats = llm.invoke(history, session_id="colours").response_metadata["hvd_stats"]
    assert stats["reused_prefix_tokens"] > 0
    assert stats["reused_prefix_tokens"] + stats["prefilled_tokens"] == stats["prompt_tokens"] - 1
    assert stats["prefix_break_at"] is None
