"""The decode engine: one target model, its KV cache, and the speculative loop.

Contract:

* ``Engine.stream(prompt_ids, params)`` yields :class:`TokenEvent` s; the last one
  has a ``finish_reason`` and the request's :class:`RequestStats`.
  ``Engine.generate`` aggregates the stream.
* The engine sees token ids only. Chat templates and tool-call formats live above
  it (:mod:`hvd_agents.chat.template`); a tokenizer, when given, is used only to turn the
  output into text incrementally and to match stop strings.
* Each step: the method's drafter proposes a draft (possibly empty), the target
  verifies ``[last token] + draft`` in ONE forward pass, the accepted prefix plus one
  target token are emitted, and the KV cache is truncated to what was accepted.
  A tree draft (alternative continuations, ``Draft.parents``) is verified the same
  way under a tree attention mask; the accepted path's KV positions are kept.
  Output is lossless (see :mod:`hvd_agents.engine.verify`). Verification runs on the
  logits' device; a step reads one small packed result back to the host.
* By default requests on one engine are serialised (batch size 1): a lock is held
  while a stream runs. Closing the iterator early (``close()``, garbage collection, a
  cancelled consumer) ends the request and releases the lock. With ``max_batch > 1``
  concurrent requests are decoded together instead, one forward per step for all of
  them (:mod:`hvd_agents.engine.batch`); each request's events are the same.
* Prefill reuses KV (:mod:`hvd_agents.engine.prefix_cache`): the KV cache of the
  longest token prefix of ``prompt[:-1]`` that an earlier request computed is copied
  in and only the rest is prefilled; at the end of a request (finished, or closed
  between steps) its cache, which covers every token but the last emitted one, is
  handed to the prefix cache. Cache drafters hold no KV: they are started from the
  full prompt ids as always, so their state does not depend on what was reused.
  Model drafters keep their own KV over the context they have seen (see
  :mod:`hvd_agents.drafters.model.head` and :mod:`hvd_agents.drafters.model.draft_lm`).
* A drafter whose ``uses_hidden_states`` is True (the draft head) is given the
  target's last-layer hidden states of every processed token in its
  :class:`DraftContext` (:mod:`hvd_agents.runtime.hidden`); the engine asks the
  model for them only then.
* The target runs behind a :class:`~hvd_agents.runtime.runner.Runner` (its forward,
  its KV cache, rollback, tree compaction, prefix export/import, its cost profile);
  the loop here never calls the model or touches KV layers itself.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hvd_agents.draft_head import DraftHead, load_head, shipped_head_for
from hvd_agents.drafters import (
    CacheStore,
    Draft,
    DraftContext,
    Drafter,
    DrafterResources,
    DraftHeadDrafter,
    DraftModelDrafter,
    Outcome,
    create_drafter,
)
from hvd_agents.engine.batch import Batcher
from hvd_agents.engine.detok import IncrementalDetokenizer
from hvd_agents.engine.params import GenerationParams
from hvd_agents.engine.prefix_cache import PrefixCache, PrefixMatch
from hvd_agents.engine.sampling import SamplingParams
from hvd_agents.engine.stats import RequestStats, StepRecord, TokenEvent
from hvd_agents.engine.stops import StopStringMatcher
from hvd_agents.engine.verify import Verification, verify_step
from hvd_agents.errors import ContextLengthError, InvalidRequestError, RequestTimeoutError
from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.features import feature_record
from hvd_agents.runtime.hidden import HiddenStateBuffer
from hvd_agents.runtime.loading import load_model
from hvd_agents.runtime.runner import Runner, RunnerKV
from hvd_agents.runtime.selection import runner_for
from hvd_agents.runtime.transfer import to_device
from hvd_agents.structure import PromptStructure

logger = logging.getLogger(__name__)
_request_counter = itertools.count()
# Default prefix-cache budget: 1 GiB holds ~23K tokens of SmolLM2-135M KV in fp32 (46 KB per token),
# a few agent conversations of the sizes measured here; pass prefix_cache_bytes to size it for a model.
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
# Prompt tokens one prefill forward computes at most: long enough that a chunk keeps the
# dense kernels efficient (a 3,000-token prompt costs 6 forwards), short enough that the
# requests decoding in a batch wait about a second on two CPU cores while a chunk runs.
DEFAULT_PREFILL_CHUNK = 512


@dataclass(frozen=True)
class GenerationResult:
    """A finished request: what ``Engine.generate`` returns."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    stats: RequestStats


class _Request:
    """Mutable state of one running request (engine-internal)."""

    def __init__(self, engine: Engine, prompt_ids: Sequence[int], params: GenerationParams, req_id: str):
        self.req_id = req_id
        self.params = params
        self.sampling: SamplingParams = params.sampling
        self.token_ids: list[int] = list(prompt_ids)
        self.num_prompt = len(prompt_ids)
        self.budget = min(params.max_new_tokens, engine.context_window - self.num_prompt)
        ids = params.stop_token_ids if params.stop_token_ids is not None else engine.eos_token_ids
        self.stop_ids = frozenset(ids)
        self.stats = RequestStats(prompt_tokens=self.num_prompt, step_records=[] if params.record_steps else None)
        self.detok = IncrementalDetokenizer(engine.tokenizer) if engine.tokenizer is not None else None
        self.stops = StopStringMatcher(params.stop) if params.stop else None
        self.session_id: str | None = None
        self.cache: RunnerKV | None = None  # set by prefill; covers token_ids[:-1] between steps
        self.prefilled = False  # the cache covers the whole prompt (prefill done)
        self.hidden: HiddenStateBuffer | None = None  # set by prefill when the drafter uses hidden states
        self.deadline = None if params.timeout_s is None else time.monotonic() + params.timeout_s
        self.generator = torch.Generator(device=engine.device)
        if self.sampling.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.sampling.seed)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    def remaining_s(self) -> float | None:
        """Seconds left before the request's deadline (None: it has none)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def check_deadline(self, where: str) -> None:
        """Raise :class:`RequestTimeoutError` when the deadline has passed; ``where``: what the request was doing.

        Raises:
            RequestTimeoutError: the deadline has passed.
        """
        left = self.remaining_s()
        if left is not None and left <= 0:
            raise self.timed_out(where)

    def timed_out(self, where: str) -> RequestTimeoutError:
        return RequestTimeoutError(f"request {self.req_id} ran past its timeout of {self.params.timeout_s:g} s "
                                   f"{where} ({self.num_output} tokens generated)")


class Engine:
    """Speculative decoding over one HuggingFace causal LM.

    Args:
        model: the target model (any ``AutoModelForCausalLM``), in eval mode.
        tokenizer: its tokenizer; optional (without it events carry no text and
            stop strings are refused).
        eos_token_ids: ids that end generation by default; defaults to the
            tokenizer's / generation config's EOS ids.
        context_window: maximum total tokens; defaults to
            ``config.max_position_embeddings``.
        cache_store: the cross-request store the cache drafters share; a new
            empty one (1M-token budget) when omitted.
        cost_model: the target's verification cost model used by the ``hvd``
            policy; measured on first use (and cached per model and machine)
            when omitted.
        prefix_cache_bytes: byte budget of the prefix KV cache (reuse of earlier
            requests' KV for a shared token prefix); 0 or None disables it.
        draft_model: a smaller causal LM sharing the target's tokenizer, used as
            the model drafter (method ``model``, and inside ``hvd``).
        draft_head: the draft head used as the model drafter when there is no
            ``draft_model``: a :class:`~hvd_agents.draft_head.DraftHead`, a path
            to a head file, ``"auto"`` (the head shipped for this target, if
            any; the default) or None (no head).
        runner: the runner the target's forwards go through (a
            :class:`~hvd_agents.runtime.runner.Runner` over ``model``); by default
            :func:`~hvd_agents.runtime.selection.runner_for` picks it: the native
            CPU runner for GGUF weights, the static graph-captured runner for
            supported models on CUDA, the HF runner otherwise.
        max_batch: concurrent requests decoded together, one forward per step for
            all of them (:mod:`hvd_agents.engine.batch`); 1 (the default) serialises
            requests.
        max_queue: with ``max_batch > 1``, the most requests that may wait for a
            place in the batch; one more raises :class:`~hvd_agents.errors.QueueFullError`.
            None (the default): no bound.
        prefill_chunk: the most prompt tokens one prefill forward computes; a
            longer prompt is prefilled in chunks (the same ones alone or batched),
            and a batching engine runs one chunk between its steps, so a long
            prompt joining the batch does not stall the requests decoding in it.

    Example (loads the embedded SmolLM2-135M)::

        engine = Engine.load()
        engine.generate(ids, GenerationParams(method="pld")).text
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        eos_token_ids: Sequence[int] | None = None,
        context_window: int | None = None,
        cache_store: CacheStore | None = None,
        cost_model: CostModel | None = None,
        prefix_cache_bytes: int | None = DEFAULT_PREFIX_CACHE_BYTES,
        draft_model: PreTrainedModel | None = None,
        draft_head: DraftHead | str | Path | None = "auto",
        runner: Runner | None = None,
        max_batch: int = 1,
        max_queue: int | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise InvalidRequestError(f"prefill_chunk must be an int >= 1, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk
        self.model = model
        self.runner: Runner = runner if runner is not None else runner_for(
            model, context_window=context_window, cost_model=cost_model)
        self.tokenizer = tokenizer
        self.device = self.runner.device
        self.vocab_size = self.runner.vocab_size
        self.context_window = self.runner.context_window
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else _default_eos(model, tokenizer)
        self.cache_store = cache_store if cache_store is not None else CacheStore()
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._drafters: dict[str, Drafter] = {}
        self._lock = threading.Lock()
        self._added: set[str] = set()  # methods whose drafter a caller added (shared by batched requests)
        self._batcher = (Batcher(self, max_batch, max_queue=max_queue, make_drafter=self._request_drafter)
                         if max_batch > 1 else None)
        self.draft_model = draft_model
        self._draft_head = draft_head
        if draft_model is not None:
            draft_vocab = draft_model.get_output_embeddings().weight.shape[0]
            if abs(draft_vocab - self.vocab_size) > 1024:  # padded embeddings differ a little; tokenizers don't
                raise InvalidRequestError(
                    f"the draft model's vocabulary ({draft_vocab}) does not match the target's ({self.vocab_size}): "
                    "a draft model must share the target's tokenizer"
                )
        if isinstance(draft_head, (str, Path)) and draft_head != "auto":
            self._draft_head = load_head(draft_head, model)
        elif isinstance(draft_head, DraftHead) and draft_head.embed is None:
            draft_head.attach(model)

    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        device: str | None = None,
        prefix_cache_bytes: int | None = DEFAULT_PREFIX_CACHE_BYTES,
        draft_model: str | None = None,
        draft_head: str | Path | None = "auto",
        max_batch: int = 1,
        max_queue: int | None = None,
    ) -> Engine:
        """Load ``model`` (hub id, local path, GGUF file; None = embedded default) into a new engine.

        ``draft_model`` is loaded the same way (on the target's device); ``draft_head``
        is a head file, ``"auto"`` (the shipped head for this target) or None; ``max_batch``
        and ``max_queue`` as for the constructor.
        """
        loaded = load_model(model, device=device)
        drafter_lm = None
        if draft_model is not None:
            drafter_lm = load_model(draft_model, device=str(next(loaded.model.parameters()).device)).model
        return cls(
            loaded.model,
            loaded.tokenizer,
            eos_token_ids=loaded.eos_token_ids,
            context_window=loaded.context_window,
            prefix_cache_bytes=prefix_cache_bytes,
            draft_model=drafter_lm,
            draft_head=draft_head,
            max_batch=max_batch,
            max_queue=max_queue,
        )

    def cost_model(self) -> CostModel:
        """The target's verification cost profile (measured once per model and machine, then cached)."""
        return self.runner.profile()

    @property
    def draft_head(self) -> DraftHead | None:
        """The draft head (the one shipped for this target when ``draft_head="auto"``), or None."""
        if isinstance(self._draft_head, str):  # "auto", resolved on first use
            self._draft_head = shipped_head_for(self.model)
        return self._draft_head

    def model_drafter(self) -> Drafter | None:
        """A fresh model drafter: over ``draft_model`` when given, else over the draft head; None without either."""
        if self.draft_model is not None:
            return DraftModelDrafter(self.draft_model, self.vocab_size)
        head = self.draft_head
        return DraftHeadDrafter(head) if head is not None else None

    def drafter(self, method: str) -> Drafter:
        """The engine's drafter for ``method`` (created once, kept across requests)."""
        if method not in self._drafters:
            resources = DrafterResources(self.cache_store, self.cost_model, self.model_drafter)
            self._drafters[method] = create_drafter(method, resources)
        return self._drafters[method]

    def add_drafter(self, method: str, drafter: Drafter) -> None:
        """Make ``drafter`` available as ``GenerationParams(method=method)`` on this engine.

        Raises:
            InvalidRequestError: ``drafter`` does not implement the Drafter protocol.
        """
        if not isinstance(drafter, Drafter):
            raise InvalidRequestError(f"{type(drafter).__name__} does not implement the Drafter protocol")
        self._drafters[method] = drafter
        self._added.add(method)

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams | None = None,
        *,
        req_id: str | None = None,
        structure: PromptStructure | None = None,
    ) -> GenerationResult:
        """Run a request to completion; see :meth:`stream` for arguments and errors."""
        tokens: list[int] = []
        texts: list[str] = []
        finish, stats = "", None
        for event in self.stream(prompt_ids, params, req_id=req_id, structure=structure):
            tokens.extend(event.token_ids)
            texts.append(event.text)
            finish, stats = event.finish_reason or finish, event.stats or stats
        if stats is None:  # the loop always ends with a final event; guard against a broken drafter
            raise RuntimeError("generation ended without a final event")
        return GenerationResult(tuple(tokens), "".join(texts), finish, stats)

    def stream(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams | None = None,
        *,
        req_id: str | None = None,
        structure: PromptStructure | None = None,
    ) -> Iterator[TokenEvent]:
        """Decode a continuation of ``prompt_ids``, yielding events as tokens are accepted.

        Args:
            prompt_ids: the prompt's token ids (at least one).
            params: generation parameters (defaults: greedy, 256 tokens, method "hvd").
            req_id: an id for drafters' bookkeeping; generated when omitted.
            structure: the prompt's typed spans and session (from
                :func:`hvd_agents.chat.analyzer.analyze`), passed to the drafter.

        Raises:
            InvalidRequestError: empty prompt, token ids outside the vocabulary, stop
                strings without a tokenizer, or an unknown method (raised by this
                call, before any decoding).
            ContextLengthError: the prompt leaves no room for a new token.
        """
        params = params or GenerationParams()
        prompt_ids = self._check_prompt(prompt_ids, params)
        drafter = self.drafter(params.method)
        req = _Request(self, prompt_ids, params, req_id or f"req-{next(_request_counter)}")
        if getattr(drafter, "uses_hidden_states", False):
            req.hidden = HiddenStateBuffer()
        if self._batcher is not None:
            return self._batcher.submit(req, drafter, structure)
        return self._locked_run(req, drafter, structure)

    def _request_drafter(self, method: str) -> Drafter | None:
        """A fresh drafter of a built-in method for one batched request (None for an added one: shared)."""
        if method in self._added:
            return None
        return create_drafter(method, DrafterResources(self.cache_store, self.cost_model, self.model_drafter))

    def _locked_run(
        self, req: _Request, drafter: Drafter, structure: PromptStructure | None
    ) -> Iterator[TokenEvent]:
        left = req.remaining_s()
        if (left is not None and left <= 0) or not self._lock.acquire(timeout=-1 if left is None else left):
            raise req.timed_out("waiting for the engine")
        try:
            req.session_id = structure.session_id if structure is not None else None
            drafter.start(req.req_id, tuple(req.token_ids), structure)
            between_steps = False  # True when the cache is consistent: finished, or closed at a yield
            try:
                yield from self._run(req, drafter)
                between_steps = True
            except GeneratorExit:
                between_steps = True
                raise
            except RequestTimeoutError:
                between_steps = True  # raised between steps
                raise
            finally:
                drafter.stop(req.req_id)
                if between_steps:
                    self._keep_prefix(req)
                self._release(req)
        finally:
            self._lock.release()

    def _check_prompt(self, prompt_ids: Sequence[int], params: GenerationParams) -> list[int]:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise InvalidRequestError("prompt_ids is empty: a request needs at least one prompt token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if len(ids) >= self.context_window:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the model's context window is {self.context_window}: "
                "no room for a new token"
            )
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer; this engine was built without one")
        return ids

    def _run(self, req: _Request, drafter: Drafter) -> Iterator[TokenEvent]:
        cache = self._prefill(req)
        start = time.perf_counter()
        finish: str | None = None
        while finish is None:
            req.check_deadline("while decoding")
            room = req.budget - req.num_output  # >= 1
            draft = self._propose(req, drafter, room - 1)
            if draft.is_tree and not cache.supports_trees:
                draft = draft.main_branch()  # a sliding-window cache cannot drop a rejected branch's positions
            verify_start = time.perf_counter()
            verification = self._verify(req, cache, draft)
            verify_s = time.perf_counter() - verify_start
            emitted, text, finish = self._emit(req, verification.token_ids)
            self._account(req, draft, verification, len(emitted))
            drafter.observe(Outcome(req.req_id, draft, verification.num_accepted, emitted, verification.target_logprob,
                                    verification.target_entropy, verify_s=verify_s))
            if finish is None and req.num_output >= req.budget:
                finish = "length"
            if finish is not None:
                text += self._flush(req, finish)
                req.stats.decode_s = time.perf_counter() - start
            yield TokenEvent(emitted, text, finish, req.stats if finish else None)

    def _prefill(self, req: _Request) -> RunnerKV:
        """A KV cache over ``prompt[:-1]``: the longest stored prefix copied in, the rest computed."""
        for _ in self._prefill_chunks(req):
            pass
        return req.cache

    def _prefill_chunks(self, req: _Request) -> Iterator[int]:
        """:meth:`_prefill` as forwards of at most ``prefill_chunk`` tokens, yielding each one's size after it.

        ``req.cache`` is set at once (so that it is released if the request ends between
        chunks) and ``req.prefilled`` with the last chunk; the chunks are the same whoever
        runs them, so a prompt's KV is the same alone or in a batch. A prompt's KV goes to the
        prefix cache as soon as it is computed (a copy), so concurrent requests that share its
        prefix (a system prompt, tool schemas, a conversation forked into parallel branches)
        prefill that prefix once.
        """
        start = time.perf_counter()
        cache = req.cache = self.runner.new_kv()
        context = req.token_ids[:-1]
        match = PrefixMatch()
        if req.params.reuse_prefix:
            match = self.prefix_cache.lookup(context, cache, session_id=req.session_id)
        if req.hidden is not None:
            req.hidden.start = match.length
        rest = context[match.length :]
        chunks = even_chunks(rest, self.prefill_chunk)
        spent = time.perf_counter() - start
        for i, chunk in enumerate(chunks):
            if chunk:
                begin = time.perf_counter()
                self.runner.forward(cache, chunk, logits_to_keep=1, hidden=req.hidden)
                spent += time.perf_counter() - begin
            req.stats.prefill_s = spent
            if i == len(chunks) - 1:
                if req.params.reuse_prefix and rest:  # requests that start before this one ends may share its prompt
                    self.prefix_cache.insert(context, cache, prompt_len=req.num_prompt, session_id=req.session_id)
                req.prefilled = True
                req.stats.reused_prefix_tokens = match.length
                req.stats.prefilled_tokens = len(rest)
                req.stats.prefix_break_at = match.prefix_break_at
                req.stats.reply_mismatch_at = match.reply_mismatch_at
            yield len(chunk)

    def _keep_prefix(self, req: _Request) -> None:
        """Hand the request's KV (all tokens but the last emitted one) to the prefix cache."""
        if req.cache is None or not req.prefilled or not req.params.reuse_prefix:
            return
        self.prefix_cache.insert(req.token_ids[:-1], req.cache, prompt_len=req.num_prompt, session_id=req.session_id)

    @staticmethod
    def _release(req: _Request) -> None:
        """Give the request's KV back to its runner (a static runner's slot); the prefix cache holds copies."""
        if req.cache is not None:
            req.cache.release()
            req.cache = None

    def _propose(self, req: _Request, drafter: Drafter, max_len: int, step_cost: CostModel | None = None,
                 step_share: float = 1.0) -> Draft:
        """Ask the drafter for at most ``min(K, max_len)`` in-vocabulary tokens (``step_cost``, ``step_share``:
        a batched step's prices, see :class:`~hvd_agents.drafters.DraftContext`)."""
        k = min(req.params.draft_tokens, max_len)
        if k <= 0:
            return Draft()
        hidden = req.hidden
        ctx = DraftContext(
            req.req_id,
            req.token_ids,
            req.num_prompt,
            hidden_states=None if hidden is None else hidden.view(),
            hidden_start=0 if hidden is None else hidden.start,
            temperature=req.sampling.temperature,
            generator=req.generator,
            step_cost=step_cost,
            step_share=step_share,
        )
        draft = drafter.propose(ctx, k)
        valid = 0
        for token in draft.token_ids[:k]:
            if not 0 <= token < self.vocab_size:
                break
            valid += 1
        return draft.truncated(valid)

    def _verify(self, req: _Request, cache: RunnerKV, draft: Draft) -> Verification:
        """One target forward over ``[last] + draft``; keeps only accepted positions in the KV cache.

        A tree draft (``draft.is_tree``) runs under its tree attention mask and its accepted
        path's positions are kept. Verification and the target's signal at the last token
        (log-probability, entropy; drafters may use them as features) are computed on the
        logits' device and read to the host ONCE (:mod:`hvd_agents.engine.verify`); the KV
        and hidden-state bookkeeping that follows uses host ints.
        """
        past = cache.length
        hidden = [] if req.hidden is not None else None
        logits = self.runner.forward(cache, [req.token_ids[-1], *draft.token_ids], hidden=hidden,
                                     parents=draft.parents if draft.is_tree else None)  # [d + 1, vocab]
        return self._settle(req, cache, draft, logits, hidden, past)

    def _settle(self, req: _Request, cache: RunnerKV, draft: Draft, logits: torch.Tensor, hidden: list | None,
                past: int) -> Verification:
        """:meth:`_verify` after its forward (``logits`` ``[d + 1, vocab]`` over ``past`` cached positions, the
        rows' hidden states in ``hidden``): verification, one host read, the KV and hidden-state bookkeeping.
        The batched loop (:mod:`hvd_agents.engine.batch`) settles each request's part of its forward here too."""
        d = len(draft)
        tree = draft.is_tree
        draft_ids = to_device(draft.token_ids, self.device)  # [d]
        if tree:
            parents = to_device(draft.parents, self.device)  # [d]
        else:
            parents = torch.arange(-1, d - 1, device=self.device)  # [d]: a chain
        packed = verify_step(logits, draft_ids, parents, req.sampling, req.generator, draft.probs)
        result = Verification.from_packed(packed.tolist())  # the step's one host read
        n = result.num_accepted
        if tree:
            rows = [0, *(1 + node for node in result.path)]  # positions of the accepted path among the new ones
            cache.compact(past, rows)
            if hidden:
                req.hidden.extend(hidden[0].index_select(0, to_device(rows, hidden[0].device)))
        else:
            cache.rollback(past + 1 + n)
            if hidden:
                req.hidden.extend(hidden[0][: 1 + n])
        return result

    def _emit(self, req: _Request, tokens: tuple[int, ...]) -> tuple[tuple[int, ...], str, str | None]:
        """Append verified tokens one by one until a stop id, stop string or the budget ends the request."""
        emitted: list[int] = []
        texts: list[str] = []
        for token in tokens:
            if req.num_output >= req.budget:
                break
            req.token_ids.append(token)
            emitted.append(token)
            if token in req.stop_ids:
                return tuple(emitted), "".join(texts), "stop"
            if req.detok is None:
                continue
            text = req.detok.push([token])
            if req.stops is not None:
                text, stopped = req.stops.feed(text)
                if stopped:
                    texts.append(text)
                    return tuple(emitted), "".join(texts), "stop"
            texts.append(text)
        return tuple(emitted), "".join(texts), None

    def _flush(self, req: _Request, finish: str) -> str:
        """Text still held back by the detokenizer / stop matcher when the request ends."""
        if req.detok is None or (req.stops is not None and req.stops.stopped):
            return ""
        tail = req.detok.flush()
        if req.stops is None:
            return tail
        text, stopped = req.stops.feed(tail)
        return text if stopped else text + req.stops.flush()

    @staticmethod
    def _account(req: _Request, draft: Draft, verification: Verification, emitted: int) -> None:
        position = req.num_output - emitted
        req.stats.new_tokens = req.num_output
        req.stats.record(draft.source, len(draft), verification.num_accepted)
        if req.stats.step_records is not None:
            req.stats.step_records.append(
                StepRecord(
                    req.stats.steps - 1,
                    position,
                    draft.source,
                    len(draft),
                    verification.num_accepted,
                    emitted,
                    feature_record(draft.features),
                )
            )


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


def _default_eos(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    ids: set[int] = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
