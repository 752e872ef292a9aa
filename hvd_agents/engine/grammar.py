"""A request's grammar as part of the target: masks for every verified row, cuts for drafts.

The grammar engine is llguidance (``LLMatcher``): an Earley parser over a lexer of regex
derivatives that computes a next-token mask over the whole vocabulary in tens of
microseconds, reports grammar errors instead of crashing, rolls back, and fast-forwards
the text a grammar forces in the tokenizer's own tokenization.

Contract (notation of :mod:`hvd_agents.engine.verify`: a step verifies ``[last, x_1..x_d]``,
row ``i`` is the target's distribution after ``x_i``, row 0 after ``last``):

* **Masked rows.** Row ``i``'s logits are masked by the grammar's state after the emitted
  tokens and ``x_1..x_i`` (for a tree: node ``i - 1``'s path from the root): a token the
  grammar refuses there gets the lowest finite logit, so it is neither the argmax nor ever
  drawn. Plain constrained decoding is the same rule with ``d = 0``, so a speculative
  step's emitted tokens are those of plain constrained decoding, bit for bit (greedy), and
  have the constrained distribution (sampling).
* **Drafts cut.** A deterministic draft token the grammar refuses, and everything after it
  (in a tree: every node from the first whose path is refused), is dropped before verification (:meth:`GrammarState.cut`): point-mass drafts never change
  what is drawn, only how many rows one forward covers. A draft sampled from a distribution
  q keeps its first refused token, which verification rejects (p is 0 there) before drawing
  from the residual: dropping it would condition the draft on the grammar and bias sampling.
  The grammar never depends on the drafter.
* **State moves only on emitted tokens** (:meth:`GrammarState.advance`): masks are computed
  by consuming a draft's tokens and rolling them back, never by committing them.
* **End.** The request's stop ids are the grammar's end: they are allowed exactly where the
  grammar may end, and once it is complete nothing else is.

:class:`GrammarCompiler` (one per engine) builds the tokenizer's llguidance view once
(lazily: a second or so for a 49K vocabulary, several for a 262K one) and compiles each
distinct grammar once, keeping a bounded number of compiled matchers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from hvd_agents.drafters import Draft
from hvd_agents.engine.constraint import JSON_LAYOUT, Constraint, keyword_paths
from hvd_agents.errors import InvalidRequestError

logger = logging.getLogger(__name__)

# Compiled grammars kept per engine (least recently used dropped first).
DEFAULT_CACHE_SIZE = 64
# Resource bounds of one grammar: lexer states cost about 1-2 kB each; the other bounds are
# llguidance's defaults, stated here so that they are this project's choice.
LIMITS = {"max_items_in_row": 2000, "initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000,
          "step_max_items": 50_000, "max_lexer_states": 50_000, "max_grammar_size": 500_000, "verbose_errors": False}


class GrammarCompiler:
    """Compiles constraints for one tokenizer and vocabulary, and starts a request's grammar.

    Args:
        tokenizer: the target's (Hugging Face, fast) tokenizer.
        vocab_size: the target's vocabulary size (rows of its logits).
        cache_size: how many compiled grammars to keep.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self.tokenizer_s = 0.0  # seconds spent building the tokenizer's llguidance view (once)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """The tokenizer as llguidance reads it (built on first use)."""
        with self._lock:
            if self._ll_tokenizer is None:
                start = time.perf_counter()
                self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
                self.tokenizer_s = time.perf_counter() - start
                logger.info("grammar engine: tokenizer read in %.2f s", self.tokenizer_s)
            return self._ll_tokenizer

    def start(self, constraint: Constraint, stop_ids: Sequence[int]) -> GrammarState:
        """A new request's grammar state for ``constraint``, ending at ``stop_ids`` (none: the tokenizer's end
        token, which the request then stops at).

        Raises:
            InvalidRequestError: the constraint does not compile (see :meth:`check`).
        """
        matcher = self.compiled(constraint)
        end = self.ll_tokenizer().eos_token
        # a request that names no stop id ends where its grammar does, at the tokenizer's end token
        return GrammarState(matcher.deep_copy(), end, stop_ids or (end,), self.vocab_size)

    def check(self, constraint: Constraint) -> None:
        """Compile ``constraint`` (kept in the cache) without starting a request.

        Raises:
            InvalidRequestError: it does not compile: an unsupported schema keyword, named with its
                path; an invalid regex or grammar, with the parser's message; a grammar past the
                resource bounds.
        """
        self.compiled(constraint)

    def compiled(self, constraint: Constraint) -> llguidance.LLMatcher:
        """The pristine compiled matcher of ``constraint`` (from the cache, or compiled now); see :meth:`check`."""
        grammar = grammar_text(constraint)
        with self._lock:
            matcher = self._compiled.get(grammar)
            if matcher is not None:
                self._compiled.move_to_end(grammar)
                return matcher
        return self._compile(constraint, grammar)

    def _compile(self, constraint: Constraint, grammar: str) -> llguidance.LLMatcher:
        tokenizer = self.ll_tokenizer()
        limits = llguidance.LLParserLimits(**LIMITS)
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer, limits=limits)
        matcher = None
        if not error:
            matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
            error = matcher.get_error() if matcher.is_error() else ""
        if error:
            raise InvalidRequestError(explain(constraint, error))
        with self._lock:
            self._compiled[grammar] = matcher
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return matcher


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar of ``constraint``.

    Raises:
        InvalidRequestError: a GBNF grammar that does not convert.
    """
    if constraint.kind == "json_schema":
        # lenient: keywords that cannot be enforced are ignored, and oneOf is read as anyOf
        options = dict(JSON_LAYOUT, lenient=not constraint.strict, coerce_one_of=not constraint.strict)
        return llguidance.LLMatcher.grammar_from_json_schema(constraint.source, defaults=options)
    if constraint.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(constraint.source)
    if constraint.kind == "gbnf":
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(constraint.source))
        except Exception as exc:  # the converter raises plain exceptions that name the position
            raise InvalidRequestError(f"the GBNF grammar does not convert: {exc}") from exc
    return llguidance.LLMatcher.grammar_from_lark(constraint.source)


def explain(constraint: Constraint, error: str) -> str:
    """The message of a constraint that does not compile: the grammar engine's error, and for a JSON
    schema the path of each keyword it names (``Unimplemented keys: ["not"]`` -> ``/properties/a/not``)."""
    error = error.strip()
    if constraint.kind != "json_schema":
        return f"the {constraint.kind} constraint does not compile: {error}"
    schema = constraint.schema()
    where: list[str] = []
    if error.startswith("Unimplemented keys:"):
        try:
            keys = json.loads(error.removeprefix("Unimplemented keys:").strip().splitlines()[0])
        except ValueError:
            keys = []
        for key in keys:
            paths = list(keyword_paths(schema, key)) or ["/"]
            where.append(f"unsupported keyword {key!r} at {', '.join(paths[:5])}")
    elif error.startswith("Unknown format:"):
        name = error.removeprefix("Unknown format:").strip().splitlines()[0]
        paths = list(keyword_paths(schema, "format", name)) or ["/"]
        where.append(f"unsupported format {name!r} at {', '.join(paths[:5])}")
    detail = "; ".join(where) if where else error
    return f"the JSON schema cannot be enforced: {detail}"


class GrammarState:
    """One request's grammar: where it stands after the emitted tokens (see the module docstring).

    Args:
        matcher: a fresh llguidance matcher of the request's grammar (its own copy).
        end_token: the token llguidance ends a grammar with (the tokenizer's EOS).
        stop_ids: the request's stop token ids: each one is the grammar's end.
        vocab_size: the rows' width.
    """

    def __init__(self, matcher: llguidance.LLMatcher, end_token: int, stop_ids: Sequence[int], vocab_size: int) -> None:
        self.matcher = matcher
        self.end_token = end_token
        self.stop_ids = [t for t in sorted(set(stop_ids)) if 0 <= t < vocab_size]
        self._stops = frozenset(self.stop_ids)
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.mask_s = 0.0  # seconds spent computing masks and cuts
        self.masked_rows = 0

    def _id(self, token: int) -> int:
        """A token as the grammar reads it: every stop id is its end token."""
        return self.end_token if token in self._stops else int(token)

    def allows(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts from its current state (it does not move)."""
        return self.matcher.validate_tokens([self._id(t) for t in tokens]) if tokens else 0

    def forced_tokens(self) -> tuple[int, ...]:
        """Tokens the grammar forces next, in the tokenizer's own tokenization of the forced text (the last
        tokens that could merge with what follows are left out); empty when nothing is forced."""
        return tuple(self.matcher.compute_ff_tokens())

    def is_complete(self) -> bool:
        """The grammar accepts the output as it stands (a stop id is allowed now)."""
        return self.matcher.is_accepting()

    def cut(self, draft: Draft) -> Draft:
        """``draft`` cut before its first refused token (a tree: before its first node whose path is refused;
        a draft sampled from q: after its first refused token, see the module docstring)."""
        if not draft.token_ids:
            return draft
        start = time.perf_counter()
        if draft.probs is not None:
            # A draft sampled from q keeps its first refused token: verification rejects it (p is 0 there)
            # and draws from the residual max(p - q, 0). Cutting it would condition the draft on the
            # grammar and bias the output.
            draft = draft.truncated(self.allows(draft.token_ids) + 1)
        elif not draft.is_tree:
            draft = draft.truncated(self.allows(draft.token_ids))
        else:  # a tree is cut before its first node whose path is refused: a prefix, as every cut of a draft
            paths = _paths(draft)
            draft = draft.truncated(next((i for i, path in enumerate(paths) if self.allows(path) < len(path)),
                                         len(paths)))
        self.mask_s += time.perf_counter() - start
        return draft

    def allowed(self, draft: Draft) -> np.ndarray:
        """``[d + 1, vocab]`` bool: the tokens row ``i`` allows (the module's row rule).

        Each stop id is allowed where the grammar may end (its end token's bit) and nowhere else;
        a row that allows nothing (a row past the end, never emitted from) allows the stop ids.
        """
        start = time.perf_counter()
        bits = np.zeros((len(draft) + 1, self.words), dtype=np.int32)
        matcher, consumed = self.matcher, []
        for row, path in enumerate([[], *_paths(draft)]):
            common = 0
            while common < min(len(path), len(consumed)) and path[common] == consumed[common]:
                common += 1
            if len(consumed) > common:
                matcher.rollback(len(consumed) - common)
                del consumed[common:]
            rest = path[common:]
            # A stop id is never consumed (llguidance's rollback miscounts past an end it consumed), nor a
            # refused token (it would leave the matcher in its error state): rows after one are never
            # emitted from.
            ends = next((i for i, token in enumerate(rest) if token in self._stops), len(rest))
            taken = matcher.try_consume_tokens(rest[:ends]) if ends else 0
            consumed.extend(rest[:taken])
            if len(consumed) == len(path) and not matcher.is_error():
                matcher.unsafe_compute_mask_ptr(bits[row].ctypes.data, bits[row].nbytes)
        if consumed:
            matcher.rollback(len(consumed))
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab_size].astype(np.bool_)
        ends = allowed[:, self.end_token] | ~allowed.any(axis=1)  # [d + 1]
        allowed[:, self.end_token] = False
        allowed[:, self.stop_ids] = ends[:, None]
        self.mask_s += time.perf_counter() - start
        self.masked_rows += len(allowed)
        return allowed

    def masked(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """``logits`` ``[d + 1, vocab]`` with each row's refused tokens at the lowest finite value (a copy)."""
        allowed = torch.from_numpy(self.allowed(draft)).to(logits.device)  # [d + 1, vocab]
        if allowed.shape[-1] < logits.shape[-1]:  # logits wider than the vocabulary: the padding is refused
            allowed = torch.nn.functional.pad(allowed, (0, logits.shape[-1] - allowed.shape[-1]))
        return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)

    def advance(self, tokens: Sequence[int]) -> None:
        """Move the grammar past emitted ``tokens`` (each allowed by its row's mask).

        Raises:
            RuntimeError: the grammar refuses one: a mask and the emitted tokens disagree.
        """
        for token in tokens:
            if token in self._stops:
                return  # the end was emitted: nothing follows it
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"the grammar refused emitted token {token}: {self.matcher.get_error()}")


def _paths(draft: Draft) -> list[list[int]]:
    """Each draft token's path from the root, its own token last (a chain: its prefixes)."""
    parents = draft.parents if draft.parents is not None else tuple(range(-1, len(draft.token_ids) - 1))
    paths: list[list[int]] = []
    for token, parent in zip(draft.token_ids, parents):
        paths.append([*(paths[parent] if parent >= 0 else []), token])
    return paths
