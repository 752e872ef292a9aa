"""Stop strings matched on streamed text.

Contract:

* :class:`StopStringMatcher` is fed text deltas (as produced by the incremental
  detokenizer) and returns the text that is safe to emit now. It holds back the
  longest suffix of the pending text that is a prefix of some stop string, since
  that text may turn out to be the start of a stop string.
* A stop string matches as soon as it is complete, possibly across many deltas. The
  first completed match wins: the one that ends earliest in the text; among matches
  ending at the same position, the one that starts earliest. This makes the result
  independent of how the text is chunked: the emitted text is always
  ``text[:start of that match]``, and the stop string itself is never returned.
* After a stop, :meth:`StopStringMatcher.feed` returns ``("", True)`` and
  :meth:`StopStringMatcher.flush` returns ``""``. When generation ends without a
  stop, ``flush()`` returns the held-back text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hvd_agents.errors import InvalidRequestError

logger = logging.getLogger(__name__)


class StopStringMatcher:
    """Streaming matcher for a set of stop strings.

    Args:
        stops: the stop strings (a bare ``str`` is one stop string). An empty
            sequence matches nothing and holds nothing back.

    Raises:
        InvalidRequestError: a stop string is empty or not a ``str``.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        stops = (stops,) if isinstance(stops, str) else tuple(stops)
        for index, stop in enumerate(stops):
            if not isinstance(stop, str):
                raise InvalidRequestError(f"stop string {index} must be a str, got {type(stop).__name__}")
            if not stop:
                raise InvalidRequestError(f"stop string {index} is empty")
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(stops))  # dedupe, keep order
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._pending = ""
        self._stopped = False
        self._matched: str | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings, without duplicates, in the order given."""
        return self._stops

    @property
    def stopped(self) -> bool:
        """Whether a stop string has matched."""
        return self._stopped

    @property
    def matched(self) -> str | None:
        """The stop string that matched, or None."""
        return self._matched

    @property
    def pending(self) -> str:
        """The text currently held back."""
        return self._pending

    def feed(self, text_delta: str) -> tuple[str, bool]:
        """Add a text delta.

        Args:
            text_delta: the next piece of generated text (may be empty).

        Returns:
            ``(text, stopped)``: the text safe to emit now and whether a stop string
            has matched. On a match, ``text`` is everything before the match that
            was not emitted yet; the rest of the input is discarded.
        """
        if self._stopped:
            return "", True
        pending = self._pending + text_delta
        match = self._first_match(pending)
        if match is not None:
            start, stop = match
            self._stopped = True
            self._matched = stop
            self._pending = ""
            logger.debug("stop string %r matched", stop)
            return pending[:start], True
        hold = self._held_suffix_length(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold], False

    def flush(self) -> str:
        """Return the held-back text at the end of generation (``""`` after a stop)."""
        if self._stopped:
            return ""
        text, self._pending = self._pending, ""
        return text

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """The (start, stop string) of the match ending earliest (then starting earliest), if any."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = text.find(stop)
            if start < 0:
                continue
            key = (start + len(stop), start, stop)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _held_suffix_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for length in range(min(self._max_hold, len(text)), 0, -1):
            suffix = text[len(text) - length :]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0
