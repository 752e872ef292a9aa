"""Run one decoding arm of vLLM over a workload of token-id prompts, greedy, and write what it did.

Runs in the vLLM environment (scripts/vllm-venv.sh), one arm per process (a vLLM engine per
process, nothing shared between arms):

    .venv-vllm/bin/python scripts/vllm_arm.py --model DIR --workload W.json --arm hvd --out R.json

Arms: ``none`` (no speculation), ``ngram`` (vLLM's prompt lookup), ``suffix`` (vLLM's suffix
decoding; needs arctic-inference), ``hvd`` (hvd_agents.vllm.HVDProposer). The workload is a JSON
list of ``{"prompt_ids": [...], "max_tokens": n}``; requests run one at a time, in order (an
agent's calls follow each other), after one warm-up request that is not timed; for the hvd arm,
each request's prompt structure (``"structure"``, when the item has one) is registered first in the
file ``HVD_VLLM_STRUCTURE`` names, as a client would. The result holds
each request's output ids, the decode seconds, and vLLM's speculative-decoding counters.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ARMS = ("none", "ngram", "suffix", "hvd")


def speculative_config(arm: str, k: int) -> dict | None:
    """vLLM's ``speculative_config`` for an arm."""
    if arm == "none":
        return None
    if arm == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if arm == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if arm == "hvd":
        return {"method": "custom_class", "model": "hvd_agents.vllm.HVDProposer", "num_speculative_tokens": k}
    raise SystemExit(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")


def counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters (drafts, draft tokens, accepted tokens), summed."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            key = metric.name.removeprefix("vllm:spec_decode_num_")
            out[key] = out.get(key, 0.0) + float(metric.value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an HF model directory")
    parser.add_argument("--workload", required=True, help="JSON list of {prompt_ids, max_tokens}")
    parser.add_argument("--arm", required=True, choices=ARMS)
    parser.add_argument("--out", required=True, help="where to write the result (JSON)")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--memory", type=float, default=0.1,
                        help="the share of host memory vLLM's CPU backend reserves (its gpu_memory_utilization)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: plenty for one request at a time

    from vllm import LLM, SamplingParams  # only here: this script runs in the vLLM environment

    from hvd_agents.vllm.structure_file import StructureFile, structure_from_json

    workload = json.loads(Path(args.workload).read_text(encoding="utf-8"))
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, enforce_eager=True,
              speculative_config=speculative_config(args.arm, args.k), disable_log_stats=False, seed=0,
              enable_prefix_caching=False, gpu_memory_utilization=args.memory)

    structure_file = os.environ.get("HVD_VLLM_STRUCTURE") if args.arm == "hvd" else None

    def run(item: dict) -> list[int]:
        if structure_file and "structure" in item:  # the client registers its prompt's structure first
            StructureFile(structure_file).register(structure_from_json(item["structure"]))
        params = SamplingParams(temperature=0.0, max_tokens=item["max_tokens"], ignore_eos=False)
        (result,) = llm.generate([{"prompt_token_ids": item["prompt_ids"]}], params, use_tqdm=False)
        return list(result.outputs[0].token_ids)

    run({"prompt_ids": workload[0]["prompt_ids"][:16], "max_tokens": 4})  # warm-up, not timed
    before = counters(llm)
    outputs, seconds = [], 0.0
    for item in workload:
        begun = time.perf_counter()
        outputs.append(run(item))
        seconds += time.perf_counter() - begun
    after = counters(llm)
    spec = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    Path(args.out).write_text(json.dumps({"arm": args.arm, "outputs": outputs, "seconds": seconds, "spec": spec}),
                              encoding="utf-8")


if __name__ == "__main__":
    main()
