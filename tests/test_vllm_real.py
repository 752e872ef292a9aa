"""The proposer inside a real vLLM: a tiny random Llama served offline by ``vllm.LLM``, greedy, gives
the same tokens with hvd_agents' proposer as without speculation, on agent-shaped prompts.

vLLM runs in its own environment (``scripts/vllm-venv.sh`` builds it; ``HVD_VLLM_VENV`` names
another), each arm in a subprocess (``scripts/vllm_arm.py``); without that environment the test
is skipped, naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from hvd_agents.bench.prompts import agent_prompts
from hvd_agents.chat.analyzer import analyze
from hvd_agents.runtime.loading import embedded_gguf_path
from hvd_agents.vllm.structure_file import structure_to_json

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("HVD_VLLM_VENV", ROOT / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not PYTHON.exists(), reason=f"no vLLM environment at {VENV}: build it with "
                                                    "scripts/vllm-venv.sh (or set HVD_VLLM_VENV)"),
]


def _write_tiny_llama(directory: Path) -> AutoTokenizer:
    """A 2-layer Llama with random weights and the embedded model's tokenizer, as an HF directory."""
    gguf = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # head_dim 64: vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128, ... (not 16)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False, torch_dtype="float32")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharp logits: no near ties for a verification pass to flip
        model.lm_head.weight.mul_(16.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return tokenizer


def _workload(tokenizer, path: Path) -> None:
    items = []
    for prompt in agent_prompts():
        structure = analyze(tokenizer, prompt.messages, prompt.tools)
        items.append({"prompt_ids": list(structure.prompt_ids), "max_tokens": 48,
                      "structure": structure_to_json(structure)})
    # a repeated span the random model will not write by itself: a prompt that ends inside it
    span = list(items[0]["prompt_ids"][40:80])
    items.append({"prompt_ids": [*span, *span, *span[:5]], "max_tokens": 48})
    path.write_text(json.dumps(items), encoding="utf-8")


def _run(arm: str, model: Path, workload: Path, tmp_path: Path) -> dict:
    out = tmp_path / f"{arm}.json"
    env = {**os.environ, "HVD_VLLM_STRUCTURE": str(tmp_path / "structure.jsonl"), "HVD_VLLM_VERIFY_COST": "0.02"}
    done = subprocess.run([str(PYTHON), str(ROOT / "scripts" / "vllm_arm.py"), "--model", str(model),
                           "--workload", str(workload), "--arm", arm, "--out", str(out), "--k", "8",
                           "--max-model-len", "2048"], check=False, env=env, capture_output=True, text=True,
                           timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_greedy_tokens_with_the_proposer_equal_tokens_without_speculation() -> None:
    # not pytest's tmp_path: its base folder is shared by every pytest run of the user, which removes
    # older ones while this test's vLLM processes still read the model
    with tempfile.TemporaryDirectory(prefix="hvd-vllm-") as folder:
        _check_greedy_equality(Path(folder))


def _check_greedy_equality(tmp_path: Path) -> None:
    model = tmp_path / "tiny-llama"
    tokenizer = _write_tiny_llama(model)
    workload = tmp_path / "workload.json"
    _workload(tokenizer, workload)
    plain = _run("none", model, workload, tmp_path)
    hvd = _run("hvd", model, workload, tmp_path)
    assert all(len(output) > 0 for output in plain["outputs"])
    assert hvd["outputs"] == plain["outputs"]
    # not vacuous: vLLM verified drafts from the proposer and accepted some
    assert hvd["spec"]["draft_tokens"] > 0
    assert hvd["spec"]["accepted_tokens"] > 0
