"""Cache drafter, n-gram index and cross-request store: hand-written token arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_agents.drafters import CacheStore, DraftContext, DraftOutcome, PromptLookupDrafter, SuffixDrafter
from hvd_agents.drafters.base import Draft
from hvd_agents.drafters.cache.ngram_index import NgramIndex, _bulk_keys, ngram_key
from hvd_agents.drafters.cache.suffix import Alternative
from hvd_agents.errors import InvalidRequestError, StoreFormatError
from hvd_agents.policy.features import feature_record
from hvd_agents.structure import PromptStructure, SpanKind, TypedSpan


def propose(drafter: SuffixDrafter, context: list[int], k: int = 8, structure=None, req: str = "r") -> Draft:
    drafter.start(req, context, structure)
    draft = drafter.propose(DraftContext(req, context, len(context)), k)
    return draft


# ------------------------------------------------------------------ index


def test_bulk_and_incremental_keys_agree() -> None:
    tokens = np.array([5, 0, 49151, 7, 7, 123456], dtype=np.int64)
    for n in (1, 2, 4):
        bulk = _bulk_keys(tokens, n).tolist()
        assert bulk == [ngram_key(tokens[i - n + 1 : i + 1].tolist()) for i in range(n - 1, len(tokens))]


def test_index_longest_match_then_recency() -> None:
    index = NgramIndex()
    # "1 2 3" occurs at 0..2; "9 2 3" at 4..6; the query ends with "1 2 3": the longer match wins
    index.extend([1, 2, 3, 8, 9, 2, 3, 7])
    matches = index.lookup([0, 1, 2, 3])
    assert [(m.end, m.length) for m in matches] == [(2, 3)]
    assert index.continuation(2, 4) == [8, 9, 2, 3]


def test_index_matches_are_real_tokens_not_hashes() -> None:
    index = NgramIndex()
    index.extend([4, 4, 4, 4, 4])
    index.erase(0, 5)  # erased tokens never match, though their hash entries remain
    assert index.lookup([4, 4, 4, 4]) == []


def test_incremental_append_finds_crossing_ngrams() -> None:
    index = NgramIndex()
    index.extend([1, 2])
    for t in [3, 4, 1, 2, 3]:
        index.append(t)
    # the query is the indexed text itself: exclude its own end
    matches = index.lookup(index.tokens.tolist(), exclude_end=len(index) - 1)
    assert (matches[0].end, matches[0].length) == (2, 3)


@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.integers(0, 4), min_size=2, max_size=80))
def test_index_agrees_with_brute_force(text) -> None:
    index = NgramIndex(recent=10_000, earliest=0)
    index.extend(text[:1])
    for t in text[1:]:
        index.append(t)
    end = len(text) - 1
    matches = index.lookup(text, max_match=64, exclude_end=end)
    best = 0
    for p in range(end):  # brute force: longest suffix of text ending at an earlier p
        n = 0
        while n <= p and text[p - n] == text[end - n] and n < 64:
            n += 1
        best = max(best, n)
    assert (matches[0].length if matches else 0) == best


# ------------------------------------------------------------------ drafter


@pytest.mark.parametrize(
    "context, k, expected, intent",
    [
        ([10, 11, 12, 13, 20, 10, 11], 4, (12, 13, 20, 10), "exact repeat: copy the continuation"),
        ([10, 11, 12, 13, 20, 10, 11], 2, (12, 13), "draft cut at k"),
        ([1, 2, 3, 4], 4, (), "nothing repeats: empty draft"),
        # "5 6 7" then 9 (longer match) vs the more recent "6 7" then 8: the longer match wins
        ([5, 6, 7, 9, 3, 6, 7, 8, 4, 5, 6, 7], 1, (9,), "longest match wins over a more recent shorter one"),
        # "1 2" occurs three times, each after a different token (all matches have length 2),
        # followed by 3, 3 and (most recently) 4: the majority continuation wins
        ([7, 1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 4, 6, 1, 2], 1, (3,), "frequency decides between equal matches"),
    ],
)
def test_drafter_table(context, k, expected, intent) -> None:
    assert propose(SuffixDrafter(None), context, k).token_ids == expected, intent


def test_draft_features_and_provenance_from_structure() -> None:
    # prompt: [system 0..3) [tool schema 3..7) [user 7..10); the user repeats the schema's "31 32"
    prompt = [1, 2, 3, 30, 31, 32, 33, 40, 31, 32]
    spans = (TypedSpan(0, 3, SpanKind.SYSTEM), TypedSpan(3, 7, SpanKind.TOOL_SCHEMA), TypedSpan(7, 10, SpanKind.USER))
    draft = propose(SuffixDrafter(None), prompt, 4, PromptStructure(tuple(prompt), spans, "s1"))
    assert draft.token_ids == (33, 40, 31, 32)
    assert draft.source == "suffix:tool_schema"
    assert draft.features.match_len == 2 and draft.features.probs[0] == 1.0
    assert draft.features.kind is SpanKind.TOOL_SCHEMA and draft.features.from_store == 0.0
    assert draft.features.distance == 9 - 5


def test_store_supplies_cross_request_drafts_with_provenance() -> None:
    store = CacheStore()
    store.add([50, 51, 52, 53, 54], SpanKind.TOOL_CALL_SKELETON, "s0")
    drafter = SuffixDrafter(store)
    draft = propose(drafter, [7, 8, 50, 51], 3)  # this request has never seen 52..54
    assert draft.token_ids == (52, 53, 54)
    assert draft.source == "suffix:tool_call_skeleton" and draft.features.from_store == 1.0


def test_finished_output_is_registered_and_reused() -> None:
    store = CacheStore()
    drafter = SuffixDrafter(store)
    drafter.start("a", [1, 2], PromptStructure((1, 2), (), "sess"))
    drafter.observe(DraftOutcome("a", Draft(), 0, (60, 61, 62, 63)))
    drafter.stop("a")
    assert [(s.kind, s.session_id, s.length) for s in store.spans] == [(SpanKind.GENERATED, "sess", 4)]
    assert propose(drafter, [9, 60, 61], 2, req="b").token_ids == (62, 63)


def test_accepted_store_draft_marks_span_used() -> None:
    store = CacheStore()
    store.add([1, 2, 3, 4], SpanKind.SYSTEM)
    store.add([7, 8, 9], SpanKind.USER)
    drafter = SuffixDrafter(store, register_outputs=False)
    draft = propose(drafter, [0, 1, 2], 2)
    drafter.observe(DraftOutcome("r", draft, 2, (3, 4, 5)))
    assert [s.kind for s in store.spans] == [SpanKind.USER, SpanKind.SYSTEM]  # SYSTEM is now most recent


# ------------------------------------------------------------------ store


def test_identical_spans_are_stored_once() -> None:
    store = CacheStore()
    assert store.add([1, 2, 3], SpanKind.SYSTEM) is True
    assert store.add([1, 2, 3], SpanKind.SYSTEM) is False
    assert len(store) == 1 and store.num_tokens == 3


def test_eviction_keeps_budget_and_drops_least_recently_used() -> None:
    store = CacheStore(token_budget=10)
    store.add([1, 2, 3, 4], SpanKind.SYSTEM)  # A
    store.add([5, 6, 7, 8], SpanKind.USER)  # B
    store.add([1, 2, 3, 4], SpanKind.SYSTEM)  # A used again: B is now the LRU
    store.add([9, 10, 11, 12], SpanKind.TOOL_OUTPUT)  # needs room: evicts B
    assert store.num_tokens == 8 <= store.token_budget
    assert [s.kind for s in store.spans] == [SpanKind.SYSTEM, SpanKind.TOOL_OUTPUT]
    assert store.lookup([0, 5, 6]) == []  # evicted tokens never match again
    assert store.lookup([0, 1, 2])[0].length == 2


def test_eviction_over_many_spans_rebuilds_index() -> None:
    store = CacheStore(token_budget=2000)
    rng = np.random.default_rng(0)
    for _ in range(300):
        store.add(rng.integers(0, 1000, 50).tolist(), SpanKind.GENERATED)
        assert store.num_tokens <= 2000
    last = store.spans[-1]
    tokens = store._index.tokens[last.start : last.start + last.length].tolist()
    assert store.lookup([5000] + tokens[:10])[0].length == 10  # live spans still found after rebuilds
    assert len(store._index) <= 2 * 2000 + 100


def test_oversized_and_empty_spans_are_refused() -> None:
    store = CacheStore(token_budget=3)
    with pytest.raises(InvalidRequestError, match="budget"):
        store.add([1, 2, 3, 4], SpanKind.USER)
    with pytest.raises(InvalidRequestError, match="empty"):
        store.add([], SpanKind.USER)


def test_save_load_round_trip(tmp_path) -> None:
    store = CacheStore(token_budget=100)
    store.add([1, 2, 3], SpanKind.SYSTEM, "s1")
    store.add([4, 5, 6, 7], SpanKind.TOOL_SCHEMA, None)
    store.add([1, 2, 3], SpanKind.SYSTEM, "s1")  # LRU order: TOOL_SCHEMA, SYSTEM
    path = tmp_path / "store.npz"
    store.save(path)
    loaded = CacheStore.load(path)
    strip = lambda s: [(x.kind, x.session_id, x.length, x.age) for x in s.spans]
    assert strip(loaded) == strip(store)
    assert loaded.token_budget == 100 and loaded.clock == store.clock
    assert loaded.lookup([9, 4, 5])[0].length == 2


@pytest.mark.parametrize(
    "mangle, needle",
    [
        (lambda p: p.write_bytes(b"not a zip file"), "corrupt"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "corrupt"),
        (lambda p: p.unlink(), "does not exist"),
    ],
)
def test_corrupt_store_file_is_refused(tmp_path, mangle, needle) -> None:
    path = tmp_path / "store.npz"
    store = CacheStore()
    store.add([1, 2, 3], SpanKind.SYSTEM)
    store.save(path)
    mangle(path)
    with pytest.raises(StoreFormatError, match=needle):
        CacheStore.load(path)
    empty = CacheStore.load_or_empty(path)
    assert len(empty) == 0


def test_inconsistent_header_is_refused(tmp_path) -> None:
    path = tmp_path / "store.npz"
    header = {"format": "hvd-agents-store", "version": 1, "token_budget": 10, "clock": 1,
              "spans": [{"length": 5, "kind": "system", "session_id": None, "age": 1}]}
    import json

    np.savez(path, tokens=np.array([1, 2, 3]), header=np.frombuffer(json.dumps(header).encode(), np.uint8))
    with pytest.raises(StoreFormatError, match="inconsistent"):
        CacheStore.load(path)


def test_alternatives_are_the_candidates_that_depart_from_the_draft() -> None:
    # "1 2" is followed by 3 3 6, 4 9 7 and 3 3 8: the draft is 3 3 then the most recent 8
    prompt = [5, 1, 2, 3, 3, 6, 1, 2, 4, 9, 7, 1, 2, 3, 3, 8, 1, 2]
    drafter = SuffixDrafter(None)
    drafter.start("r", prompt)
    draft = drafter.propose(DraftContext("r", prompt, len(prompt)), 3)
    assert draft.token_ids == (3, 3, 8)
    alternatives = drafter.alternatives("r", draft.token_ids, limit=4)
    assert [(a.depth, a.tokens) for a in alternatives] == [(0, (4, 9, 7)), (2, (6,))]
    assert [a.share for a in alternatives] == pytest.approx([1 / 3, 1 / 2])
    assert len(drafter.alternatives("r", draft.token_ids, limit=1)) == 1
    assert drafter.alternatives("r", draft.token_ids, limit=0) == []
    drafter.observe(DraftOutcome("r", draft, 0, (5,)))
    assert drafter.alternatives("r", draft.token_ids, limit=4) == []  # they belong to the last proposal only


def test_an_alternative_is_described_as_the_proposal_had_its_candidate_been_the_main_branch() -> None:
    # "1 2" is followed by 3 3 6 (15 tokens back), 4 9 7 (10 back) and 3 3 8 (5 back, the draft's source)
    prompt = [5, 1, 2, 3, 3, 6, 1, 2, 4, 9, 7, 1, 2, 3, 3, 8, 1, 2]
    drafter = SuffixDrafter(None)
    drafter.start("r", prompt)
    ctx = DraftContext("r", prompt, len(prompt))
    draft = drafter.propose(ctx, 3)
    assert draft.features.probs.tolist() == pytest.approx([2 / 3, 1.0, 1 / 2]) and draft.features.distance == 5
    first, second = drafter.alternatives("r", draft.token_ids, limit=4)
    other = drafter.described(ctx, draft, first)  # the path 4 9 7
    assert other.probs.tolist() == pytest.approx([1 / 3, 1.0, 1.0]) and other.support.tolist() == [1, 1, 1]
    assert other.distance == 10 and other.match_len == draft.features.match_len == 2
    later = drafter.described(ctx, draft, second)  # the path 3 3 6: the draft's first two tokens, then 6
    assert later.probs.tolist() == pytest.approx([2 / 3, 1.0, 1 / 2]) and later.support.tolist() == [2, 2, 1]
    assert later.distance == 15
    # "3 3" then 6 followed "1 2 3 3" once of its two occurrences, as 8 did
    assert later.share.tolist() == [1.0, 1.0, 0.5] and later.seen.tolist() == [0.0, 0.0, 2.0]
    fork = Alternative(1, 0.5, (6,), fork=True)
    assert drafter.described(ctx, draft, fork) is None  # no candidate goes that way


def test_no_alternatives_when_the_candidates_agree() -> None:
    prompt = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2]
    drafter = SuffixDrafter(None)
    drafter.start("r", prompt)
    draft = drafter.propose(DraftContext("r", prompt, len(prompt)), 3)
    assert draft.token_ids == (3, 0, 1)
    assert drafter.alternatives("r", draft.token_ids, limit=4) == []


@pytest.mark.parametrize("make", [lambda: SuffixDrafter(CacheStore()), PromptLookupDrafter], ids=["suffix", "pld"])
def test_calls_for_a_request_that_is_not_started_raise_naming_it(make) -> None:
    drafter = make()
    with pytest.raises(ValueError, match="propose for request 'ghost', which is not started"):
        drafter.propose(DraftContext("ghost", [1, 2, 3], 3), 4)
    drafter.start("r", [1, 2, 3, 1, 2])
    drafter.observe(DraftOutcome("r", Draft(), 0, (3,)))
    drafter.stop("r")
    drafter.stop("r")  # safe twice
    with pytest.raises(ValueError, match="observe for request 'r', which is not started"):
        drafter.observe(DraftOutcome("r", Draft(), 0, (4,)))


def test_the_other_sources_shorter_match_continues_as_an_alternative() -> None:
    # the store matches "7 1 2" (3 tokens) and goes on 3 4 5; the live context matches only "1 2"
    # and went on 9 9: the draft is the store's, and the context's continuation is an alternative
    store = CacheStore()
    store.add([6, 7, 1, 2, 3, 4, 5], SpanKind.ASSISTANT_TEXT)
    prompt = [1, 2, 9, 9, 0, 7, 1, 2]
    drafter = SuffixDrafter(store)
    drafter.start("r", prompt)
    draft = drafter.propose(DraftContext("r", prompt, len(prompt)), 3)
    assert draft.token_ids == (3, 4, 5) and draft.features.from_store
    assert [(a.depth, a.tokens) for a in drafter.alternatives("r", draft.token_ids, limit=4)] == [(0, (9, 9, 0))]


def test_successor_counts_count_what_followed_the_gram() -> None:
    index = NgramIndex()
    # "1 2 3 4" is followed by 9, then by 7, and ends the index (no successor yet: not counted)
    index.extend([1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 1, 2, 3, 4])
    assert index.successor_counts([1, 2, 3, 4], 9) == (1, 2)
    assert index.successor_counts([1, 2, 3, 4], 5) == (0, 2)
    assert index.successor_counts([5, 6, 7, 8], 9) == (0, 0)  # never seen
    index.erase(0, 5)  # erased occurrences no longer count, though their hash entries remain
    assert index.successor_counts([1, 2, 3, 4], 9) == (0, 1)


def test_draft_share_marks_where_copied_text_forked_before() -> None:
    # "10 11 12 13" went on with 21, 22 and 23 in three earlier calls; the longest match (the last one, "5 10 11
    # 12 13") copies 23, but the four tokens before that position forked three ways: share 1/3 there, over 3
    # occurrences; the tokens after it went on one way each time they were seen
    store = CacheStore()
    store.add([1, 10, 11, 12, 13, 21, 30], SpanKind.GENERATED)
    store.add([2, 10, 11, 12, 13, 22, 30], SpanKind.GENERATED)
    store.add([5, 10, 11, 12, 13, 23, 30], SpanKind.GENERATED)
    draft = propose(SuffixDrafter(store), [0, 5, 10, 11, 12, 13], 2)
    assert draft.token_ids == (23, 30)
    assert draft.features.share.tolist() == pytest.approx([1 / 3, 1.0])
    assert draft.features.seen.tolist() == [3.0, 1.0]


def test_successor_counts_of_many_grams_match_one_at_a_time() -> None:
    index = NgramIndex()
    index.extend([1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 5, 6, 7, 8, 9, 1, 2, 3, 4])
    grams, tokens = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4], [6, 6, 6, 6]], [9, 9, 7, 1]
    same, total = index.successor_counts_many(grams, tokens)
    assert list(zip(same.tolist(), total.tolist())) == [index.successor_counts(g, t) for g, t in zip(grams, tokens)]
    assert list(zip(same.tolist(), total.tolist())) == [(1, 2), (1, 1), (1, 2), (0, 0)]


def test_draft_share_after_a_short_context_counts_only_positions_with_four_tokens_before() -> None:
    # context "10 11" then the draft "12 13 21": only 21 has four tokens before it (10 11 12 13), seen 3 times
    store = CacheStore()
    for first, nxt in ((1, 21), (2, 22), (5, 21)):
        store.add([first, 10, 11, 12, 13, nxt, 30], SpanKind.GENERATED)
    draft = propose(SuffixDrafter(store), [10, 11], 3)
    assert draft.token_ids[:2] == (12, 13)
    assert draft.features.seen.tolist()[:2] == [0.0, 0.0] and draft.features.share.tolist()[:2] == [1.0, 1.0]
    assert draft.features.seen.tolist()[2] == 3.0


def test_successors_count_each_follower_and_continue_from_its_latest_occurrence() -> None:
    index = NgramIndex()
    # "1 2 3 4" went on with 9 8, 7 6 and 9 5; the last occurrence ends the index (no successor yet)
    index.extend([1, 2, 3, 4, 9, 8, 1, 2, 3, 4, 7, 6, 1, 2, 3, 4, 9, 5, 1, 2, 3, 4])
    first, never = index.successors([[1, 2, 3, 4], [5, 6, 7, 8]], 2)
    assert first == {9: (2, [9, 5]), 7: (1, [7, 6])} and never == {}
    index.erase(0, 6)  # erased occurrences no longer count
    assert index.successors([[1, 2, 3, 4]], 2)[0] == {9: (1, [9, 5]), 7: (1, [7, 6])}


def test_where_the_draft_forks_the_other_followers_grow_alternatives_by_their_share() -> None:
    # "10 11 12 13" went on with 21, 22 (twice) and 23; the longest match copies 23, whose four tokens before
    # forked: the other followers depart there, weighed by their share of what followed those tokens
    store = CacheStore()
    for first, nxt in ((1, 21), (2, 22), (3, 22), (5, 23)):
        store.add([first, 10, 11, 12, 13, nxt, 30 + nxt], SpanKind.GENERATED)
    drafter = SuffixDrafter(store)
    draft = propose(drafter, [0, 5, 10, 11, 12, 13], 2)
    assert draft.token_ids == (23, 53)
    forks = [a for a in drafter.alternatives("r", draft.token_ids, limit=4) if a.fork]
    assert [(a.depth, a.tokens, a.share) for a in forks] == [(0, (22, 52), 0.5), (0, (21, 51), 0.25)]
    assert len(drafter.alternatives("r", draft.token_ids, limit=1)) == 1


def test_a_drafter_that_does_not_count_forks_drafts_the_same_without_their_features_or_alternatives() -> None:
    store = CacheStore()
    for first, nxt in ((1, 21), (2, 22), (3, 22), (5, 23)):
        store.add([first, 10, 11, 12, 13, nxt, 30 + nxt], SpanKind.GENERATED)
    counting, plain = SuffixDrafter(store), SuffixDrafter(store, count_forks=False)
    drafts = [propose(drafter, [0, 5, 10, 11, 12, 13], 2) for drafter in (counting, plain)]
    assert drafts[0].token_ids == drafts[1].token_ids == (23, 53)
    assert len(drafts[1].features.share) == 0 and len(drafts[0].features.share) == 2
    assert not any(a.fork for a in plain.alternatives("r", drafts[1].token_ids, limit=4))


# ------------------------------------------------------------------ a finished request's index, kept


def _answers(index: NgramIndex, text: list[int]) -> list:
    """Everything a drafter reads off an index of ``text``: the longest earlier match of every prefix, and what
    followed every 1-, 2- and 4-gram of it (how often, and the text after each follower's latest occurrence)."""
    out: list = [index.tokens.tolist()]
    for end in range(1, len(text) + 1):
        out.append([(m.end, m.length) for m in index.lookup(text[:end], exclude_end=end - 1)])
    for n in (1, 2, 4):
        grams = [text[i : i + n] for i in range(len(text) - n + 1)]
        if grams:
            out.append(index.successors(grams, 4))
    return out


@settings(max_examples=120, deadline=None)
@given(
    first=st.lists(st.integers(0, 5), min_size=0, max_size=40),
    reply=st.lists(st.integers(0, 5), min_size=0, max_size=20),
    data=st.data(),
)
def test_an_index_cut_back_and_extended_is_the_index_built_anew(first, reply, data) -> None:
    index = NgramIndex()
    index.extend(first)
    index.append_many(reply)  # a request's prompt, then its reply token by token
    kept = first + reply
    cut = data.draw(st.integers(0, len(kept)))
    rest = data.draw(st.lists(st.integers(0, 5), max_size=30))
    assert index.agreement(kept[:cut] + [99] + rest) == cut
    index.truncate(cut)
    index.append_many(rest)
    fresh = NgramIndex()
    fresh.extend(kept[:cut] + rest)
    assert _answers(index, kept[:cut] + rest) == _answers(fresh, kept[:cut] + rest)
    with pytest.raises(ValueError, match="cannot truncate"):
        index.truncate(len(index) + 1)


def test_the_next_call_of_a_conversation_takes_the_last_calls_index_and_drafts_the_same() -> None:
    # each call's prompt is the previous prompt, its reply (its last token re-rendered otherwise) and new text;
    # drafts, their features and alternatives equal those of a drafter that indexes every prompt anew
    vocabulary = np.random.default_rng(3).integers(0, 40, size=30).tolist()
    kept, fresh = SuffixDrafter(None), SuffixDrafter(None)
    fresh.kept = type(fresh.kept)(kept=0)
    prompt: list[int] = vocabulary[:20] + vocabulary[:12]
    for call in range(6):
        replies = []
        for drafter in (kept, fresh):
            req = f"call{call}"
            drafter.start(req, prompt)
            context, drafts = list(prompt), []
            for step in range(8):  # the reply: the draft's first token and a new one, or a new token alone
                draft = drafter.propose(DraftContext(req, context, len(prompt)), 6)
                alternatives = drafter.alternatives(req, draft.token_ids, 8) if draft.token_ids else []
                drafts.append((draft.token_ids, feature_record(draft.features), alternatives))
                emitted = (draft.token_ids[0], 41 + step) if draft.token_ids else ((7 * step + call) % 40,)
                drafter.observe(DraftOutcome(req, draft, len(emitted) - 1, emitted))
                context += emitted
            drafter.stop(req)
            replies.append((drafts, context))
        (drafts_kept, context), (drafts_fresh, _) = replies
        assert drafts_kept == drafts_fresh
        prompt = context[:-1] + [90 + call] + vocabulary[call : call + 7]  # the reply's end re-rendered, new text
    assert kept.kept.reused_tokens > 0 and fresh.kept.reused_tokens == 0


def test_a_proposal_verified_as_it_is_has_the_same_tokens_and_no_features() -> None:
    # hvd's whole proposals skip the features only a predictor reads; the tokens are the drafter's all the same
    prompt = [7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 8, 1, 2, 3, 4, 5, 6, 1, 2]
    described, bare = SuffixDrafter(None), SuffixDrafter(None)
    for drafter in (described, bare):
        drafter.start("r", prompt)
    full = described.propose(DraftContext("r", prompt, len(prompt)), 8)
    plain = bare.propose(DraftContext("r", prompt, len(prompt)), 8, described=False)
    assert full.token_ids and plain.token_ids == full.token_ids and plain.source == full.source
    assert feature_record(full.features) and not feature_record(plain.features)
