"""What followed an n-gram, as the cache drafter reads it, against direct counts over the text.

The index answers from hash tables (the latest ``limit`` entries of a key, stale ones included) and one
vectorized pass; these tests count the same things by scanning the token list, on small random texts where
n-grams repeat and fork often: separators between stored spans, erased spans, tokens appended in chunks.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_agents.drafters import CacheStore, DraftContext, SuffixDrafter
from hvd_agents.drafters.cache.ngram_index import NGRAM_SIZES, SEPARATOR, NgramIndex, ngram_key
from hvd_agents.drafters.cache.suffix import CONTEXT_GRAM, _Candidate, _frequent_path
from hvd_agents.structure import SpanKind

TEXT = st.lists(st.integers(0, 3), min_size=1, max_size=40)


def occurrences(indexed: list[int], now: list[int], gram: tuple[int, ...], limit: int) -> list[tuple[int, int]]:
    """``(end, follower)`` of the occurrences the index counts, by scanning: of the latest ``limit`` places the
    n-gram was indexed at (``indexed``: the text then), those that still hold it (``now``) and have a token after
    them."""
    n = len(gram)
    ends = [p for p in range(n - 1, len(indexed)) if tuple(indexed[p - n + 1 : p + 1]) == gram][-limit:]
    return [(p, now[p + 1]) for p in ends
            if p + 1 < len(now) and tuple(now[p - n + 1 : p + 1]) == gram and now[p + 1] != SEPARATOR]


def followers(found: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for end, token in found:
        out[token] = (out[token][0] + 1 if token in out else 1, end)
    return out


def grams_of(text: list[int]) -> list[tuple[int, ...]]:
    found = {tuple(text[i : i + n]) for n in NGRAM_SIZES for i in range(len(text) - n + 1)}
    return sorted(gram for gram in found if SEPARATOR not in gram)


def check_index(index: NgramIndex, indexed: list[int], limit: int) -> None:
    now = index.tokens.tolist()
    for n in NGRAM_SIZES:
        grams = [gram for gram in grams_of(indexed) if len(gram) == n] + [(9,) * n]  # (9, ...) never occurs
        table = index.successor_table(np.array(grams), limit)
        expected = [occurrences(indexed, now, gram, limit) for gram in grams]
        tokens = np.array([found[0][1] if found else 0 for found in expected])
        same, total = table.counts(tokens)
        assert total.tolist() == [len(found) for found in expected]
        assert same.tolist() == [sum(t == token for _, t in found) for found, token in zip(expected, tokens.tolist())]
        assert table.followers(range(len(grams))) == [followers(found) for found in expected]
        asked = list(range(0, len(grams), 2))
        left_out = [int(tokens[row]) for row in asked]
        assert table.followers(asked, left_out) == [
            followers([(e, t) for e, t in expected[row] if t != skip]) for row, skip in zip(asked, left_out)]


@settings(max_examples=120, deadline=None)
@given(prompt=TEXT, chunks=st.lists(TEXT, max_size=6), limit=st.integers(1, 5))
def test_a_live_context_appended_in_chunks_counts_what_followed_each_gram(prompt, chunks, limit) -> None:
    index = NgramIndex()
    index.extend(prompt)
    text = list(prompt)
    for chunk in chunks:
        index.append_many(chunk)  # n-grams that cross into the chunk are indexed too
        text += chunk
    assert index.tokens.tolist() == text
    check_index(index, text, limit)


@settings(max_examples=120, deadline=None)
@given(spans=st.lists(TEXT, min_size=1, max_size=6), erased=st.sets(st.integers(0, 5)), limit=st.integers(1, 5))
def test_stored_spans_count_neither_across_separators_nor_in_erased_text(spans, erased, limit) -> None:
    index = NgramIndex()
    indexed: list[int] = []
    starts = []
    for span in spans:
        starts.append(index.extend(span, separate=True))
        indexed += span + [SEPARATOR]
    for i in sorted(erased):
        if i < len(spans):
            index.erase(starts[i], starts[i] + len(spans[i]))  # their entries stay in the tables, stale
    check_index(index, indexed, limit)


def test_an_ngram_that_only_hashes_alike_is_not_counted() -> None:
    # with P the hash's multiplier, (5, P + 7, 3, 4) and (6, 7, 3, 4) hash alike: only the real occurrence counts
    p = 1_000_003
    assert ngram_key([5, p + 7, 3, 4]) == ngram_key([6, 7, 3, 4])
    index = NgramIndex()
    index.extend([5, p + 7, 3, 4, 8, 6, 7, 3, 4, 9, 0])
    table = index.successor_table(np.array([[6, 7, 3, 4]]))
    assert table.followers([0]) == [{9: (1, 8)}]
    assert index.successor_counts([6, 7, 3, 4], 8) == (0, 1)


def brute_fork_alternatives(context: list[int], stored: list[list[int]], draft: tuple[int, ...], k: int,
                            seen: set[tuple[int, int]], room: int) -> list[tuple[int, float, tuple[int, ...]]]:
    """The fork alternatives by scanning the context and the stored spans (see SuffixDrafter.alternatives)."""
    store_text = [t for span in stored for t in [*span, SEPARATOR]]
    window = context[-CONTEXT_GRAM:] + list(draft)
    skip = CONTEXT_GRAM - len(context[-CONTEXT_GRAM:])
    found = []
    for depth in range(skip, len(draft)):
        gram = tuple(window[depth - skip : depth - skip + CONTEXT_GRAM])
        mine = followers(occurrences(context, context, gram, 64))
        shared = followers(occurrences(store_text, store_text, gram, 64))
        total = sum(count for count, _ in mine.values()) + sum(count for count, _ in shared.values())
        if total == sum(count for token, (count, _) in [*mine.items(), *shared.items()] if token == draft[depth]):
            continue  # no fork here
        merged = {token: (count, context, end) for token, (count, end) in mine.items()}
        for token, (count, end) in shared.items():
            known = merged.get(token)
            merged[token] = (count + known[0], known[1], known[2]) if known else (count, store_text, end)
        for token, (count, text, end) in merged.items():
            if token != draft[depth] and (depth, token) not in seen:
                after = text[end + 1 : end + 1 + k - depth]
                after = after[: after.index(SEPARATOR)] if SEPARATOR in after else after
                found.append((depth, count / total, tuple(after)))
    found.sort(key=lambda item: -item[1])
    return found[:room]


@st.composite
def forking_texts(draw) -> tuple[list[int], list[list[int]]]:
    """A context and stored spans cut from one text over three tokens, each with a token of its own after it:
    the same four tokens recur, followed now one way and now another."""
    base = draw(st.lists(st.integers(0, 2), min_size=20, max_size=40))
    cut = st.tuples(st.integers(0, 30), st.integers(3, 20), st.integers(0, 2))
    start, length, last = draw(cut)
    context = base[start : start + length] + [last]
    stored = [base[a : a + n] + [t] for a, n, t in draw(st.lists(cut, max_size=5))]
    return context, stored


@settings(max_examples=400, deadline=None)
@given(texts=forking_texts(), k=st.integers(1, 8), cut=st.integers(0, 8), limit=st.integers(1, 6))
def test_draft_share_seen_and_fork_alternatives_agree_with_a_scan_of_the_text(texts, k, cut, limit) -> None:
    context, stored = texts
    store = CacheStore()
    kept: list[list[int]] = []
    for span in stored:
        if store.add(span, SpanKind.GENERATED):  # an identical span is stored once
            kept.append(span)
    drafter = SuffixDrafter(store)
    drafter.start("r", context)
    draft = drafter.propose(DraftContext("r", context, len(context)), k)
    if not draft.token_ids:
        return
    window = context[-CONTEXT_GRAM:] + list(draft.token_ids)
    skip = CONTEXT_GRAM - len(context[-CONTEXT_GRAM:])
    store_text = [t for span in kept for t in [*span, SEPARATOR]]
    for depth, token in enumerate(draft.token_ids):
        if depth < skip:
            assert (draft.features.share[depth], draft.features.seen[depth]) == (1.0, 0.0)
            continue
        gram = tuple(window[depth - skip : depth - skip + CONTEXT_GRAM])
        found = occurrences(context, context, gram, 64) + occurrences(store_text, store_text, gram, 64)
        same = sum(t == token for _, t in found)
        assert draft.features.seen[depth] == len(found)
        assert draft.features.share[depth] == (same / len(found) if found else 1.0)
    prefix = draft.token_ids[: max(cut, 1)]
    alternatives = drafter.alternatives("r", prefix, limit)
    plain = [a for a in alternatives if not a.fork]
    assert alternatives[: len(plain)] == plain  # the candidates' come first
    seen = {(a.depth, a.tokens[0]) for a in plain}
    expected = brute_fork_alternatives(context, kept, prefix, k, seen, limit - len(plain))
    assert [(a.depth, a.share, a.tokens) for a in alternatives[len(plain) :]] == expected
    ctx = DraftContext("r", context, len(context))
    for alternative in plain:  # described as proposals of their own: their counts as a scan of their own path
        described = drafter.described(ctx, draft, alternative)
        if described is None:
            continue  # the other source's shorter match
        path = list(draft.token_ids[: alternative.depth]) + list(alternative.tokens)
        window = context[-CONTEXT_GRAM:] + path
        assert len(described.share) == len(described.probs) == len(path)
        for depth, token in enumerate(path):
            if depth < skip:
                assert (described.share[depth], described.seen[depth]) == (1.0, 0.0)
                continue
            gram = tuple(window[depth - skip : depth - skip + CONTEXT_GRAM])
            found = occurrences(context, context, gram, 64) + occurrences(store_text, store_text, gram, 64)
            same = sum(t == token for _, t in found)
            assert described.seen[depth] == len(found)
            assert described.share[depth] == (same / len(found) if found else 1.0)


def walk(candidates: list[_Candidate], k: int) -> tuple[list[int], list[float], list[int], _Candidate]:
    """The most frequent path taken a depth at a time over every candidate (what _frequent_path computes)."""
    alive = list(candidates)
    path: list[int] = []
    probs: list[float] = []
    support: list[int] = []
    for depth in range(k):
        counts: dict[int, int] = {}
        for candidate in alive:
            if len(candidate.tokens) > depth:
                counts[candidate.tokens[depth]] = counts.get(candidate.tokens[depth], 0) + 1
        if not counts:
            break
        token = max(counts, key=counts.__getitem__)
        path.append(token)
        probs.append(counts[token] / len(alive))
        support.append(counts[token])
        alive = [c for c in alive if len(c.tokens) > depth and c.tokens[depth] == token]
    return path, probs, support, alive[0]


@settings(max_examples=200, deadline=None)
@given(continuations=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), min_size=1, max_size=8),
       k=st.integers(1, 6))
def test_the_frequent_path_over_grouped_candidates_is_the_walk_over_each(continuations, k) -> None:
    candidates = [_Candidate(tokens, SpanKind.GENERATED, float(i), False, None) for i, tokens in enumerate(continuations)]
    path, probs, support, chosen = _frequent_path(candidates, k)
    expected = walk(candidates, k)
    assert (path, probs, support) == expected[:3]
    assert chosen is expected[3]
