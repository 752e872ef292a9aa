"""Kernel benchmark (``hvd-agents bench-kernels``): the CPU linear-layer kernels side by side, one run.

The same model is loaded once per kernel available here: the model's own forward
with PyTorch's ``dense`` ``nn.Linear`` layers, oneDNN's ``packed`` layers or the
native float32 ``row`` kernel (:mod:`hvd_agents.runtime.cpu.kernels`), and ``quant``,
the native forward over the GGUF file's own blocks
(:mod:`hvd_agents.runtime.cpu.runner`; GGUF models only). First one layer's
product on every kernel that could hold quantized weights
(:mod:`hvd_agents.bench.layer_kernels`), then two parts, interleaved so every
kernel sees the same machine state:

1. **Forward cost**: one forward of ``1 + d`` new tokens over a real context, for
   ``d`` draft tokens in :data:`DRAFT_LENGTHS`: milliseconds (minimum over repeats)
   and the cost relative to the same kernel's plain step (``verify(d)``).
2. **Decoding**: ``ar`` and ``hvd`` on the agent-style prompts of ``bench`` and
   the chat prompts of ``bench-model``, greedy, no prefix reuse: tokens/s of each,
   each kernel against dense, and how many outputs are identical to dense's.
"""

from __future__ import annotations

import logging
import time

import torch

from hvd_agents.bench.live import Tally, _cache_runner, _engine_runner, _Item, _timed
from hvd_agents.bench.prompts import agent_prompts, chat_prompts
from hvd_agents.chat.render import encode_prompt
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.runtime.loading import load_model

logger = logging.getLogger(__name__)
DRAFT_LENGTHS = (0, 1, 2, 3, 4, 8, 16)
KERNELS = ("dense", "packed", "row", "quant")


def available_kernels(gguf: bool = True) -> tuple[str, ...]:
    """The kernels of :data:`KERNELS` that run here (``row`` and ``quant`` need their native kernels,
    ``packed`` oneDNN, ``quant`` a GGUF model)."""
    from hvd_agents.runtime.cpu import native_forward
    from hvd_agents.runtime.cpu import row_linear as native_linear

    usable = {"dense": True, "packed": torch.backends.mkldnn.is_available(), "row": native_linear.available(),
              "quant": gguf and native_forward.available()}
    return tuple(kernel for kernel in KERNELS if usable[kernel])


def _load(model: str | None, kernel: str):
    if kernel == "quant":
        return load_model(model, device="cpu", cpu_weights="gguf")
    return load_model(model, device="cpu", cpu_linear=kernel, cpu_weights="none")


def _forward_ms(runner, context: list[int], d: int, repeats: int) -> float:
    """Minimum milliseconds of one cached forward of ``1 + d`` tokens after ``context`` on ``runner``."""
    kv = runner.new_kv()
    best = float("inf")
    with torch.inference_mode():
        runner.forward(kv, context, logits_to_keep=1)
        new = context[-1 - d :][::-1]
        for _ in range(repeats):
            start = time.perf_counter()
            runner.forward(kv, new)
            best = min(best, time.perf_counter() - start)
            kv.rollback(len(context))
    return best * 1e3


def run_kernel_benchmark(
    model: str | None = None, max_new_tokens: int = 96, rounds: int = 2, repeats: int = 8
) -> dict[str, dict[str, Tally]]:
    """Print the tables (one layer's kernels, forward cost, decoding); returns the decoding tallies by kernel,
    then method."""
    from hvd_agents.bench.layer_kernels import run_layer_benchmark

    run_layer_benchmark()
    from hvd_agents.runtime.loading import _resolve_source

    kernels = available_kernels(gguf=_resolve_source(model)[0] == "gguf")
    models = {kernel: _load(model, kernel) for kernel in kernels}
    loaded = models["dense"]
    tokenizer = loaded.tokenizer
    items = [_Item(p, encode_prompt(tokenizer, p.messages, p.tools)) for p in agent_prompts() + chat_prompts()]
    context = list(max((item.ids for item in items), key=len))

    engines = {kernel: Engine.from_loaded(lm, draft_head="auto") for kernel, lm in models.items()}
    ms = {kernel: {d: float("inf") for d in DRAFT_LENGTHS} for kernel in kernels}
    for round_index in range(2):
        for d in DRAFT_LENGTHS:
            for kernel in kernels if round_index % 2 == 0 else reversed(kernels):
                ms[kernel][d] = min(ms[kernel][d], _forward_ms(engines[kernel].runner, context, d, repeats))
    print(f"forward of 1 + d tokens after {len(context)} tokens of context (ms, minimum of {2 * repeats}; "
          f"verify(d) = ms / the same kernel's ms at d=0):")
    print(f"{'d':>4}" + "".join(f"{kernel + ' ms':>11}{kernel + ' verify(d)':>17}" for kernel in kernels))
    for d in DRAFT_LENGTHS:
        print(f"{d:>4}" + "".join(f"{ms[k][d]:>11.1f}{ms[k][d] / ms[k][0]:>17.2f}" for k in kernels))

    params = GenerationParams(max_new_tokens=max_new_tokens, reuse_prefix=False)
    runners = {}
    for kernel, engine in engines.items():
        runners[(kernel, "ar")] = _engine_runner(engine, GenerationParams(max_new_tokens=max_new_tokens,
                                                                          method="ar", reuse_prefix=False))
        runners[(kernel, "hvd")] = _cache_runner(engine, params)
    for run in runners.values():  # warm-up
        run(items[0])
    tallies = {key: Tally() for key in runners}
    order = list(runners)
    for round_index in range(rounds):
        for i, item in enumerate(items):
            logger.info("round %d, prompt %d/%d", round_index + 1, i + 1, len(items))
            for key in order if round_index % 2 == 0 else reversed(order):
                _timed(runners[key], item, tallies[key])
    runs = len(items) * rounds
    print(f"\ndecoding: {runs} runs ({len(agent_prompts())} agent + {len(chat_prompts())} chat prompts "
          f"x {rounds} rounds), greedy, max_new_tokens={max_new_tokens}")
    others = [kernel for kernel in kernels if kernel != "dense"]
    print(f"{'method':<8}" + "".join(f"{kernel + ' tok/s':>13}" for kernel in kernels)
          + "".join(f"{k + '/dense':>14}{k + ' = dense':>16}" for k in others))
    for method in ("ar", "hvd"):
        dense = tallies[("dense", method)]
        line = f"{method:<8}" + "".join(f"{tallies[(k, method)].tokens_per_s:>13.1f}" for k in kernels)
        for k in others:
            same = sum(a == b for a, b in zip(dense.outputs, tallies[(k, method)].outputs))
            line += f"{tallies[(k, method)].tokens_per_s / dense.tokens_per_s:>13.2f}x{f'{same}/{runs}':>16}"
        print(line)
    for kernel in kernels:
        same = sum(a == b for a, b in zip(tallies[(kernel, "ar")].outputs, tallies[(kernel, "hvd")].outputs))
        speedup = tallies[(kernel, "hvd")].tokens_per_s / tallies[(kernel, "ar")].tokens_per_s
        print(f"{kernel}: hvd/ar {speedup:.2f}x, hvd output = ar output in {same}/{runs}")
    return {kernel: {method: tallies[(kernel, method)] for method in ("ar", "hvd")} for kernel in kernels}
