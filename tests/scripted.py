"""Scripted engines for adapter tests: ``stream`` replays chosen text pieces (one script, or the next on each call)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from hvd_agents import Engine, GenerationParams, RequestStats, TokenEvent


class ScriptedEngine(Engine):
    """An Engine whose ``stream`` replays ``pieces`` (one event each) and records its calls."""

    def __init__(self, model, tokenizer, pieces, finish: str = "stop", delay: float = 0.0) -> None:
        # it runs no model, so any prompt fits: a window past the tiny model's 512 tokens
        super().__init__(model, tokenizer, eos_token_ids=(), context_window=1 << 16)
        self.pieces = list(pieces)
        self.finish = finish
        self.delay = delay
        self.requests: list[tuple[list[int], GenerationParams, Any]] = []
        self.emitted = 0  # events yielded, over all requests
        self.closed = 0  # event iterators finished or closed
        self.completed = 0  # event iterators run to their final event

    def stream(self, prompt_ids, params=None, *, req_id=None, structure=None) -> Iterator[TokenEvent]:
        self.requests.append((list(prompt_ids), params, structure))
        return self._events(len(prompt_ids))

    def _events(self, prompt_tokens: int) -> Iterator[TokenEvent]:
        try:
            total = 0
            for index, piece in enumerate(self.pieces):
                if self.delay:
                    time.sleep(self.delay)
                ids = tuple(self.tokenizer(piece, add_special_tokens=False).input_ids)
                total += len(ids)
                last = index == len(self.pieces) - 1
                stats = RequestStats(prompt_tokens=prompt_tokens, new_tokens=total, steps=index + 1) if last else None
                self.emitted += 1
                yield TokenEvent(ids, piece, self.finish if last else None, stats)
            self.completed += 1
        finally:
            self.closed += 1


class ScriptsEngine(ScriptedEngine):
    """A scripted engine that replays the next script on each call (the last one again once they run out)."""

    def __init__(self, model, tokenizer, scripts: list[list[str]], finish: str = "stop") -> None:
        super().__init__(model, tokenizer, scripts[0], finish)
        self.scripts = list(scripts)

    def stream(self, prompt_ids, params=None, *, req_id=None, structure=None) -> Iterator[TokenEvent]:
        self.pieces = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        return super().stream(prompt_ids, params, req_id=req_id, structure=structure)
