"""The Drafter protocol and the records that cross it.

Every drafter, cache or model based, implements the same four calls, with the
lifecycle of a request::

    drafter.start(req_id, prompt_ids, structure)   # once, before the first step
    draft = drafter.propose(ctx, k)          # each step: at most k new tokens
    drafter.observe(outcome)                 # each step: what the target accepted
    drafter.stop(req_id)                     # once, always (also on error/cancel)

The engine never branches on a drafter's name; it only reads the :class:`Draft`.
A drafter that has nothing to offer returns ``Draft()`` (empty), never ``None``.
Drafters own their own state (indexes, caches, RNG, a model drafter's own KV); the
engine owns the target model, its KV cache and the token sequence. A drafter that
drafts from the target's hidden states sets the attribute ``uses_hidden_states =
True``; the engine then computes them and passes them in :class:`DraftContext`.
A drafter that never drafts (plain decoding) sets ``never_drafts = True``; a batching
engine then does not price its requests' draft tokens. Both attributes are optional
(absent: False) and read through :func:`uses_hidden_states` and :func:`never_drafts`.
What the ``hvd`` policy needs of a model drafter beyond these calls (its priors,
its pending context, the thresholds its ``propose`` honours) is declared by
:class:`~hvd_agents.drafters.model.protocol.ModelDrafter`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar, runtime_checkable

import torch

from hvd_agents.policy.cost import CostModel
from hvd_agents.policy.features import DraftFeatures
from hvd_agents.structure import PromptStructure

_EMPTY_FEATURES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class Draft:
    """Tokens proposed to follow the current context, newest-last.

    Attributes:
        token_ids: the proposed new tokens only (not the context).
        probs: the drafter's distribution q for each proposed token,
            ``[len(token_ids), vocab]``, or ``None`` for a deterministic draft (a
            cache copy), which verification treats as q = point mass.
        score: the drafter's own confidence (e.g. a match length); not used for
            correctness.
        source: where the draft came from (``"pld"``, ``"suffix"``, ...), for stats.
        features: what the drafter knows about its draft, typed (a
            :class:`~hvd_agents.policy.features.DraftFeatures` such as the cache
            drafter's ``CacheDraftFeatures``, which the payoff predictor reads), or a
            name -> value mapping from a drafter without a typed record; step records
            carry them by name (:func:`~hvd_agents.policy.features.feature_record`).
        parents: None for a chain (each token follows the one before it). For a
            tree of alternatives, the parent of each token: the index of an
            earlier token, or -1 for a token that follows the context directly.
            The target verifies every token in one forward and accepts the path
            it would have produced itself. Trees are deterministic drafts
            (``probs`` None); their first tokens, up to where ``parents`` first
            departs from a chain, are the main branch.
        survival: the drafter's estimate, made before verification, of the chance
            that the target accepts the main branch's first 1, 2, ... tokens (a
            non-increasing sequence, at most one per main-branch token), or None
            when it has none. A batching engine shares a step's rows among requests
            by it (:func:`hvd_agents.engine.batch.allocate`).

    Example (main branch ``7 8 9``, and ``5`` as an alternative to ``8``)::

        Draft((7, 8, 9, 5), parents=(-1, 0, 1, 0))
    """

    token_ids: tuple[int, ...] = ()
    probs: torch.Tensor | None = None
    score: float = 0.0
    source: str = "none"
    features: DraftFeatures | Mapping[str, float] = field(default_factory=lambda: _EMPTY_FEATURES)
    parents: tuple[int, ...] | None = None
    survival: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.survival is not None and len(self.survival) > self.main_length:
            object.__setattr__(self, "survival", tuple(self.survival[: self.main_length]))
        if self.parents is None:
            return
        if len(self.parents) != len(self.token_ids):
            raise ValueError(f"a tree draft needs one parent per token: {len(self.parents)} for {len(self.token_ids)}")
        if self.probs is not None:
            raise ValueError("a tree draft must be deterministic (probs None)")
        seen: set[tuple[int, int]] = set()
        for i, (parent, token) in enumerate(zip(self.parents, self.token_ids)):
            if not -1 <= parent < i:
                raise ValueError(f"token {i} of a tree draft has parent {parent}: it must be -1 or an earlier token")
            if (parent, token) in seen:
                raise ValueError(f"token {i} of a tree draft repeats a sibling ({token}) under parent {parent}")
            seen.add((parent, token))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_tree(self) -> bool:
        """Whether some token is not the child of the one before it."""
        return self.parents is not None and any(p != i - 1 for i, p in enumerate(self.parents))

    @property
    def main_length(self) -> int:
        """How many leading tokens form a chain (all of them for a chain draft)."""
        if self.parents is None:
            return len(self.token_ids)
        for i, parent in enumerate(self.parents):
            if parent != i - 1:
                return i
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Each token's depth: 1 for a token that follows the context directly."""
        if self.parents is None:
            return list(range(1, len(self.token_ids) + 1))
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    def path(self, tokens: Sequence[int]) -> list[int]:
        """The indices of the draft tokens that ``tokens`` follow from the root, in order.

        For a chain this is ``range(common prefix length)``. Verification accepts
        the path of the target's own tokens; a drafter can recover which tokens
        were accepted from ``DraftOutcome.new_token_ids`` the same way.
        """
        if self.parents is None:
            n = 0
            for drafted, token in zip(self.token_ids, tokens):
                if drafted != token:
                    break
                n += 1
            return list(range(n))
        children = self.children()
        path: list[int] = []
        node = -1
        for token in tokens:
            child = children.get(node, {}).get(token)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def children(self) -> dict[int, dict[int, int]]:
        """``{parent: {token: index}}`` over the tree (a chain is a tree too)."""
        parents = self.parents if self.parents is not None else tuple(range(-1, len(self.token_ids) - 1))
        out: dict[int, dict[int, int]] = {}
        for i, (parent, token) in enumerate(zip(parents, self.token_ids)):
            out.setdefault(parent, {})[token] = i
        return out

    def truncated(self, length: int) -> Draft:
        """Return this draft cut to its first ``length`` tokens (itself if already short enough).

        A tree keeps a tree: every token's parent comes before it.
        """
        if length >= len(self.token_ids):
            return self
        probs = None if self.probs is None else self.probs[:length]
        parents = None if self.parents is None else self.parents[:length]
        return Draft(self.token_ids[:length], probs, self.score, self.source, self.features, parents, self.survival)

    def main_branch(self) -> Draft:
        """The draft without its alternatives (its leading chain)."""
        if not self.is_tree:
            return self
        n = self.main_length
        return Draft(self.token_ids[:n], None, self.score, self.source, self.features, survival=self.survival)


class GrammarView(Protocol):
    """What a drafter may ask of a request's constraint (the engine's grammar state implements it)."""

    def allows(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts from where the output stands."""

    def forced_tokens(self) -> tuple[int, ...]:
        """The tokenizer's own tokens of the text the grammar forces next (empty: nothing is forced)."""


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may read when proposing.

    Attributes:
        req_id: the request being decoded.
        token_ids: prompt followed by every token emitted so far; the draft
            continues after its last element. A read-only view: do not mutate.
        num_prompt_tokens: how many of ``token_ids`` are the prompt.
        hidden_states: the target's last-layer hidden states ``[n, hidden]`` for
            positions ``hidden_start .. hidden_start + n - 1`` of ``token_ids``
            (every token the target has processed: all but the last), or None.
            Given only to drafters whose ``uses_hidden_states`` attribute is True;
            positions before ``hidden_start`` came from a reused prefix KV and
            have none. Read-only, and valid only during the ``propose`` call.
        hidden_start: the position of the first row of ``hidden_states``.
        temperature: the request's sampling temperature (0 = greedy); a model
            drafter may sample its draft from a tempered q (and report that q).
        generator: the request's RNG, for drafters that sample (reproducible
            with the request's seed).
        step_cost: in a batched step, what verifying ``d`` draft tokens costs this
            request, in units of its share of the step (a batching engine sets it for
            greedy requests from the runner's cost over the batch's rows); None: the
            drafter prices verification with its own profile, as for a lone request.
        step_share: this request's share of the step, in plain single-request steps
            (1 alone), to price the drafter's own forwards in the same units.
        grammar: the request's constraint where it stands now (:class:`GrammarView`), or None.
            The engine cuts every draft at its first token the grammar refuses, so a
            drafter needs it only to draft the text the grammar forces.
    """

    req_id: str
    token_ids: Sequence[int]
    num_prompt_tokens: int
    hidden_states: torch.Tensor | None = None
    hidden_start: int = 0
    temperature: float = 0.0
    generator: torch.Generator | None = None
    step_cost: CostModel | None = None
    step_share: float = 1.0
    grammar: GrammarView | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(frozen=True)
class DraftOutcome:
    """The result of verifying one draft.

    Attributes:
        req_id: the request.
        draft: the draft that was verified (possibly empty).
        num_accepted: how many leading draft tokens the target accepted.
        new_token_ids: the tokens appended to the context this step: the accepted
            draft prefix followed by one token from the target (recovered or bonus).
        target_logprob: the target's log-probability of the last token it emitted
            this step (from the verification logits; None when not reported).
        target_entropy: the entropy (nats) of the target's distribution at that token.
        verify_s: seconds the engine spent verifying the draft (the target's forward,
            acceptance and KV rollback), measured by the engine; 0 when not measured.
            Drafting and whatever the stream's consumer does between steps are not in it.
    """

    req_id: str
    draft: Draft
    num_accepted: int
    new_token_ids: tuple[int, ...]
    target_logprob: float | None = None
    target_entropy: float | None = None
    verify_s: float = 0.0


Outcome = DraftOutcome  # the earlier name, kept for existing imports


@runtime_checkable
class Drafter(Protocol):
    """The protocol every drafter implements (see the module docstring)."""

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        """Begin a request whose context is ``prompt_ids`` (typed by ``structure`` when known)."""

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """Propose at most ``k`` tokens to follow ``ctx.token_ids`` (``k >= 1``)."""

    def observe(self, outcome: DraftOutcome) -> None:
        """Learn the verification outcome; ``outcome.new_token_ids`` extend the context."""

    def stop(self, req_id: str) -> None:
        """End the request and release its state. Must be safe to call twice."""


def uses_hidden_states(drafter: Drafter) -> bool:
    """Whether ``drafter`` drafts from the target's hidden states (its optional ``uses_hidden_states``)."""
    return bool(getattr(drafter, "uses_hidden_states", False))


def never_drafts(drafter: Drafter) -> bool:
    """Whether ``drafter`` never proposes a token (its optional ``never_drafts``), so pricing drafts is moot."""
    return bool(getattr(drafter, "never_drafts", False))


class NoDrafter:
    """Plain autoregressive decoding: never drafts.

    Example:
        >>> NoDrafter().propose(DraftContext("r", [1, 2, 3], 3), k=8) == Draft()
        True
    """

    never_drafts = True

    def start(self, req_id: str, prompt_ids: Sequence[int], structure: PromptStructure | None = None) -> None:
        del req_id, prompt_ids, structure

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        del ctx, k
        return Draft()

    def observe(self, outcome: DraftOutcome) -> None:
        del outcome

    def stop(self, req_id: str) -> None:
        del req_id


State = TypeVar("State")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    Example:
        >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
        2
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def started(requests: Mapping[str, State], req_id: str, drafter: str, call: str) -> State:
    """The state a drafter keeps for ``req_id``: lifecycle misuse (``call`` for a request that
    was never started, or already stopped) raises instead of drafting nothing silently.

    Raises:
        ValueError: ``req_id`` has no state; the message names the drafter, the call and the request.
    """
    state = requests.get(req_id)
    if state is None:
        raise ValueError(f"{drafter}: {call} for request {req_id!r}, which is not started (or already stopped): "
                         f"call start({req_id!r}, prompt_ids) first")
    return state
