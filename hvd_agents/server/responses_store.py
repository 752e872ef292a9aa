"""Stored responses for ``previous_response_id``: each turn's messages, in a bounded LRU.

A Responses API client may send only its new input with the id of the previous response;
the server then continues that conversation. :class:`ResponseStore` keeps, per stored
response, the turn it added (its input messages and the reply, as chat messages) and the
id of the response it continued, so a conversation of ``n`` turns is stored once, not
``n`` times: :meth:`ResponseStore.history` walks the chain back to its first turn.

Each turn is kept as compact JSON bytes, so what the store holds is what it counts:
at most ``max_bytes`` of turns (default 64 MiB) and ``max_entries`` responses, the least
recently used evicted first (reading a chain marks all its turns used, so a live
conversation keeps its history while abandoned ones go). That budget sits inside the
server's resident-memory margin (docs/server.md); a chain whose older turn was evicted
answers 400 ``previous_response_not_found`` naming that turn, as OpenAI does for an
unknown id.

Example::

    store = ResponseStore()
    store.put("resp_1", None, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    store.history("resp_1")   # the two messages
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.server.errors import APIError, invalid

# 64 MiB of stored turns: some 16 million tokens of conversation text, far beyond what the
# clients of one local server keep alive, and small beside the prefix cache's 1 GiB.
DEFAULT_MAX_BYTES = 64 << 20
# Responses kept at most, whatever their size (each entry costs ~200 bytes of bookkeeping).
DEFAULT_MAX_ENTRIES = 65536


@dataclass(frozen=True)
class StoredTurn:
    """One stored response: the response it continued and the messages its turn added (JSON)."""

    previous_id: str | None
    messages_json: bytes


class ResponseStore:
    """Stored responses by id, bounded by bytes and entries (least recently used evicted first).

    Args:
        max_bytes: the most bytes of stored turns.
        max_entries: the most stored responses.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_bytes < 1 or max_entries < 1:
            raise ValueError(f"max_bytes and max_entries must be positive, got {max_bytes} and {max_entries}")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._turns: OrderedDict[str, StoredTurn] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def stored_bytes(self) -> int:
        """Bytes of the turns held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._turns)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._turns

    def put(self, response_id: str, previous_id: str | None, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Store a response's turn; returns False when the turn alone is over the budget (not stored)."""
        data = json.dumps(list(messages), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if len(data) > self.max_bytes:
            return False
        with self._lock:
            old = self._turns.pop(response_id, None)
            if old is not None:
                self._bytes -= len(old.messages_json)
            self._turns[response_id] = StoredTurn(previous_id, data)
            self._bytes += len(data)
            while self._bytes > self.max_bytes or len(self._turns) > self.max_entries:
                _, evicted = self._turns.popitem(last=False)
                self._bytes -= len(evicted.messages_json)
        return True

    def history(self, response_id: str) -> list[dict[str, Any]]:
        """The messages of the conversation up to and including response ``response_id``.

        Raises:
            APIError: 400 ``previous_response_not_found`` when it, or a turn before it, is not stored.
        """
        chain: list[tuple[str, StoredTurn]] = []
        with self._lock:
            current: str | None = response_id
            while current is not None:
                turn = self._turns.get(current)
                if turn is None:
                    raise _not_found(response_id, current)
                chain.append((current, turn))
                current = turn.previous_id
            for stored_id, _ in reversed(chain):  # oldest first: the newest turn is the most recently used
                self._turns.move_to_end(stored_id)
        messages: list[dict[str, Any]] = []
        for _, turn in reversed(chain):
            messages.extend(json.loads(turn.messages_json))
        return messages


def _not_found(response_id: str, missing: str) -> APIError:
    if missing == response_id:
        message = f"Previous response with id {response_id!r} not found."
    else:
        message = (f"Previous response with id {response_id!r} continues {missing!r}, which is no longer stored "
                   "(the server keeps a bounded number of responses): send the whole conversation as input")
    return invalid(message, "previous_response_id", "previous_response_not_found")
