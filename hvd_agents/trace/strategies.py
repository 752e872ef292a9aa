"""Drafting policies replayed by ``hvd-agents analyze``: drafters wrapped behind one small protocol.

A :class:`Policy` is what the replay loop (:mod:`hvd_agents.trace.replay`) drives,
with the engine's lifecycle: ``start(req_id, structure)`` once per assistant turn,
then per step ``propose(ctx, k, lookahead)`` and ``observe(outcome)``, then
``stop(req_id)``. ``lookahead`` is the rest of the recorded reply; only the
``oracle`` policy reads it (it is the upper bound, not a real drafter).

Policies (:data:`POLICIES`; ``hvd-cache`` is an alias of ``suffix``):

* ``ar``: no drafts (plain autoregressive decoding; speedup 1 by definition).
* ``pld``: HF prompt lookup (:class:`~hvd_agents.drafters.PromptLookupDrafter`, max n-gram 2).
* ``suffix-local``: the cache drafter over the live context only (``store=None``).
* ``suffix``: the cache drafter with the cross-request :class:`CacheStore`, every
  prompt's structure registered before its turn (the engine's ``hvd-cache``).
* ``suffix-threshold``: ArcticInference's hybrid rule. ArcticInference uses the
  suffix draft iff its score is ``>=`` the model drafter's number of speculative
  tokens (``model_runner.propose_draft_token_ids``), else the model drafter's
  draft. There is no model drafter here, so a draft below the threshold is
  replaced by no draft; the score is the cache drafter's match length and the
  threshold defaults to ``k`` (``--threshold``).
* ``hvd``: the engine's ``hvd`` method (:class:`~hvd_agents.drafters.hybrid.drafter.HybridDrafter`):
  the ``suffix`` drafter whose draft length is chosen per step by the payoff
  predictor (packaged weights, adapted online per conversation) and the cost
  model ``1 + c * d`` of the replay (``--verify-cost``); where the candidates
  disagree, the draft may carry alternative branches (a tree: its ``d`` counts
  every token, and the target follows whichever branch the reply does).
* ``hvd-paper``: the HVD paper's rule (:class:`~hvd_agents.drafters.hybrid.paper.PaperDrafter`):
  the whole ``suffix`` draft when the paper's MLP predicts more than ``--payoff-threshold``
  accepted tokens, else the model drafter (none in a replay: a plain step).
* ``hvd-chain`` / ``hvd-graft``: the merge baselines
  (:mod:`hvd_agents.drafters.hybrid.merge`): model draft then cache continuation, and
  the cache draft grafted onto the model's confident prefix. A replay has no model
  drafter, so both verify the ``suffix`` draft; they differ only live.
* ``oracle``: the ``suffix`` draft truncated to exactly the tokens that will be
  accepted: the same steps as ``suffix`` with no wasted verification, i.e. the
  upper bound of any draft-length rule applied to that drafter's single path.
* ``oracle-tree``: of the ``suffix`` draft and every continuation the cache drafter has that
  departs from it (:meth:`~hvd_agents.drafters.SuffixDrafter.alternatives`: the other
  candidates' and, at the draft's forks, what followed the same tokens elsewhere; up to
  :data:`ORACLE_TREE_BRANCHES`), the one path the reply follows furthest, cut to exactly
  that: no wasted verification, and the upper bound of any policy whose trees are built from
  that drafter's continuations and verify the path the target takes (``hvd``'s). Where it
  passes ``oracle`` is the room trees have; how much of it ``hvd`` takes is its ``off-path``
  figure (:class:`~hvd_agents.trace.stats.PolicyStats`).
* ``arctic``: ArcticInference's ``SuffixDecodingCache`` with its defaults (depth
  64, draft <= 1x match length, min token probability 0.1); only when
  ``arctic_inference`` imports, else skipped with a note.

Every policy that uses a store gets its own (shared by all its conversations,
as one deployment would share it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hvd_agents.chat.analyzer import register
from hvd_agents.drafters import (
    CacheStore,
    ChainDrafter,
    Draft,
    DraftContext,
    Drafter,
    DraftOutcome,
    GraftDrafter,
    HybridDrafter,
    NoDrafter,
    PaperDrafter,
    PromptLookupDrafter,
    SuffixDrafter,
)
from hvd_agents.drafters.base import common_prefix
from hvd_agents.drafters.hybrid import CacheProbe, CombinedDrafter
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy import FALLBACK_VERIFY_COST, CostModel, PayoffPredictor
from hvd_agents.policy.features import CacheDraftFeatures
from hvd_agents.policy.paper import PAPER_THRESHOLD, PaperMLP, TokenClasses
from hvd_agents.policy.payoff import PayoffWeights
from hvd_agents.policy.token_text import TokenText
from hvd_agents.structure import PromptStructure

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("ar", "pld", "suffix-local", "suffix", "suffix-threshold", "hvd", "hvd-paper",
                             "hvd-chain", "hvd-graft", "oracle", "oracle-tree", "arctic")
ALIASES = {"hvd-cache": "suffix"}
ARCTIC_DEPTH = 64
ORACLE_TREE_BRANCHES = 64
"""Most continuations ``oracle-tree`` reads off the cache drafter per step (``hvd`` grows trees over at most
:attr:`~hvd_agents.drafters.hybrid.config.HybridConfig.branches`)."""


class Policy(Protocol):
    """What the replay loop drives (see the module docstring)."""

    name: str

    def start(self, req_id: str, structure: PromptStructure) -> None:
        """Begin a turn whose prompt is ``structure.prompt_ids``."""

    def propose(self, ctx: DraftContext, k: int, lookahead: Sequence[int]) -> Draft:
        """At most ``k`` tokens to follow ``ctx.token_ids``; ``lookahead`` is the rest of the reply."""

    def observe(self, outcome: DraftOutcome) -> None:
        """The verification outcome of the last proposal."""

    def stop(self, req_id: str) -> None:
        """End the turn."""

    def probe(self, req_id: str) -> CacheProbe | None:
        """The last proposal's cache draft, prediction and arm (None: not known for this policy)."""


@dataclass
class DrafterPolicy:
    """A drafter, optionally with a cache store its prompts are registered in."""

    name: str
    drafter: Drafter
    store: CacheStore | None = None
    last: CacheProbe | None = None  # the last proposal's probe, for a plain cache drafter

    def start(self, req_id: str, structure: PromptStructure) -> None:
        if self.store is not None:
            register(self.store, structure)
        self.drafter.start(req_id, structure.prompt_ids, structure)

    def propose(self, ctx: DraftContext, k: int, lookahead: Sequence[int]) -> Draft:
        del lookahead
        return self.remember(self.drafter.propose(ctx, k))

    def remember(self, proposal: Draft, used: Draft | None = None) -> Draft:
        """Keep a plain cache drafter's ``proposal`` as the step's probe; return what is verified
        (``used``, default the proposal)."""
        used = proposal if used is None else used
        if isinstance(self.drafter, SuffixDrafter):
            features = proposal.features if isinstance(proposal.features, CacheDraftFeatures) else None
            self.last = CacheProbe(proposal.token_ids, None, "cache" if used.token_ids else "none", features)
        return used

    def probe(self, req_id: str) -> CacheProbe | None:
        if isinstance(self.drafter, (HybridDrafter, CombinedDrafter)):
            return self.drafter.probe(req_id)
        return self.last

    def observe(self, outcome: DraftOutcome) -> None:
        self.drafter.observe(outcome)

    def stop(self, req_id: str) -> None:
        self.drafter.stop(req_id)


@dataclass
class ThresholdPolicy(DrafterPolicy):
    """Use the drafter's draft only when its score reaches ``threshold`` (ArcticInference's hybrid rule)."""

    threshold: float = 16.0

    def propose(self, ctx: DraftContext, k: int, lookahead: Sequence[int]) -> Draft:
        draft = self.drafter.propose(ctx, k)
        return self.remember(draft, draft if draft.score >= self.threshold else Draft())


@dataclass
class OraclePolicy(DrafterPolicy):
    """The drafter's draft cut to its common prefix with the recorded reply (no wasted tokens)."""

    def propose(self, ctx: DraftContext, k: int, lookahead: Sequence[int]) -> Draft:
        draft = self.drafter.propose(ctx, k)
        return self.remember(draft, draft.truncated(common_prefix(draft.token_ids, lookahead)))


@dataclass
class TreeOraclePolicy(DrafterPolicy):
    """Of the drafter's draft and its alternatives, the path the recorded reply follows furthest, cut to exactly
    the tokens that will be accepted (see the module docstring)."""

    branches: int = ORACLE_TREE_BRANCHES

    def propose(self, ctx: DraftContext, k: int, lookahead: Sequence[int]) -> Draft:
        draft = self.drafter.propose(ctx, k)
        proposal = draft.token_ids[:k]
        best = common_prefix(proposal, lookahead)
        path = proposal[:best]
        if proposal and isinstance(self.drafter, SuffixDrafter):
            for alternative in self.drafter.alternatives(ctx.req_id, proposal, self.branches):
                tokens = (*proposal[: alternative.depth], *alternative.tokens)[:k]
                accepted = common_prefix(tokens, lookahead)
                if accepted > best:
                    best, path = accepted, tokens[:accepted]
        used = Draft(tuple(path), None, draft.score, draft.source, draft.features) if path else Draft()
        return self.remember(draft, used)


class ArcticDrafter:
    """ArcticInference's ``SuffixDecodingCache`` as a :class:`~hvd_agents.drafters.Drafter` (defaults kept)."""

    source = "arctic"

    def __init__(self) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=ARCTIC_DEPTH)

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        del structure
        self.cache.start_request(req_id, list(prompt_ids))

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        pattern = list(ctx.token_ids[-ARCTIC_DEPTH:])
        result = self.cache.speculate(ctx.req_id, pattern, max_spec_tokens=k)
        tokens = tuple(int(t) for t in result.token_ids[:k])
        return Draft(tokens, score=float(result.score), source=self.source) if tokens else Draft()

    def observe(self, outcome: DraftOutcome) -> None:
        if outcome.new_token_ids:
            self.cache.add_active_response(outcome.req_id, list(outcome.new_token_ids))

    def stop(self, req_id: str) -> None:
        if req_id in self.cache.active_requests:
            self.cache.stop_request(req_id)


def arctic_available() -> bool:
    """Whether ``arctic_inference`` (with its compiled suffix tree) imports."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except Exception:  # noqa: BLE001 (ImportError, or a broken native extension)
        return False
    return True


def resolve_policy_names(spec: str | Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Policy names from ``"a,b,..."`` (None: all available), and notes on skipped ones.

    Raises:
        InvalidRequestError: an unknown name (the message lists the known ones).
    """
    notes: list[str] = []
    if spec is None:
        names = list(POLICIES)
    else:
        raw = spec.split(",") if isinstance(spec, str) else list(spec)
        names = []
        for item in (s.strip() for s in raw):
            if not item:
                continue
            name = ALIASES.get(item, item)
            if name not in POLICIES:
                known = ", ".join([*POLICIES, *ALIASES])
                raise InvalidRequestError(f"unknown policy {item!r}; choose from {known}")
            if name not in names:
                names.append(name)
        if not names:
            raise InvalidRequestError("--policy names no policy")
    if "arctic" in names and not arctic_available():
        names.remove("arctic")
        notes.append("arctic skipped: arctic_inference is not installed (pip install arctic-inference)")
    return names, notes


def make_policy(name: str, *, threshold: float, verify_cost: float = FALLBACK_VERIFY_COST, store_tokens: int = 1_000_000,
                payoff_threshold: float = PAPER_THRESHOLD, paper: PaperMLP | None = None,
                classes: TokenClasses | None = None, text: TokenText | None = None,
                payoff: PayoffWeights | None = None) -> Policy:
    """A fresh policy by (resolved) name; store-based policies get a new store of ``store_tokens``.

    ``payoff_threshold``, ``paper`` (the MLP; the packaged one when None) and ``classes`` (the tokenizer's
    punctuation and bracket ids) configure ``hvd-paper``; ``text`` (the tokenizer's token classes, None: none)
    describes the cache drafts of ``suffix`` (so that its step records carry them) and ``hvd``; ``payoff`` is
    ``hvd``'s predictor's weights (None: the packaged ones).
    """
    if name == "ar":
        return DrafterPolicy(name, NoDrafter())
    if name == "pld":
        return DrafterPolicy(name, PromptLookupDrafter())
    if name == "suffix-local":
        return DrafterPolicy(name, SuffixDrafter(None))
    if name == "arctic":
        return DrafterPolicy(name, ArcticDrafter())
    store = CacheStore(store_tokens)
    if name == "suffix":
        return DrafterPolicy(name, SuffixDrafter(store, text=text), store)
    if name == "suffix-threshold":
        return ThresholdPolicy(name, SuffixDrafter(store), store, threshold=threshold)
    if name == "hvd":
        return DrafterPolicy(name, HybridDrafter(SuffixDrafter(store, text=text), PayoffPredictor(payoff),
                                                 CostModel.linear(verify_cost)), store)
    if name == "hvd-paper":
        return DrafterPolicy(name, PaperDrafter(SuffixDrafter(store), paper, threshold=payoff_threshold,
                                                classes=classes), store)
    if name == "hvd-chain":
        return DrafterPolicy(name, ChainDrafter(SuffixDrafter(store)), store)
    if name == "hvd-graft":
        return DrafterPolicy(name, GraftDrafter(SuffixDrafter(store)), store)
    if name == "oracle":
        return OraclePolicy(name, SuffixDrafter(store), store)
    if name == "oracle-tree":
        return TreeOraclePolicy(name, SuffixDrafter(store), store)
    raise InvalidRequestError(f"unknown policy {name!r}")
