"""vLLM on this machine: no speculation, its own ngram and suffix methods, and hvd_agents' proposer.

Runs in the vLLM environment (scripts/vllm-venv.sh), on the embedded model's weights as an HF
directory (``--model``; by default the one hvd-agents keeps in its cache after a first load):

    .venv-vllm/bin/python scripts/vllm_bench.py [--calls N] [--max-tokens 64] [--k 8]

The workload: the bench's agent prompts (hvd_agents.bench.prompts) and the examples' recorded calls
(hvd_agents.bench.agent_conversations), rendered as the examples sent them, one request at a time in
order. Each arm runs in its own process (scripts/vllm_arm.py); the hvd arm's client registers each
prompt's structure before sending it (hvd_agents.vllm.StructureFile). Prints, per arm: tokens per
decode step, accepted per drafted token, output tokens/s, and whether its outputs equal the
no-speculation arm's, token for token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from hvd_agents.bench.prompts import agent_prompts
from hvd_agents.bench.recorded import load_conversations, prompt_digest
from hvd_agents.chat.analyzer import analyze
from hvd_agents.runtime.paths import cache_root
from hvd_agents.vllm.structure_file import structure_to_json

ROOT = Path(__file__).resolve().parents[1]


def default_model() -> Path:
    found = sorted((cache_root() / "models").glob("SmolLM2-135M-Instruct*"))
    if not found:
        raise SystemExit("no embedded model in the hvd-agents cache: run `hvd-agents bench` once, or pass --model DIR")
    return found[-1]


def workload(tokenizer, calls: int, max_tokens: int) -> list[dict]:
    """The agent prompts, then the recorded calls (up to ``calls`` of them), as arm requests."""
    items = []
    for prompt in agent_prompts():
        structure = analyze(tokenizer, prompt.messages, prompt.tools)
        items.append({"name": prompt.name, "prompt_ids": list(structure.prompt_ids), "max_tokens": max_tokens,
                      "structure": structure_to_json(structure)})
    recorded = []
    for conversation in load_conversations():
        for i, call in enumerate(conversation.calls):
            structure = analyze(tokenizer, conversation.call_messages(i), conversation.call_tools(i),
                                session_id=call.session_id, assistant_prefix=call.assistant_prefix)
            if prompt_digest(structure.prompt_ids) != call.prompt_sha256:
                raise SystemExit(f"{conversation.name} call {i}: the prompt does not render as recorded")
            recorded.append({"name": f"{conversation.name}#{i}", "prompt_ids": list(structure.prompt_ids),
                             "max_tokens": min(max_tokens, call.max_new_tokens),
                             "structure": structure_to_json(structure)})
    return items + (recorded[:calls] if calls else recorded)


def run_arm(arm: str, model: Path, workload_path: Path, out: Path, k: int, structure_file: Path) -> dict:
    env = dict(os.environ)
    if arm == "hvd":
        env["HVD_VLLM_STRUCTURE"] = str(structure_file)
    command = [sys.executable, str(ROOT / "scripts" / "vllm_arm.py"), "--model", str(model), "--workload",
               str(workload_path), "--arm", arm, "--out", str(out), "--k", str(k)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        return {"arm": arm, "error": f"exit {done.returncode}: {tail}"}
    return json.loads(out.read_text(encoding="utf-8"))


def row(result: dict, reference: list[list[int]] | None, requests: int) -> str:
    if "error" in result:
        return f"{result['arm']:<8} did not run: {result['error'].splitlines()[-1]}"
    produced = sum(len(o) for o in result["outputs"])
    accepted = result["spec"].get("accepted_tokens", 0.0)
    drafted = result["spec"].get("draft_tokens", 0.0)
    decoded = produced - requests  # each request's first token comes from its prefill
    per_step = decoded / max(decoded - accepted, 1)
    rate = f"{accepted / drafted:.2f}" if drafted else "-"
    same = "yes" if reference is None or result["outputs"] == reference else "NO"
    return (f"{result['arm']:<8} {per_step:>10.2f} {rate:>10} {produced / result['seconds']:>10.1f} "
            f"{result['seconds']:>8.1f} {produced:>7} {same:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF model directory (default: the embedded model)")
    parser.add_argument("--arms", default="none,ngram,suffix,hvd")
    parser.add_argument("--calls", type=int, default=0, help="recorded calls to include (0: all)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens of every speculative arm")
    args = parser.parse_args()
    model = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    items = workload(tokenizer, args.calls, args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        workload_path = Path(tmp) / "workload.json"
        workload_path.write_text(json.dumps(items), encoding="utf-8")
        results = [run_arm(arm, model, workload_path, Path(tmp) / f"{arm}.json", args.k, Path(tmp) / "structure.jsonl")
                   for arm in args.arms.split(",")]
    reference = next((r["outputs"] for r in results if r["arm"] == "none" and "error" not in r), None)
    print(f"vLLM (CPU), {model.name}, {len(items)} requests one at a time, greedy, k={args.k}, "
          f"max {args.max_tokens} new tokens")
    print(f"{'arm':<8} {'tok/step':>10} {'acc/draft':>10} {'out tok/s':>10} {'seconds':>8} {'tokens':>7} "
          f"{'same as none':>10}")
    for result in results:
        print(row(result, reference, len(items)))


if __name__ == "__main__":
    main()
