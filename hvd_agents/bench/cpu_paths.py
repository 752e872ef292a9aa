"""CPU path benchmark (``hvd-agents bench-paths``): the native forward on every instruction-set path this CPU runs.

One model is loaded once; its GGUF weights get a native forward (and a runner) on each
path (:mod:`hvd_agents.runtime.cpu.native_forward`), and every path is timed on the same
prompt in the same run, interleaved round by round:

1. **Step and verification**: a one-token step after ``context`` cached tokens
   (milliseconds, minimum over repeats) and ``verify(d)``, a forward of ``1 + d`` tokens
   over that step's cost, for ``d`` in :data:`DRAFT_LENGTHS`.
2. **Prefill**: prompts of :data:`PREFILL_LENGTHS` tokens from an empty cache, tokens/s.
3. **Bits**: whether every path's logits (prefill and steps) equal the ``avx2`` path's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.loading import load_model

DRAFT_LENGTHS = (1, 2, 4, 8, 16, 32, 64)
PREFILL_LENGTHS = (512, 3000)


@dataclass
class PathFigures:
    """One path's timings (seconds, minima over rounds) and its outputs."""

    step: float = float("inf")
    verify: dict[int, float] = field(default_factory=dict)
    prefill: dict[int, float] = field(default_factory=dict)
    logits: list[torch.Tensor] = field(default_factory=list)


def _timed(fn) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _round(runner, ids: list[int], context: int, repeats: int, figures: PathFigures, drafts: tuple[int, ...],
           prefills: tuple[int, ...]) -> None:
    """One round of every measurement on ``runner``; outputs kept on the first round."""
    first = not figures.logits
    kv = runner.new_kv()
    runner.forward(kv, ids[:context], logits_to_keep=1)
    for _ in range(repeats):
        seconds, out = _timed(lambda: runner.forward(kv, ids[context : context + 1]))
        figures.step = min(figures.step, seconds)
        kv.rollback(context)
    for d in drafts:
        seconds, out = _timed(lambda d=d: runner.forward(kv, ids[context : context + 1 + d]))
        figures.verify[d] = min(figures.verify.get(d, float("inf")), seconds)
        kv.rollback(context)
        if first:
            figures.logits.append(out)
    for n in prefills:
        seconds, out = _timed(lambda n=n: runner.forward(runner.new_kv(), ids[:n], logits_to_keep=1))
        figures.prefill[n] = min(figures.prefill.get(n, float("inf")), seconds)
        if first:
            figures.logits.append(out)


def run_path_benchmark(model: str | None = None, *, rounds: int = 2, repeats: int = 10, context: int = 512,
                       drafts: tuple[int, ...] = DRAFT_LENGTHS, prefills: tuple[int, ...] = PREFILL_LENGTHS,
                       loaded=None) -> dict[str, PathFigures]:
    """Print the table described in the module docstring; returns each path's figures.

    Args:
        model: what to load (the embedded model when None), unless ``loaded`` (anything with ``native`` and
            ``tokenizer``: a :class:`~hvd_agents.runtime.loading.LoadedModel`, an engine's ``target``) is given.
        rounds: rounds over all paths (minima are kept).
        repeats: plain steps timed per round.
        context: cached tokens before the step and the drafts.
        drafts: the draft lengths d of verify(d).
        prefills: the prompt lengths of the prefill rates.
    """
    loaded = loaded if loaded is not None else load_model(model, device="cpu", cpu_weights="gguf")
    native = loaded.native
    if native is None:
        raise ValueError("bench-paths needs a model on the native forward (a GGUF file of a supported architecture)")
    text = "The assistant calls get_weather(city) for each city the user names, then answers briefly. " * 200
    ids = loaded.tokenizer(text)["input_ids"]
    need = max(max(prefills), context + 1 + max(drafts))
    ids = (ids * (need // max(1, len(ids)) + 1))[:need]
    paths = native_forward.cpu_paths()
    weights = native.reload()
    runners = {path: QuantRunner(NativeModel(native.model, weights, native.context_window, path)) for path in paths}
    del weights
    figures = {path: PathFigures() for path in paths}
    with torch.inference_mode():
        for _ in range(rounds):
            for path in paths:
                _round(runners[path], ids, context, repeats, figures[path], drafts, prefills)
    threads = torch.get_num_threads()
    print(f"native forward by CPU path ({', '.join(paths)}; running: {native.path}), {threads} threads, "
          f"{rounds} rounds, context {context}")
    header = "path           step ms  " + "  ".join(f"v({d})" for d in drafts)
    header += "  " + "  ".join(f"prefill {n} tok/s" for n in prefills) + "  same bits as avx2"
    print(header)
    reference = figures[native_forward.REFERENCE].logits
    for path, f in figures.items():
        same = all(torch.equal(a, b) for a, b in zip(f.logits, reference))
        row = f"{path:<14} {f.step * 1e3:7.2f}  " + "  ".join(f"{f.verify[d] / f.step:5.2f}" for d in drafts)
        row += "  " + "  ".join(f"{n / f.prefill[n]:17.0f}" for n in prefills) + f"  {'yes' if same else 'NO'}"
        print(row)
    return figures
