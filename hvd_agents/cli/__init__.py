"""The ``hvd-agents`` command line.

Subcommands:

* ``generate``: one chat turn (or a raw prompt) on a model, printing text and stats.
* ``demo``: a short agent turn with a tool call on the embedded model.
* ``bench``: the live engine benchmark against HF ``generate`` (same run, same prompts; llama.cpp with ``--peers``).
* ``bench-model``: the model drafter against ``ar``, ``hvd-cache`` and ``hvd`` (chat and agent prompts).
* ``bench-kernels``: the CPU linear-layer kernels (dense, packed, row): forward cost per draft length, tok/s.
* ``bench-paths``: the native forward on each CPU path (avx2, avx512-vnni, amx): step, verify(d), prefill, same bits.
* ``bench-drafter``: propose / update cost of the cache drafter at scale (no model).
* ``bench-prefix``: a multi-turn agent conversation with and without prefix KV reuse (llama.cpp with ``--peers``).
* ``bench-batch``: concurrent ``ChatHVD.ainvoke`` calls on a serial and a batching engine: throughput, p95.
* ``bench-gpu``: HF ``generate``, engine ``ar`` and ``hvd`` on the static GPU runner; bandwidth limit, syncs per step.
* ``bench-agents``: the examples' recorded agent conversations replayed under HF, llama.cpp and engine arms.
* ``analyze``: replay an agent trace through the drafters; estimated speedup per policy (no model).
* ``train-payoff``: fit the payoff predictor on ``analyze --steps`` or ``--proposals`` records (no model).
* ``loko``: the payoff predictor fitted on all kinds of agent traces but one and judged on that one, each in turn.
* ``bench-structured``: structured output through the server (JSON schemas, BFCL calls) and constrained decoding's speed.
* ``train-drafter``: distil the draft head (the model drafter) from the target.
* ``bench-head``: draft-head acceptance per prompt kind (chat, code, JSON, tools) on held-out prompts.
* ``serve``: an OpenAI-compatible HTTP server (chat completions, completions, models, health, metrics).
* ``load-test``: a bounded load test of a running server: checked answers, p50/p95 latency.

Errors the user can cause (bad model id, bad parameters) print ``error: ...`` and
exit with status 2; no traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from hvd_agents.cli.parser import build_parser
from hvd_agents.errors import HVDError
from hvd_agents.runtime.progress import set_quiet

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hvd-agents`` console script."""
    args = build_parser().parse_args(argv)
    set_quiet(args.quiet)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except HVDError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
