"""The cache drafter: copies continuations out of the live context and the cross-request store.

Each step it looks up the longest suffix of the context that occurred before,
both in this request's own tokens (prompt + output so far) and in the shared
:class:`~hvd_agents.drafters.cache.store.CacheStore` (registered prompt structure and
earlier requests' outputs), keeps the candidates of the greatest match length,
and walks their continuations token by token choosing the most frequent next
token (SuffixDecoding's frequency-weighted path, over the candidates of one
match). The draft carries the features the payoff predictor needs, as a
:class:`~hvd_agents.policy.features.CacheDraftFeatures`: match length, candidate
count, per-position branch probabilities and support, provenance kind of the
source span, and distance to the source; and the acceptance history of this
request and of this kind of source in this session
(:mod:`hvd_agents.drafters.cache.history`).

Worked example (``k = 4``)::

    prompt = [10, 11, 12, 13, 20, 10, 11]          # "10 11" occurred at 0..1
    -> match length 2, candidates: end=1 in the context
    -> draft [12, 13, 20, 10], branch probabilities [1, 1, 1, 1]

When the candidates disagree, :meth:`SuffixDrafter.alternatives` lists the
other continuations as branches off the proposed path (where each departs from
it, and its share of the candidates still agreeing there), from which ``hvd``
builds a tree draft that the target verifies in the same forward.

Lifecycle: ``start`` indexes the prompt (typed by its PromptStructure when given),
``observe`` indexes accepted tokens and marks a store span used when its draft was
accepted, ``stop`` registers the request's output in the store (kind ``generated``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hvd_agents.drafters.base import Draft, DraftContext, DraftOutcome, common_prefix, started
from hvd_agents.drafters.cache.history import AcceptanceHistory, KindRates
from hvd_agents.drafters.cache.kept_indexes import KeptIndexes
from hvd_agents.drafters.cache.ngram_index import NgramIndex, gram_keys
from hvd_agents.drafters.cache.store import CacheStore
from hvd_agents.drafters.cache.successors import SuccessorTable
from hvd_agents.policy.features import CacheDraftFeatures
from hvd_agents.policy.token_text import TokenText
from hvd_agents.structure import PromptStructure, SpanKind

CONTEXT_GRAM = 4
"""Tokens before a draft position whose earlier successors give its ``share`` and ``seen`` features (an n-gram size
the index keeps)."""
_GRAM_COLUMNS = np.arange(CONTEXT_GRAM)  # a gram's offsets from its first token


@dataclass(frozen=True)
class _Candidate:
    tokens: list[int]
    kind: SpanKind
    distance: float  # context: tokens back from the end; store: registrations ago
    from_store: bool
    span_id: int | None


@dataclass(frozen=True)
class Alternative:
    """A continuation that departs from a proposed draft.

    Attributes:
        depth: the draft position it replaces (0: the first draft token).
        share: its share of the candidates that agree with the draft before ``depth``; for a fork
            alternative, its share of the occurrences of the tokens before ``depth`` (what followed them).
        tokens: its tokens from ``depth`` on.
        fork: it comes from what followed the tokens before ``depth`` elsewhere, not from a candidate.
    """

    depth: int
    share: float
    tokens: tuple[int, ...]
    fork: bool = False


@dataclass
class _RequestState:
    index: NgramIndex
    num_prompt: int
    prompt_kinds: list[SpanKind]
    session_id: str | None
    candidates: list[_Candidate] = field(default_factory=list)  # of the last proposal
    backups: list[list[int]] = field(default_factory=list)  # its other source's shorter-match continuations
    k: int = 0
    # the last proposal's forks: (depth, its gram's row in successors, how often the gram was followed)
    forks: list[tuple[int, int, int]] = field(default_factory=list)
    successors: tuple[SuccessorTable, ...] = ()  # what followed its grams: in the context, then in the store
    last_span: int | None = None
    last_kind: SpanKind | None = None
    output: list[int] = field(default_factory=list)
    history: AcceptanceHistory = field(default_factory=AcceptanceHistory)


class SuffixDrafter:
    """Longest-suffix cache drafter over the live context and a shared store.

    Args:
        store: the cross-request store; None drafts from the live context only.
        max_match: cap on match lengths considered.
        max_candidates: most matches (per source, most recent first) whose
            continuations are read.
        register_outputs: add each finished request's output to the store.
        source: name reported in ``Draft.source`` (suffixed with the provenance kind).
        count_forks: count, at each draft position, what followed the tokens before it elsewhere (the ``share``
            and ``seen`` features, the forks :meth:`alternatives` branches at); off where nothing reads them
            (the drafter alone, method ``hvd-cache``), which saves their cost at every step.
        text: the tokenizer's token classes (:class:`~hvd_agents.policy.token_text.TokenText`), or a callable
            that returns them (None: none) when the first request starts: each draft's features then carry the
            classes of the tokens around it, which the payoff predictor reads (None: not known).
    """

    def __init__(
        self,
        store: CacheStore | None = None,
        *,
        max_match: int = 64,
        max_candidates: int = 12,
        register_outputs: bool = True,
        source: str = "suffix",
        count_forks: bool = True,
        text: TokenText | Callable[[], TokenText | None] | None = None,
    ) -> None:
        self.store = store
        self.max_match = max_match
        self.max_candidates = max_candidates
        self.register_outputs = register_outputs
        self.source = source
        self.count_forks = count_forks
        self._text = text
        self._requests: dict[str, _RequestState] = {}
        self._kind_rates = KindRates()
        self.kept = KeptIndexes()  # finished requests' indexes, for the next prompt that continues one

    @property
    def text(self) -> TokenText | None:
        """The token classes drafts are described with (built on first use when given as a callable)."""
        if self._text is not None and not isinstance(self._text, TokenText):
            self._text = self._text()
        return self._text

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        index = self.kept.index_for(prompt_ids)  # a finished request's index where this prompt continues it
        kinds = _prompt_kinds(len(prompt_ids), structure)
        session = structure.session_id if structure is not None else None
        self._requests[req_id] = _RequestState(index, len(prompt_ids), kinds, session)
        _ = self.text  # token classes given as a callable are built with the first request, not inside its steps

    def propose(self, ctx: DraftContext, k: int, min_match: int = 1, *, described: bool = True) -> Draft:
        """Up to ``k`` tokens that continued the longest suffix of the context found before, with their features.
        Where that suffix is shorter than ``min_match`` tokens the draft is empty and its ``score`` is the match's
        length (nothing else is computed: a caller that gates short matches skips their cost). ``described``
        False: no features (the predictor's reading of the match, the text and its forks), for a caller that
        verifies the proposal as it is."""
        state = started(self._requests, ctx.req_id, self.source, "propose")
        if k <= 0:
            return Draft()
        candidates, match_len = self._candidates(state, ctx.token_ids, k)
        short = bool(candidates) and match_len < min_match
        state.candidates, state.k, state.forks, state.successors = [] if short else candidates, k, [], ()
        if short:
            return Draft(score=float(match_len))
        if not candidates:
            return Draft()
        tokens, probs, support, chosen = _frequent_path(candidates, k)
        if not tokens:
            return Draft()
        state.last_span = chosen.span_id
        state.last_kind = chosen.kind
        if not described:  # verified as it is: nothing reads its features
            return Draft(tuple(tokens), None, float(match_len), f"{self.source}:{chosen.kind.value}")
        text = self.text
        features = CacheDraftFeatures(
            match_len=match_len,
            candidates=len(candidates),
            distance=chosen.distance,
            from_store=chosen.from_store,
            kind=chosen.kind,
            out_pos=ctx.num_output_tokens,
            covers_output=match_len >= ctx.num_output_tokens,
            kind_rate=self._kind_rates.rate(state.session_id, chosen.kind.value),
            history=state.history.features(),
            probs=probs,
            support=support,
            **(self._context_counts(state, ctx.token_ids, tokens) if self.count_forks else {}),
            **({"text": text.around(ctx.token_ids, tokens)} if text is not None else {}),
        )
        return Draft(tuple(tokens), None, float(match_len), f"{self.source}:{chosen.kind.value}", features)

    def _context_counts(self, state: _RequestState, context: Sequence[int], tokens: Sequence[int]) -> dict:
        """For each draft position, how often the :data:`CONTEXT_GRAM` tokens before it (context, then the draft)
        were followed by the drafted token before, and how often by any token, in this request's context and the
        store: the ``share`` and ``seen`` features. Where earlier occurrences of the same few tokens went on in
        many ways (a tool call's name, an argument's value), the longest match's single continuation is a guess.
        The proposal's forks and the tables they were read from are kept for :meth:`alternatives`."""
        share, seen, forks, tables = self._counts(state, context, tokens)
        state.forks, state.successors = forks, tables
        return {"share": share, "seen": seen}

    def _counts(self, state: _RequestState, context: Sequence[int], tokens: Sequence[int], start: int = 0,
                known: tuple[np.ndarray, np.ndarray] | None = None,
                ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]], tuple[SuccessorTable, ...]]:
        """``share`` and ``seen`` of ``tokens`` after ``context`` (see :meth:`_context_counts`), the forks
        (position, its gram's row in the tables, how often the gram was followed) and the tables. Positions before
        ``start`` are taken from ``known`` (another draft's ``share`` and ``seen`` with the same tokens before
        them), not counted again."""
        head = [int(t) for t in context[-CONTEXT_GRAM:]]
        window = np.array(head + [int(t) for t in tokens], dtype=np.int64)  # [h + n]
        skip = CONTEXT_GRAM - len(head)  # leading positions with fewer than CONTEXT_GRAM tokens before them
        first = max(start - skip, 0) if known is not None else 0  # the first gram counted here
        count = max(len(tokens) - skip - first, 0)  # positions with a gram before them, counted here
        grams = window[first + np.arange(count)[:, None] + _GRAM_COLUMNS]  # [g, CONTEXT_GRAM]
        followers = window[first + CONTEXT_GRAM:]  # [g]
        keys = gram_keys(grams)
        tables = (state.index.successor_table(grams, keys=keys),)
        if self.store is not None:
            tables += (self.store.successor_table(grams, keys=keys),)
        same, total = tables[0].counts(followers)  # [g], [g]
        for table in tables[1:]:
            more_same, more_total = table.counts(followers)
            same, total = same + more_same, total + more_total
        share = np.ones(len(tokens))  # [n]
        seen = np.zeros(len(tokens))  # [n]
        if known is not None and start:
            share[:start], seen[:start] = known[0][:start], known[1][:start]
        at = skip + first  # the position of the first gram counted here
        counted = total > 0
        forks = [(at + i, i, int(total[i])) for i in np.flatnonzero(total > same).tolist()]
        share[at:][counted] = same[counted] / total[counted]
        seen[at:] = total
        share.setflags(write=False)  # the features keep them as they are
        seen.setflags(write=False)
        return share, seen, forks, tables

    def described(self, ctx: DraftContext, proposal: Draft, alternative: Alternative) -> CacheDraftFeatures | None:
        """The features of ``proposal`` (the last one, with its features) had the candidate that ``alternative``
        copies been its main branch: the path ``proposal[:depth]`` then the alternative's tokens, with that
        candidate's source (kind, distance, store or context), the branch probabilities and support of the path's
        own tokens among the candidates, its forks' counts and its text. None where no longest-match candidate
        goes that way (a fork alternative, the other source's shorter match), or the proposal has no features.
        """
        state = started(self._requests, ctx.req_id, self.source, "described")
        features = proposal.features
        if alternative.fork or not isinstance(features, CacheDraftFeatures) or not state.candidates:
            return None
        depth = alternative.depth
        path = tuple(proposal.token_ids[:depth]) + tuple(alternative.tokens)
        n = len(path)
        chosen = next((c for c in state.candidates if tuple(c.tokens[:n]) == path), None)
        if chosen is None:
            return None
        probs, support = features.probs[:depth].tolist(), features.support[:depth].tolist()
        alive = [c.tokens for c in state.candidates if tuple(c.tokens[:depth]) == path[:depth]]
        for i in range(depth, n):  # the share of the candidates still agreeing that go on with the path's token
            going = [tokens for tokens in alive if len(tokens) > i and tokens[i] == path[i]]
            probs.append(len(going) / len(alive) if alive else 0.0)
            support.append(len(going))
            alive = going
        share, seen = (), ()  # not known where the proposal's were not counted
        if len(features.share) == len(proposal):
            share, seen, _, _ = self._counts(state, ctx.token_ids, path, depth, (features.share, features.seen))
        text = self.text
        return replace(
            features,
            distance=chosen.distance,
            from_store=chosen.from_store,
            kind=chosen.kind,
            kind_rate=self._kind_rates.rate(state.session_id, chosen.kind.value),
            probs=probs,
            support=support,
            share=share,
            seen=seen,
            text=text.around(ctx.token_ids, path) if text is not None and len(features.text) else (),
        )

    def alternatives(self, req_id: str, draft: Sequence[int], limit: int) -> list[Alternative]:
        """Up to ``limit`` continuations that depart from ``draft``, the last proposal's tokens (a prefix of them
        is fine): first the other candidates' (one per departure point and token, the most shared first, ties:
        the most recent), then, at the draft's forks (positions whose :data:`CONTEXT_GRAM` tokens before them
        were followed by other tokens before), those other tokens' continuations from their latest occurrence
        (in the context where they occurred there, else in the store), the most frequent first, each weighed by
        its share of the fork's occurrences.
        """
        state = started(self._requests, req_id, self.source, "alternatives")
        if limit <= 0 or not state.candidates:
            return []
        draft = tuple(draft)
        out = self._candidate_alternatives(state, draft, limit)
        seen = {(alternative.depth, alternative.tokens[0]) for alternative in out}
        forks: list[tuple[float, int, int, SuccessorTable, int]] = []  # (share, depth, token, where, its end)
        at = [fork for fork in state.forks if fork[0] < len(draft)]
        rows, skipped = [row for _, row, _ in at], [draft[depth] for depth, _, _ in at]  # the draft's own token left out
        found = [table.followers(rows, skipped) for table in state.successors] if at else []
        for i, (depth, _, total) in enumerate(at):
            merged: dict[int, tuple[int, SuccessorTable, int]] = {}  # token: (count, where, latest end there)
            for table, followers in zip(state.successors, found):
                for token, (count, end) in followers[i].items():
                    known = merged.get(token)
                    merged[token] = (count + known[0], known[1], known[2]) if known else (count, table, end)
            for token, (count, table, end) in merged.items():
                if (depth, token) not in seen:
                    forks.append((count / total, depth, token, table, end))
        forks.sort(key=lambda item: -item[0])
        for share, depth, token, table, end in forks:  # the text after each is read only for those kept
            if len(out) >= limit:
                break
            tokens = table.continuation(end, state.k - depth)
            if tokens:
                out.append(Alternative(depth, share, tuple(tokens), fork=True))
        return out

    def _candidate_alternatives(self, state: _RequestState, draft: tuple[int, ...], limit: int) -> list[Alternative]:
        """The other candidates' continuations departing from ``draft`` (see :meth:`alternatives`)."""
        groups: dict[tuple[int, ...], int] = {}
        for candidate in state.candidates:
            key = tuple(candidate.tokens[: state.k])
            groups[key] = groups.get(key, 0) + 1
        for tokens in state.backups:  # the other source's, at a shorter match: after every longest-match one
            groups.setdefault(tuple(tokens[: state.k]), 0)
        if len(groups) < 2:
            return []
        # how far each continuation agrees with the draft
        agree = {tokens: common_prefix(tokens, draft) for tokens in groups}
        out: list[Alternative] = []
        seen: set[tuple[int, int]] = set()
        for tokens, weight in sorted(groups.items(), key=lambda item: -item[1]):
            depth = agree[tokens]
            if depth >= len(tokens) or depth >= len(draft) or (depth, tokens[depth]) in seen:
                continue  # agrees with the draft as far as either goes, or departs like an earlier one
            seen.add((depth, tokens[depth]))
            agreeing = sum(w for t, w in groups.items() if len(t) > depth and agree[t] >= depth)
            out.append(Alternative(depth, weight / agreeing if agreeing else 0.0, tokens[depth:]))
            if len(out) >= limit:
                break
        return out

    def _candidates(self, state: _RequestState, context: Sequence[int], k: int) -> tuple[list[_Candidate], int]:
        """Continuations of the longest suffix matches in the context and the store."""
        end = len(context) - 1
        local = state.index.lookup(context, self.max_match, exclude_end=end, limit=max(self.max_candidates, 1))
        shared_len, shared = 0, []
        if self.store is not None:
            shared_len, shared = self.store.continuations(context, k, self.max_match, self.max_candidates)
        best = max(local[0].length if local else 0, shared_len)
        state.backups = []
        if local and local[0].length < best:
            state.backups = [state.index.continuation(m.end, k) for m in local[: self.max_candidates]]
        elif shared and shared_len < best:
            state.backups = [tokens for tokens, _ in shared]
        out: list[_Candidate] = []
        for match in local[: self.max_candidates]:
            if match.length == best:
                source = match.end + 1
                kind = state.prompt_kinds[source] if source < state.num_prompt else SpanKind.GENERATED
                out.append(_Candidate(state.index.continuation(match.end, k), kind, float(end - match.end), False, None))
        if shared_len == best:
            for tokens, span in shared:
                out.append(_Candidate(tokens, span.kind, float(self.store.clock - span.age), True, span.span_id))
        return [c for c in out if c.tokens], best

    def observe(self, outcome: DraftOutcome) -> None:
        state = started(self._requests, outcome.req_id, self.source, "observe")
        state.index.append_many(outcome.new_token_ids)
        state.output.extend(outcome.new_token_ids)
        drafted = len(outcome.draft)
        if drafted and state.last_kind is not None:
            state.history.record(drafted, outcome.num_accepted)
            self._kind_rates.record(state.session_id, state.last_kind.value, outcome.num_accepted / drafted)
        if outcome.num_accepted > 0 and state.last_span is not None and self.store is not None:
            self.store.touch(state.last_span)
        state.last_span = None
        state.last_kind = None
        state.candidates = []
        state.successors = ()

    def stop(self, req_id: str) -> None:
        state = self._requests.pop(req_id, None)
        if state is None:
            return
        self.kept.keep(state.index)  # its prompt and reply: the next call of the conversation starts with them
        if self.store is None or not self.register_outputs:
            return
        if 2 <= len(state.output) <= self.store.token_budget:
            self.store.add(state.output, SpanKind.GENERATED, state.session_id)


def _prompt_kinds(length: int, structure: PromptStructure | None) -> list[SpanKind]:
    kinds = [SpanKind.PROMPT] * length
    if structure is not None:
        for span in structure.spans:
            kinds[span.start : min(span.end, length)] = [span.kind] * (min(span.end, length) - span.start)
    return kinds


def _frequent_path(candidates: list[_Candidate], k: int) -> tuple[list[int], list[float], list[int], _Candidate]:
    """Walk the candidates' continuations, taking the most frequent next token at each depth.

    Returns the path, the branch probability of each step (share of the still
    agreeing candidates that continue with the chosen token), the support of each
    step (how many candidates continue with it), and the first candidate that
    follows the whole path (its provenance is reported).
    Identical continuations are grouped first, so the walk is over a few groups.
    """
    groups: dict[tuple[int, ...], list[_Candidate]] = {}
    for candidate in candidates:
        groups.setdefault(tuple(candidate.tokens), []).append(candidate)
    if len(groups) == 1:  # all candidates agree: the common case
        tokens, members = next(iter(groups.items()))
        n = min(k, len(tokens))
        return list(tokens[:k]), [1.0] * n, [len(members)] * n, members[0]
    alive = [(tokens, len(members), members[0]) for tokens, members in groups.items()]  # first seen = most recent
    path: list[int] = []
    probs: list[float] = []
    support: list[int] = []
    for depth in range(k):
        if len(alive) == 1:  # one group left: it is the path, every step of it taken by all still agreeing
            tokens, weight, _ = alive[0]
            rest = tokens[depth:k]
            path.extend(rest)
            probs.extend([1.0] * len(rest))
            support.extend([weight] * len(rest))
            break
        total = sum(weight for _, weight, _ in alive)
        counts: dict[int, int] = {}
        for tokens, weight, _ in alive:
            if len(tokens) > depth:
                counts[tokens[depth]] = counts.get(tokens[depth], 0) + weight
        if not counts:
            break
        token = max(counts, key=counts.__getitem__)  # ties: the first seen, i.e. the most recent
        path.append(token)
        probs.append(counts[token] / total)
        support.append(counts[token])
        alive = [group for group in alive if len(group[0]) > depth and group[0][depth] == token]
    return path, probs, support, alive[0][2]
