"""Finished requests' context indexes, kept for the next request whose prompt continues one.

An agent's next call renders the whole conversation again: its prompt is the previous
call's prompt and reply, then the new messages. The cache drafter indexes each prompt
when its request starts (:meth:`~hvd_agents.drafters.cache.suffix.SuffixDrafter.start`),
a few milliseconds for every 10,000 tokens, most of them the same tokens as the index
of the call before, which held exactly the previous prompt and reply when it stopped.
:class:`KeptIndexes` keeps the last few finished requests' indexes; a new prompt that
agrees with one of them over most of its length takes it, cut back to where they agree
(:meth:`~hvd_agents.drafters.cache.ngram_index.NgramIndex.truncate`) and extended with
the rest. The index is then the one a fresh build of the prompt gives, entry for entry,
so drafts do not change.

An index is handed to one request only (it is removed from the kept ones), and one is
taken only where cutting it back is cheaper than building anew: at most
:data:`MAX_FORGOTTEN` of its tokens are forgotten, and it covers at least half of the
new prompt.

Worked example: a request over ``prompt`` that replied ``reply`` stops; the next prompt
is ``prompt + reply' + new`` where ``reply'`` re-renders ``reply`` with one token
changed at its end: the kept index is cut back to ``len(prompt) + len(reply) - 1``
tokens and ``reply'[-1:] + new`` is appended.
"""

from __future__ import annotations

from collections.abc import Sequence

from hvd_agents.drafters.cache.ngram_index import NgramIndex

KEPT = 4
"""Finished requests' indexes kept (the most recent; one per conversation in flight is what an agent needs)."""

MAX_FORGOTTEN = 256
"""Most indexed tokens a kept index may forget to serve a new prompt (each costs a few hash computations, a
fresh build about one vectorised one per prompt token)."""


class KeptIndexes:
    """The last :data:`KEPT` finished requests' indexes (see the module docstring).

    Attributes:
        reused_tokens: prompt tokens served from a kept index so far, rather than indexed anew.
    """

    def __init__(self, kept: int = KEPT) -> None:
        if kept < 0:
            raise ValueError(f"kept must be >= 0, got {kept}")
        self.kept = kept
        self.reused_tokens = 0
        self._indexes: list[NgramIndex] = []  # oldest first

    def keep(self, index: NgramIndex) -> None:
        """Keep a finished request's index (its prompt and reply), dropping the oldest beyond :attr:`kept`."""
        if self.kept == 0:
            return
        self._indexes.append(index)
        del self._indexes[: -self.kept]

    def index_for(self, prompt_ids: Sequence[int]) -> NgramIndex:
        """The index of ``prompt_ids``: a kept one that agrees with it over most of its length, cut back and
        extended, or a new one."""
        best, agreed = None, 0
        for i, index in enumerate(self._indexes):
            agreement = index.agreement(prompt_ids)
            if agreement > agreed and len(index) - agreement <= MAX_FORGOTTEN and 2 * agreement >= len(prompt_ids):
                best, agreed = i, agreement
        if best is None:
            index = NgramIndex()
            index.extend(prompt_ids)
            return index
        index = self._indexes.pop(best)
        index.truncate(agreed)
        index.append_many(prompt_ids[agreed:])
        self.reused_tokens += agreed
        return index
