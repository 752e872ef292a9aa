"""The GPU benchmark's bitwise checks: speculative decoding equals plain decoding bit for bit on the static runner.

:func:`teacher_forced_check` compares rows of logits, teacher-forced (every row is compared,
whatever the model would have generated), between one-row steps and one forward over them all,
chains and trees, for the default (bitwise) runner, the single-bucket mode and the per-bucket
runner (the control). :func:`single_bucket_check` decodes with planted and adversarial drafts and
compares the output with plain decoding. ``hvd-agents bench-gpu`` (:mod:`hvd_agents.bench.gpu`)
reports both.
"""

from __future__ import annotations

import torch

from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.runtime.static import Buckets, StaticRunner

TEACHER_FORCED_STEPS = 16


def single_bucket(positions: int, rows: int = 17) -> Buckets:
    """The single-bucket mode's buckets for forwards up to ``positions`` (a power of two from 256)."""
    capacity = 256
    while capacity < positions + rows:
        capacity *= 2
    return Buckets.single(rows, capacity)


def teacher_forced_rows_equal(runner: StaticRunner, ids: list[int], tokens: list[int]) -> int:
    """Of ``tokens`` after a prefill of ``ids``, how many rows of logits are bitwise equal between one-row steps
    and one forward over them all.

    Teacher-forced, so every row is compared, whatever the model would have generated: a greedy comparison
    on random weights compares streams of one repeated token and passes whatever the arithmetic does.
    """
    outs = []
    for together in (False, True):
        kv = runner.new_kv()
        try:
            runner.forward(kv, ids, logits_to_keep=1)
            steps = [runner.forward(kv, tokens)] if together else [runner.forward(kv, [t]) for t in tokens]
            outs.append(torch.cat(steps))
        finally:
            kv.release()
    one_by_one, together = outs
    return sum(torch.equal(x, y) for x, y in zip(one_by_one, together))


def teacher_forced_tree_equal(runner: StaticRunner, ids: list[int], tokens: list[int]) -> int:
    """Of ``tokens`` after ``ids``, how many rows of logits are bitwise equal between one-row steps and the same
    tokens as one path of a tree forward, each path node with a branch of another token beside it."""
    vocab = runner.vocab_size
    draft, parents, path_rows, last = [], [], [], -1
    for t in tokens:
        draft += [(t + 1) % vocab, t]  # a branch, then the path's next token, both children of the path so far
        parents += [last, last]
        last = len(draft) - 1
        path_rows.append(len(draft))  # row = draft index + 1
    outs = []
    for tree in (False, True):
        kv = runner.new_kv()
        try:
            runner.forward(kv, ids[:-1])
            if tree:
                out = runner.forward(kv, [ids[-1], *draft], parents=parents)
                outs.append(out[[0, *path_rows]])
            else:
                outs.append(torch.cat([runner.forward(kv, [t]) for t in [ids[-1], *tokens]]))
        finally:
            kv.release()
    steps, tree = outs
    return sum(torch.equal(x, y) for x, y in zip(steps[1:], tree[1:]))  # row 0 is the root's, not a draft token's


def teacher_forced_check(model: torch.nn.Module, ids: list[int]) -> dict[str, str]:
    """:func:`teacher_forced_rows_equal` over random tokens, as ``"equal/steps"``: the default (bitwise) runner,
    chains and trees (must be all), single-bucket mode (dense attention: chains must be all), and the per-bucket
    runner (the control: row and KV shapes differ, so rows may differ)."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    tokens = torch.randint(0, vocab, (TEACHER_FORCED_STEPS,), generator=torch.Generator().manual_seed(0)).tolist()
    bitwise = StaticRunner(model, warm_up=False, slots=1)
    runners = {"bitwise": bitwise,
               "single": StaticRunner(model, buckets=single_bucket(len(ids) + len(tokens)), warm_up=False, slots=1),
               "buckets": StaticRunner(model, bitwise=False, warm_up=False, slots=1)}
    checks = {name: f"{teacher_forced_rows_equal(r, ids, tokens)}/{len(tokens)}" for name, r in runners.items()}
    checks["bitwise tree"] = f"{teacher_forced_tree_equal(bitwise, ids, tokens)}/{len(tokens)}"
    checks["buckets tree"] = f"{teacher_forced_tree_equal(runners['buckets'], ids, tokens)}/{len(tokens)}"
    return checks


def single_bucket_check(model: torch.nn.Module, ids: list[int], max_new: int, *, bitwise: bool = False) -> bool:
    """Whether speculation with planted and adversarial drafts equals plain decoding bit for bit, single bucket
    (or with ``bitwise`` the default bitwise runner)."""
    from hvd_agents.drafters import Draft

    runner = (StaticRunner(model, warm_up=False, slots=1) if bitwise else
              StaticRunner(model, buckets=single_bucket(len(ids) + max_new), warm_up=False, slots=1))
    engine = Engine(model, eos_token_ids=(), draft_head=None, runner=runner, prefix_cache_bytes=0)
    params = GenerationParams(max_new_tokens=max_new, method="ar", stop_token_ids=())
    reference = engine.generate(ids, params).token_ids

    class Planted:  # the reference continuation, cut short every third step with a wrong token
        def __init__(self) -> None:
            self.step = 0

        def start(self, *args) -> None:
            self.step = 0

        def propose(self, ctx, k: int) -> Draft:
            self.step += 1
            pos = ctx.num_output_tokens
            tokens = list(reference[pos : pos + k])
            if self.step % 3 == 0 and tokens:
                tokens[-1] = (tokens[-1] + 1) % runner.vocab_size
            return Draft(tuple(tokens), source="planted")

        def observe(self, outcome) -> None:
            pass

        def stop(self, req_id: str) -> None:
            pass

    engine.add_drafter("planted", Planted())
    got = engine.generate(ids, GenerationParams(max_new_tokens=max_new, method="planted", num_draft_tokens=16,
                                                stop_token_ids=()))
    return got.token_ids == reference
