"""A stand-in for vLLM's side of a custom proposer's call, without vLLM.

It keeps what vLLM's persistent input batch (``vllm/v1/worker/gpu_input_batch.py``,
vLLM 0.32) keeps and hands a ``custom_class`` proposer
(``gpu_model_runner.propose_draft_token_ids``)::

    drafter.propose(sampled_token_ids, input_batch.num_tokens_no_spec, input_batch.token_ids_cpu,
                    slot_mappings=slot_mappings)

* ``token_ids_cpu``: ``int32 [max_num_reqs, max_model_len]``, zero-initialised, each row the
  request's prompt then its output tokens;
* ``num_tokens_no_spec``: ``int32 [max_num_reqs]``, the row's token count;
* ``sampled_token_ids``: a list of Python int lists, one per row ``0 .. num_reqs - 1``: the
  accepted draft prefix plus the target's token, ``[]`` for a row whose prompt is still
  being prefilled in chunks.

and the step's order: requests that finished at the previous step leave the batch first and
the last rows move into the holes (``InputBatch.condense``); then the target verifies every
row's draft (greedy: the longest prefix equal to its own tokens, then its own next token);
then the proposer is called for the rows. The target is scripted: request ``r`` emits
``script[r]`` whatever is drafted, so its greedy output is known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class FakeRequest:
    req_id: str
    prompt: list[int]
    script: list[int]  # what the target emits, in order
    chunk: int | None = None  # prefill chunk size (None: the whole prompt in one step)
    prefilled: int = 0
    output: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)
    steps: int = 0  # target forwards after the prefill

    @property
    def done(self) -> bool:
        return len(self.output) >= len(self.script)


class FakeBatch:
    """vLLM's persistent batch as a custom proposer sees it (see the module docstring).

    Args:
        propose: the proposer's ``propose``.
        k: ``num_speculative_tokens``: drafts longer than this fail the test.
        max_num_reqs: rows of the token buffer.
        max_model_len: columns of the token buffer.
    """

    def __init__(self, propose: Callable[..., list[list[int]]], k: int, max_num_reqs: int = 4,
                 max_model_len: int = 256) -> None:
        self.propose = propose
        self.k = k
        self.max_model_len = max_model_len
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
        self.rows: list[FakeRequest] = []
        self.finished: list[FakeRequest] = []
        self.calls = 0

    def add(self, request: FakeRequest) -> None:
        """Add a request in the next free row: its whole prompt is written at once (InputBatch.add_request)."""
        row = len(self.rows)
        self.rows.append(request)
        self.token_ids_cpu[row] = 0
        self.token_ids_cpu[row, : len(request.prompt) + len(request.output)] = request.prompt + request.output
        self.num_tokens_no_spec[row] = len(request.prompt) + len(request.output)

    def remove(self, request: FakeRequest) -> FakeRequest:
        """Take a request out of the batch (finished, or not scheduled this step) and condense."""
        row = self.rows.index(request)
        last = len(self.rows) - 1
        if row != last:  # the last row moves into the hole, as InputBatch.condense does
            self.token_ids_cpu[row] = self.token_ids_cpu[last]
            self.num_tokens_no_spec[row] = self.num_tokens_no_spec[last]
            self.rows[row] = self.rows[last]
        self.rows.pop()
        request.draft = []  # vLLM drops a removed request's pending draft
        return request

    def swap(self, a: int, b: int) -> None:
        """Swap two rows (InputBatch.swap_states, as the scheduler's reordering does)."""
        self.token_ids_cpu[[a, b]] = self.token_ids_cpu[[b, a]]
        self.num_tokens_no_spec[[a, b]] = self.num_tokens_no_spec[[b, a]]
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]

    def step(self) -> list[list[int]]:
        """One engine step: drop finished requests, verify and sample every row, call the proposer."""
        for request in [r for r in self.rows if r.done]:
            self.finished.append(self.remove(request))
        sampled: list[list[int]] = []
        for row, request in enumerate(self.rows):
            sampled.append(self._sample(row, request))
        self.calls += 1
        drafts = self.propose(sampled, self.num_tokens_no_spec, self.token_ids_cpu, slot_mappings=None)
        assert isinstance(drafts, list) and len(drafts) == len(sampled)
        for request, draft in zip(self.rows, drafts):
            assert isinstance(draft, list) and all(type(t) is int for t in draft), draft
            assert len(draft) <= self.k, f"a draft of {len(draft)} tokens, more than num_speculative_tokens={self.k}"
            request.draft = [] if request.done else draft
        return drafts

    def run(self, requests: Sequence[FakeRequest], limit: int = 1000) -> list[FakeRequest]:
        """Add ``requests`` and step until all are finished."""
        for request in requests:
            self.add(request)
        while self.rows and limit:
            self.step()
            limit -= 1
        for request in list(self.rows):
            self.finished.append(self.remove(request))
        return self.finished

    def _sample(self, row: int, request: FakeRequest) -> list[int]:
        if request.prefilled < len(request.prompt):
            step = len(request.prompt) if request.chunk is None else request.chunk
            request.prefilled = min(len(request.prompt), request.prefilled + step)
            if request.prefilled < len(request.prompt):
                return []  # a partial prefill samples nothing
            new = [request.script[0]]
        else:
            request.steps += 1
            position = len(request.output)
            accepted = 0
            for drafted in request.draft:  # greedy verification against the scripted target
                if position + accepted >= len(request.script) - 1 or drafted != request.script[position + accepted]:
                    break
                accepted += 1
            new = request.script[position : position + accepted + 1]
        request.output.extend(new)
        n = int(self.num_tokens_no_spec[row])
        self.token_ids_cpu[row, n : n + len(new)] = new
        self.num_tokens_no_spec[row] = n + len(new)
        return list(new)
