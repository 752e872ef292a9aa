"""Prompt structure registered by clients, for a proposer running inside vLLM.

A vLLM request carries token ids, not the structure of its prompt, and the proposer
runs in vLLM's engine process, out of the client's reach. So clients write what the
prompt-structure analyzer (:func:`hvd_agents.chat.analyzer.analyze`) found, one JSON
line per prompt, to a file that the proposer reads as it grows
(:class:`StructureFeed`, named by ``HVD_VLLM_STRUCTURE``):

* its spans (system prompt, tool schemas, turns, tool outputs) and the tool-call
  skeletons go into the proposer's cross-request store, so every later request can
  copy from them, whatever its prompt;
* its prompt's digest (:func:`digest`) lets the proposer type the tokens of the request
  whose prompt it is, and file that request's output under the prompt's session.

A line is ``{"session_id": ..., "spans": [[start, end, kind], ...],
"extra": [[[token ids], kind], ...], "prompt_ids": [...]}``; a line that does not parse
is skipped with a warning naming the file and the line.

Example (client side, with the served model's tokenizer)::

    structure = analyze(tokenizer, messages, tools)
    StructureFile("/srv/hvd/structure.jsonl").register(structure)
    llm.generate({"prompt_token_ids": list(structure.prompt_ids)}, params)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hvd_agents.structure import PromptStructure, SpanKind, TypedSpan

logger = logging.getLogger(__name__)
REMEMBERED_PROMPTS = 4096  # prompt structures kept for typing requests, the most recent first


def structure_to_json(structure: PromptStructure) -> dict[str, Any]:
    """One line of the structure file, as a JSON-ready dict (see the module docstring)."""
    return {
        "session_id": structure.session_id,
        "prompt_ids": list(structure.prompt_ids),
        "spans": [[span.start, span.end, span.kind.value] for span in structure.spans],
        "extra": [[list(ids), kind.value] for ids, kind in structure.extra],
    }


def structure_from_json(data: dict[str, Any]) -> PromptStructure:
    """The structure a line holds.

    Raises:
        KeyError, TypeError, ValueError: the line is not one :func:`structure_to_json` writes.
    """
    prompt = tuple(int(t) for t in data["prompt_ids"])
    spans = tuple(TypedSpan(int(s), int(e), SpanKind(k)) for s, e, k in data["spans"])
    extra = tuple((tuple(int(t) for t in ids), SpanKind(k)) for ids, k in data["extra"])
    session = data.get("session_id")
    return PromptStructure(prompt, spans, None if session is None else str(session), extra)


def digest(prompt_ids: Sequence[int] | np.ndarray) -> str:
    """SHA-256 (hex) of a prompt's token ids, as the client and the proposer both compute it.

    Example:
        >>> digest([1, 2]) == digest(np.array([1, 2], dtype=np.int32)) != digest([1, 3])
        True
    """
    return hashlib.sha256(np.asarray(prompt_ids, dtype=np.int64).tobytes()).hexdigest()


class StructureFile:
    """The client's side: appends prompt structures to the file the proposer reads.

    Args:
        path: the file (created when missing); the same path as the server's ``HVD_VLLM_STRUCTURE``.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def register(self, structure: PromptStructure) -> None:
        """Append one prompt's structure (one line, written whole so a reader never sees half of it).

        Raises:
            OSError: the file cannot be written.
        """
        line = json.dumps(structure_to_json(structure))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


class StructureFeed:
    """The proposer's side: the structures appended to the file since the last :meth:`poll`.

    Args:
        path: the file clients append to (it may not exist yet).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.offset = 0
        self.prompts: OrderedDict[str, PromptStructure] = OrderedDict()

    def poll(self) -> list[PromptStructure]:
        """Read the complete lines added since the last call (cheap when nothing was: one ``stat``)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # replaced or truncated: read it again from the start
            self.offset = 0
        if size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read(size - self.offset)
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += complete
        out = []
        for number, line in enumerate(data[:complete].splitlines(), start=1):
            structure = self._parse(line, number)
            if structure is not None:
                out.append(structure)
                key = digest(structure.prompt_ids)
                self.prompts[key] = structure
                self.prompts.move_to_end(key)
        while len(self.prompts) > REMEMBERED_PROMPTS:
            self.prompts.popitem(last=False)
        return out

    def structure_of(self, prompt_ids: np.ndarray) -> PromptStructure | None:
        """The registered structure of this exact prompt, if a client registered it."""
        return self.prompts.get(digest(prompt_ids)) if self.prompts else None

    def _parse(self, line: bytes, number: int) -> PromptStructure | None:
        try:
            return structure_from_json(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s: skipping unreadable structure line %d of those read this time: %s",
                           self.path, number, exc)
            return None
