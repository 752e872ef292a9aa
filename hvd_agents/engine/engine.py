"""The decode engine: one target model, its KV cache, and the speculative loop.

Contract:

* ``Engine.stream(prompt_ids, params)`` yields :class:`TokenEvent` s; the last one
  has a ``finish_reason`` and the request's :class:`RequestStats`.
  ``Engine.generate`` aggregates the stream.
* The engine sees token ids only. Chat templates and tool-call formats live above
  it (:mod:`hvd_agents.chat.render`); a tokenizer, when given, is used only to turn the
  output into text incrementally and to match stop strings.
* An engine is built over a :class:`~hvd_agents.runtime.target.Target`: the model, the
  runner its forwards go through, its tokenizer and EOS ids (``Engine(model, ...)`` makes
  one; :meth:`Engine.sibling` is a second engine over the same target with one call).
  Its drafters are a :class:`~hvd_agents.engine.drafter_set.DrafterSet`.
* Each step (written once, in :mod:`hvd_agents.engine.request`, for both schedulers:
  :mod:`hvd_agents.engine.serial` one request at a time, :mod:`hvd_agents.engine.batch`
  many in one forward): the method's drafter proposes a draft (possibly empty), the target
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
  the engine never calls the model or touches KV layers itself.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hvd_agents.draft_head import DraftHead
from hvd_agents.drafters import CacheStore, Drafter, never_drafts
from hvd_agents.drafters.grammar import ForcedText
from hvd_agents.engine.batch import Batcher
from hvd_agents.engine.drafter_set import DrafterSet
from hvd_agents.engine.grammar import GrammarCompiler, GrammarState
from hvd_agents.engine.params import GenerationParams
from hvd_agents.engine.prefix_cache import PrefixCache
from hvd_agents.engine.request import DEFAULT_PREFILL_CHUNK, Request, RequestHost
from hvd_agents.engine.serial import SerialScheduler
from hvd_agents.engine.stats import RequestStats, TokenEvent
from hvd_agents.errors import ContextLengthError, InvalidRequestError
from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.loading import LoadedModel, load_model
from hvd_agents.runtime.runner import Runner
from hvd_agents.runtime.target import Target
from hvd_agents.structure import PromptStructure

logger = logging.getLogger(__name__)
_request_counter = itertools.count()
# Default prefix-cache budget: 1 GiB holds ~23K tokens of SmolLM2-135M KV in fp32 (46 KB per token),
# a few agent conversations of the sizes measured here; pass prefix_cache_bytes to size it for a model.
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class GenerationResult:
    """A finished request: what ``Engine.generate`` returns."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    stats: RequestStats


class Engine:
    """Speculative decoding over one target model.

    Args:
        model: the target model (any ``AutoModelForCausalLM``), in eval mode; or a
            :class:`~hvd_agents.runtime.target.Target` (model, runner, tokenizer, EOS ids),
            taken as it is: then ``tokenizer``, ``eos_token_ids``, ``context_window``,
            ``cost_model`` and ``runner`` are left out.
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
            :func:`~hvd_agents.runtime.runner_choice.runner_for` picks it: the static
            graph-captured runner for supported models on CUDA, the HF runner otherwise.
            A loaded model's native CPU forward (GGUF weights) comes with its
            :class:`~hvd_agents.runtime.loading.LoadedModel`: :meth:`from_loaded` (or a
            :class:`~hvd_agents.runtime.target.Target` made with ``native``) runs it.
        max_batch: concurrent requests decoded together, one forward per step for
            all of them (:mod:`hvd_agents.engine.batch`); 1 (the default) serialises
            requests (:mod:`hvd_agents.engine.serial`).
        max_queue: with ``max_batch > 1``, the most requests that may wait for a
            place in the batch; one more raises :class:`~hvd_agents.errors.QueueFullError`.
            None (the default): no bound.
        prefill_chunk: the most prompt tokens one prefill forward computes; a
            longer prompt is prefilled in chunks (the same ones alone or batched),
            and a batching engine runs one chunk between its steps, so a long
            prompt joining the batch does not stall the requests decoding in it.

    Attributes:
        target: the :class:`~hvd_agents.runtime.target.Target`; ``model``, ``runner``,
            ``tokenizer`` and ``eos_token_ids`` are its parts, ``device``, ``vocab_size`` and
            ``context_window`` its runner's.
        cache_store: the cache drafters' cross-request store.
        prefix_cache: the prefix KV cache.
        drafters: the engine's :class:`~hvd_agents.engine.drafter_set.DrafterSet`.

    Raises:
        InvalidRequestError: a bad ``prefill_chunk``, ``max_batch`` or ``max_queue``, a
            draft model with another vocabulary, or target parts given twice.

    Example (loads the embedded SmolLM2-135M)::

        engine = Engine.load()
        engine.generate(ids, GenerationParams(method="pld")).text
    """

    def __init__(
        self,
        model: PreTrainedModel | Target,
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
        target = _target(model, tokenizer, eos_token_ids=eos_token_ids, context_window=context_window,
                         cost_model=cost_model, runner=runner)
        self.target = target
        self.model, self.runner, self.tokenizer = target.model, target.runner, target.tokenizer
        self.eos_token_ids = target.eos_token_ids
        self.device, self.vocab_size, self.context_window = (self.runner.device, self.runner.vocab_size,
                                                             self.runner.context_window)
        self.prefill_chunk = prefill_chunk
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size) if self.tokenizer is not None else None
        self.cache_store = cache_store if cache_store is not None else CacheStore()
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._lock = threading.Lock()  # held while a request runs alone, or while the batcher steps
        self._batcher = (Batcher(self.runner, self._lock, self.cost_model, max_batch, max_queue=max_queue,
                                 prefill_chunk=prefill_chunk) if max_batch > 1 else None)
        self._scheduler = self._batcher if self._batcher is not None else SerialScheduler(self._lock)
        self.drafters = DrafterSet(self.model, self.vocab_size, self.cache_store, self.cost_model,
                                   draft_model=draft_model, draft_head=draft_head, tokenizer=self.tokenizer,
                                   quantize_head=bool(getattr(self.runner, "runs_own_threads", False)),
                                   tap_layers=getattr(self.runner, "set_hidden_taps", None))

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
        return cls.from_loaded(loaded, prefix_cache_bytes=prefix_cache_bytes, draft_model=drafter_lm,
                               draft_head=draft_head, max_batch=max_batch, max_queue=max_queue)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, *, cost_model: CostModel | None = None, runner: Runner | None = None,
                    **options) -> Engine:
        """A new engine over a loaded target (its model, tokenizer, EOS ids and context window).

        Args:
            loaded: what :func:`~hvd_agents.runtime.loading.load_model` returned.
            cost_model: the target's cost profile, when known.
            runner: the runner to use (default: the one chosen for the loaded model).
            **options: the constructor's other keyword arguments (``prefix_cache_bytes``,
                ``draft_head``, ``max_batch``, ...).
        """
        return cls(Target.from_loaded(loaded, cost_model=cost_model, runner=runner), **options)

    @classmethod
    def from_target(cls, target: Target, **options) -> Engine:
        """A new engine over ``target`` (its runner used as it is).

        Args:
            target: the model, runner, tokenizer and EOS ids.
            **options: the constructor's keyword arguments other than the target's parts
                (``cache_store``, ``prefix_cache_bytes``, ``draft_model``, ``draft_head``,
                ``max_batch``, ``max_queue``, ``prefill_chunk``).
        """
        return cls(target, **options)

    def sibling(self, *, cost_model: CostModel | None = None, **options) -> Engine:
        """A new engine over this engine's target: the same model, tokenizer, EOS ids, context window and
        measured cost profile; its own runner, empty cache store and prefix cache, no drafters added.

        Args:
            cost_model: the new runner's cost profile (default: this engine's).
            **options: the constructor's keyword arguments for the new engine (``prefix_cache_bytes``,
                ``draft_model``, ``draft_head``, ``max_batch``, ...).
        """
        return Engine(self.target.sibling(cost_model), **options)

    @property
    def batcher(self) -> Batcher | None:
        """The batching worker (its ``pending``, ``steps``, ``largest_batch``) when ``max_batch > 1``, else None."""
        return self._batcher

    def cost_model(self) -> CostModel:
        """The target's verification cost profile (measured once per model and machine, then cached)."""
        return self.runner.profile()

    # ---- drafters ----

    @property
    def draft_model(self) -> PreTrainedModel | None:
        """The draft model the model drafter runs, or None."""
        return self.drafters.draft_model

    @property
    def draft_head(self) -> DraftHead | None:
        """The draft head (the one shipped for this target when ``draft_head="auto"``), or None."""
        return self.drafters.draft_head

    def model_drafter(self) -> Drafter | None:
        """A fresh model drafter: over ``draft_model`` when given, else over the draft head; None without either."""
        return self.drafters.model_drafter()

    def drafter(self, method: str) -> Drafter:
        """The engine's drafter for ``method`` (created once, kept across requests)."""
        return self.drafters.get(method)

    def add_drafter(self, method: str, drafter: Drafter) -> None:
        """Make ``drafter`` available as ``GenerationParams(method=method)`` on this engine.

        Raises:
            InvalidRequestError: ``drafter`` does not implement the Drafter protocol.
        """
        self.drafters.add(method, drafter)

    # ---- requests ----

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
        drafter = self.drafters.for_request(params.method, batched=self._batcher is not None)
        host = RequestHost(self.runner, self.prefix_cache, self.prefill_chunk, self.tokenizer, self.eos_token_ids)
        grammar = self._grammar(params)
        if grammar is not None and not never_drafts(drafter):
            drafter = ForcedText(drafter)  # the text the grammar forces, drafted first
        req = Request(host, prompt_ids, params, req_id or f"req-{next(_request_counter)}", drafter, structure, grammar)
        return self._scheduler.submit(req)

    def _grammar(self, params: GenerationParams) -> GrammarState | None:
        """The request's grammar state (its constraint compiled, or taken from the cache), or None."""
        if params.constraint is None:
            return None
        if self.grammars is None:
            raise InvalidRequestError("a constraint needs a tokenizer; this engine was built without one")
        stops = params.stop_token_ids if params.stop_token_ids is not None else self.eos_token_ids
        return self.grammars.start(params.constraint, stops)

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


def _target(model: PreTrainedModel | Target, tokenizer: PreTrainedTokenizerBase | None, **parts) -> Target:
    """``model`` when it is a :class:`Target` (then no other part may be given), else the target made of the parts."""
    if not isinstance(model, Target):
        return Target.of(model, tokenizer, **parts)
    given = sorted(name for name, value in {"tokenizer": tokenizer, **parts}.items() if value is not None)
    if given:
        raise InvalidRequestError(f"an engine over a Target takes its {', '.join(given)} from the target; "
                                  "make the Target with them instead")
    return model
