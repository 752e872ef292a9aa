"""One request and its step: what the one-request loop and the batcher both run.

A :class:`Request` is one running request: its tokens, KV cache, drafter, detokenizer,
stop matcher, RNG, deadline and stats. Its step is written once, here, and a scheduler
(:class:`~hvd_agents.engine.serial.SerialScheduler` for one at a time, or the
:class:`~hvd_agents.engine.batch.Batcher` for many) only decides when each phase runs
and whose rows share a forward::

    req.start()                                  # the drafter's start, once
    for _ in req.prefill_chunks(): ...           # prompt[:-1]: prefix cache, then chunks
    while not finished:
        draft = req.propose()                    # 1. the drafter's draft, cut to the budget
        step = req.step_call(draft)              # 2. the rows [last] + draft for the forward
        logits = <one forward, alone or batched>
        verification = req.settle(step, logits)  # 3. verify, one host read, KV rollback
        event = req.finish_step(draft, verification, verify_s)  # 4. emit, account, observe
    req.end(consistent=True)                     # the drafter's stop, KV to the prefix cache, slot freed

:meth:`Request.verify` is phases 2-3 for a request alone (its own forward). A request
does not know whether it is batched: its output is the same either way.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from hvd_agents.drafters import Draft, DraftContext, Drafter, DraftOutcome, uses_hidden_states
from hvd_agents.engine.detok import IncrementalDetokenizer
from hvd_agents.engine.grammar import GrammarState
from hvd_agents.engine.params import GenerationParams
from hvd_agents.engine.prefix_cache import PrefixCache, PrefixMatch
from hvd_agents.engine.sampling import SamplingParams
from hvd_agents.engine.stats import RequestStats, TokenEvent, VerifyStepRecord
from hvd_agents.engine.stops import StopStringMatcher
from hvd_agents.engine.verify import Verification, verify_on_host, verify_step
from hvd_agents.errors import RequestTimeoutError
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.features import feature_record
from hvd_agents.runtime.greedy_rows import TORCH_GREEDY_ROWS
from hvd_agents.runtime.hidden import HiddenStateBuffer
from hvd_agents.runtime.runner import BatchCall, Runner, RunnerKV
from hvd_agents.runtime.transfer import to_device
from hvd_agents.structure import PromptStructure

# Prompt tokens one prefill forward computes at most: long enough that a chunk keeps the
# dense kernels efficient (a 3,000-token prompt costs 6 forwards), short enough that the
# requests decoding in a batch wait about a second on two CPU cores while a chunk runs.
DEFAULT_PREFILL_CHUNK = 512
PRIOR_RATE = 0.5  # a request's acceptance rate before it has verified anything


def verifies_on_host(logits: torch.Tensor) -> bool:
    """Whether a step is verified on host integers (:func:`~hvd_agents.engine.verify.verify_on_host`): with
    the logits on the CPU (on a device, verification runs there and is read once)."""
    return logits.device.type == "cpu"


@dataclass(frozen=True)
class RequestHost:
    """What a request runs on: the engine's parts it reads (the engine makes one per request).

    Attributes:
        runner: the target's runner (forwards, KV caches, device, vocabulary, context window).
        prefix_cache: where prompts' KV is looked up before prefill and kept after it.
        prefill_chunk: the most prompt tokens one prefill forward computes.
        tokenizer: for text output and stop strings (None: events carry no text).
        eos_token_ids: the ids that end a request whose parameters name none.
    """

    runner: Runner
    prefix_cache: PrefixCache
    prefill_chunk: int
    tokenizer: PreTrainedTokenizerBase | None
    eos_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class StepCall:
    """One request's part of a step's forward: the rows (:class:`BatchCall`) and what settling needs."""

    draft: Draft
    call: BatchCall
    past: int  # cached positions before the forward


class Request:
    """Mutable state of one running request, and its step (see the module docstring).

    Args:
        host: the runner, prefix cache and settings the request uses.
        prompt_ids: the checked prompt (at least one in-vocabulary token, room for one more).
        params: the request's generation parameters.
        req_id: its id, for drafters' bookkeeping and errors.
        drafter: the drafter of its method (its own, or one shared by requests).
        structure: the prompt's typed spans and session, given to the drafter.
        grammar: the state of the request's constraint (:mod:`hvd_agents.engine.grammar`), or None.
    """

    def __init__(self, host: RequestHost, prompt_ids: Sequence[int], params: GenerationParams, req_id: str,
                 drafter: Drafter, structure: PromptStructure | None = None,
                 grammar: GrammarState | None = None) -> None:
        runner = host.runner
        self.host = host
        self.req_id = req_id
        self.params = params
        self.drafter = drafter
        self.structure = structure
        self.grammar = grammar
        self.sampling: SamplingParams = params.sampling
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt = len(prompt_ids)
        self.budget = min(params.max_new_tokens, runner.context_window - self.num_prompt)
        ids = params.stop_token_ids if params.stop_token_ids is not None else host.eos_token_ids
        self.stop_ids = frozenset(ids) | (frozenset(grammar.stop_ids) if grammar is not None else frozenset())
        self.stats = RequestStats(prompt_tokens=self.num_prompt, step_records=[] if params.record_steps else None)
        self.detok = IncrementalDetokenizer(host.tokenizer) if host.tokenizer is not None else None
        self.stops = StopStringMatcher(params.stop) if params.stop else None
        self.session_id: str | None = None
        self.cache: RunnerKV | None = None  # set by prefill; covers token_ids[:-1] between steps
        self.prefilled = False  # the cache covers the whole prompt (prefill done)
        self.started = False  # the drafter was started and not yet stopped
        self.decode_start = 0.0  # perf_counter() when prefill ended
        # the target's hidden states of every processed token, when the drafter reads them
        self.hidden: HiddenStateBuffer | None = HiddenStateBuffer() if uses_hidden_states(drafter) else None
        self.deadline = None if params.timeout_s is None else time.monotonic() + params.timeout_s
        self.generator = torch.Generator(device=runner.device)
        if self.sampling.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.sampling.seed)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def greedy(self) -> bool:
        """Greedy decoding (temperature 0): its drafts may depend on its company in a batch."""
        return self.sampling.temperature <= 0

    # ---- deadline ----

    def remaining_s(self) -> float | None:
        """Seconds left before the request's deadline (None: it has none)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def overdue(self) -> bool:
        """Whether the deadline has passed."""
        left = self.remaining_s()
        return left is not None and left <= 0

    def check_deadline(self, where: str) -> None:
        """Raise :class:`RequestTimeoutError` when the deadline has passed; ``where``: what the request was doing.

        Raises:
            RequestTimeoutError: the deadline has passed.
        """
        if self.overdue():
            raise self.timed_out(where)

    def timed_out(self, where: str) -> RequestTimeoutError:
        """The error of a request that ran past its deadline ``where`` (doing what)."""
        return RequestTimeoutError(f"request {self.req_id} ran past its timeout of {self.params.timeout_s:g} s "
                                   f"{where} ({self.num_output} tokens generated)")

    # ---- lifecycle ----

    def start(self) -> None:
        """Start the drafter on the prompt (once, before prefill)."""
        self.session_id = self.structure.session_id if self.structure is not None else None
        self.drafter.start(self.req_id, tuple(self.token_ids), self.structure)
        self.started = True

    def end(self, *, consistent: bool) -> None:
        """Stop the drafter, keep the KV in the prefix cache when ``consistent`` (between steps), free the cache."""
        if self.started:
            self.drafter.stop(self.req_id)
            self.started = False
        if consistent:
            self._keep_prefix()
        self._release()

    def _keep_prefix(self) -> None:
        """Hand the request's KV (all tokens but the last emitted one) to the prefix cache."""
        if self.cache is None or not self.prefilled or not self.params.reuse_prefix:
            return
        self.host.prefix_cache.insert(self.token_ids[:-1], self.cache, prompt_len=self.num_prompt,
                                      session_id=self.session_id)

    def _release(self) -> None:
        """Give the request's KV back to its runner (a static runner's slot); the prefix cache holds copies."""
        if self.cache is not None:
            self.cache.release()
            self.cache = None

    # ---- prefill ----

    def prefill(self) -> None:
        """A KV cache over ``prompt[:-1]``: the longest stored prefix copied in, the rest computed."""
        for _ in self.prefill_chunks():
            pass

    def prefill_chunks(self) -> Iterator[int]:
        """:meth:`prefill` as forwards of at most ``prefill_chunk`` tokens, yielding each one's size after it.

        ``cache`` is set at once (so that it is released if the request ends between
        chunks) and ``prefilled`` with the last chunk; the chunks are the same whoever
        runs them, so a prompt's KV is the same alone or in a batch. A prompt's KV goes to the
        prefix cache as soon as it is computed (a copy), so concurrent requests that share its
        prefix (a system prompt, tool schemas, a conversation forked into parallel branches)
        prefill that prefix once.
        """
        host = self.host
        start = time.perf_counter()
        cache = self.cache = host.runner.new_kv()
        context = self.token_ids[:-1]
        match = PrefixMatch()
        if self.params.reuse_prefix:
            match = host.prefix_cache.lookup(context, cache, session_id=self.session_id)
        if self.hidden is not None:
            self.hidden.start = match.length
        rest = context[match.length :]
        chunks = even_chunks(rest, host.prefill_chunk)
        spent = time.perf_counter() - start
        for i, chunk in enumerate(chunks):
            if chunk:
                begin = time.perf_counter()
                host.runner.forward(cache, chunk, logits_to_keep=1, hidden=self.hidden)
                spent += time.perf_counter() - begin
            self.stats.prefill_s = spent
            if i == len(chunks) - 1:
                if self.params.reuse_prefix and rest:  # requests that start before this one ends may share its prompt
                    host.prefix_cache.insert(context, cache, prompt_len=self.num_prompt, session_id=self.session_id)
                self._prefill_done(match, len(rest))
            yield len(chunk)

    def _prefill_done(self, match: PrefixMatch, computed: int) -> None:
        self.prefilled = True
        self.stats.reused_prefix_tokens = match.length
        self.stats.prefilled_tokens = computed
        self.stats.prefix_break_at = match.prefix_break_at
        self.stats.reply_mismatch_at = match.reply_mismatch_at
        self.decode_start = time.perf_counter()

    # ---- the step ----

    def propose(self, step_cost: CostModel | None = None, step_share: float = 1.0) -> Draft:
        """1. The drafter's draft: at most ``min(K, room - 1)`` in-vocabulary tokens, a tree only where the cache
        can drop a rejected branch (``step_cost``, ``step_share``: a batched step's prices, see
        :class:`~hvd_agents.drafters.DraftContext`)."""
        k = min(self.params.draft_tokens, self.budget - self.num_output - 1)
        if k <= 0:
            return Draft()
        hidden = self.hidden
        ctx = DraftContext(
            self.req_id,
            self.token_ids,
            self.num_prompt,
            hidden_states=None if hidden is None else hidden.view(),
            hidden_start=0 if hidden is None else hidden.start,
            temperature=self.sampling.temperature,
            generator=self.generator,
            step_cost=step_cost,
            step_share=step_share,
            grammar=self.grammar,
        )
        draft = self.drafter.propose(ctx, k)
        valid = 0
        vocab = self.host.runner.vocab_size
        for token in draft.token_ids[:k]:
            if not 0 <= token < vocab:
                break
            valid += 1
        draft = draft.truncated(valid)
        if self.grammar is not None:
            draft = self.grammar.cut(draft)  # a token the grammar refuses is never verified
        if draft.is_tree and not self.cache.supports_trees:
            draft = draft.main_branch()  # a sliding-window cache cannot drop a rejected branch's positions
        tree_limit = getattr(self.host.runner, "max_tree_tokens", None)  # a runner's most tokens in one tree forward
        if draft.is_tree and tree_limit is not None:
            draft = draft.truncated(tree_limit)  # every token's parent comes before it: a prefix is a tree
        return draft

    def step_call(self, draft: Draft) -> StepCall:
        """2. The step's rows for this request: ``[last] + draft`` (a tree under its parents) over its cache."""
        hidden = [] if self.hidden is not None else None
        call = BatchCall(self.cache, [self.token_ids[-1], *draft.token_ids], draft.parents if draft.is_tree else None,
                         hidden)
        return StepCall(draft, call, self.cache.length)

    def verify(self, draft: Draft) -> Verification:
        """2-3 for a request alone: one target forward over ``[last] + draft``, then :meth:`settle`.

        A tree draft (``draft.is_tree``) runs under its tree attention mask and its accepted
        path's positions are kept. Verification and the target's signal at the last token
        (log-probability, entropy; drafters may use them as features) are computed on the
        logits' device and read to the host ONCE (:mod:`hvd_agents.engine.verify`); the KV
        and hidden-state bookkeeping that follows uses host ints.
        """
        step = self.step_call(draft)
        call = step.call
        logits = self.host.runner.forward(call.kv, call.token_ids, hidden=call.hidden,
                                          parents=call.parents)  # [d + 1, vocab]
        return self.settle(step, logits)

    def settle(self, step: StepCall, logits: torch.Tensor) -> Verification:
        """3. After the forward (``logits`` ``[d + 1, vocab]`` over ``step.past`` cached positions, the rows'
        hidden states in ``step.call.hidden``): verification, one host read, the KV and hidden-state bookkeeping."""
        draft, cache, hidden, past = step.draft, step.call.kv, step.call.hidden, step.past
        device = self.host.runner.device
        d = len(draft)
        tree = draft.is_tree
        if self.grammar is not None:
            logits = self.grammar.masked(logits, draft)  # [d + 1, vocab]: row i under the grammar after x_1..x_i
        if verifies_on_host(logits):  # host integers: no tensor op per stage
            result = verify_on_host(logits, draft.token_ids, draft.parents if tree else None,
                                    getattr(self.host.runner, "greedy_rows", TORCH_GREEDY_ROWS),
                                    self.sampling, self.generator, draft.probs)
        else:
            draft_ids = to_device(draft.token_ids, device)  # [d]
            if tree:
                parents = to_device(draft.parents, device)  # [d]
            else:
                parents = torch.arange(-1, d - 1, device=device)  # [d]: a chain
            packed = verify_step(logits, draft_ids, parents, self.sampling, self.generator, draft.probs)
            result = Verification.from_packed(packed.tolist())  # the step's one host read
        n = result.num_accepted
        if tree:
            rows = [0, *(1 + node for node in result.path)]  # positions of the accepted path among the new ones
            cache.compact(past, rows)
            if hidden:
                self.hidden.extend(hidden[0].index_select(0, to_device(rows, hidden[0].device)))
        else:
            cache.rollback(past + 1 + n)
            if hidden:
                self.hidden.extend(hidden[0][: 1 + n])
        return result

    def undo(self, step: StepCall) -> None:
        """Drop a step's rows unsettled (its request left during the forward): the cache stays consistent."""
        step.call.kv.rollback(step.past)

    def finish_step(self, draft: Draft, verification: Verification, verify_s: float) -> TokenEvent:
        """4. Emit the verified tokens, account the step, tell the drafter, and make the step's event."""
        emitted, text, finish = self._emit(verification.token_ids)
        if self.grammar is not None:
            self.grammar.advance(emitted)
        self._account(draft, verification, len(emitted))
        self.drafter.observe(DraftOutcome(self.req_id, draft, verification.num_accepted, emitted,
                                     verification.target_logprob, verification.target_entropy, verify_s=verify_s))
        if finish is None and self.num_output >= self.budget:
            finish = "length"
        if finish is not None:
            text += self._flush()
            self.stats.decode_s = time.perf_counter() - self.decode_start
            self.stats.grammar_s = self.grammar.mask_s if self.grammar is not None else 0.0
        return TokenEvent(emitted, text, finish, self.stats if finish else None)

    def acceptance_rate(self) -> float:
        """The acceptance rate so far (accepted over drafted tokens), with a prior of one draft token."""
        drafted = sum(s.drafted for s in self.stats.per_source.values())
        accepted = sum(s.accepted for s in self.stats.per_source.values())
        return (accepted + PRIOR_RATE) / (drafted + 1)

    def _emit(self, tokens: tuple[int, ...]) -> tuple[tuple[int, ...], str, str | None]:
        """Append verified tokens one by one until a stop id, stop string or the budget ends the request."""
        emitted: list[int] = []
        texts: list[str] = []
        for token in tokens:
            if self.num_output >= self.budget:
                break
            self.token_ids.append(token)
            emitted.append(token)
            if token in self.stop_ids:
                return tuple(emitted), "".join(texts), "stop"
            if self.detok is None:
                continue
            text = self.detok.push([token])
            if self.stops is not None:
                text, stopped = self.stops.feed(text)
                if stopped:
                    texts.append(text)
                    return tuple(emitted), "".join(texts), "stop"
            texts.append(text)
        return tuple(emitted), "".join(texts), None

    def _flush(self) -> str:
        """Text still held back by the detokenizer / stop matcher when the request ends."""
        if self.detok is None or (self.stops is not None and self.stops.stopped):
            return ""
        tail = self.detok.flush()
        if self.stops is None:
            return tail
        text, stopped = self.stops.feed(tail)
        return text if stopped else text + self.stops.flush()

    def _account(self, draft: Draft, verification: Verification, emitted: int) -> None:
        stats = self.stats
        position = self.num_output - emitted
        stats.new_tokens = self.num_output
        stats.record(draft.source, len(draft), verification.num_accepted)
        if stats.step_records is not None:
            stats.step_records.append(VerifyStepRecord(stats.steps - 1, position, draft.source, len(draft),
                                                       verification.num_accepted, emitted,
                                                       feature_record(draft.features)))


def even_chunks(tokens: list[int], most: int) -> list[list[int]]:
    """``tokens`` in the fewest chunks of at most ``most``, of sizes that differ by one at most.

    Even sizes keep every chunk of a long prompt long (a runner may use other kernels
    for a short forward than for a long one), and an empty list is one empty chunk.

    >>> [len(c) for c in even_chunks(list(range(1100)), 512)]
    [367, 367, 366]
    >>> even_chunks([], 512)
    [[]]
    """
    k = max(1, -(-len(tokens) // most))
    size, extra = divmod(len(tokens), k)
    bounds = [0]
    for i in range(k):
        bounds.append(bounds[-1] + size + (i < extra))
    return [tokens[a:b] for a, b in itertools.pairwise(bounds)]
