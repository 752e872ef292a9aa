"""GPU benchmark: HF ``generate``, the engine's ``ar`` and ``hvd`` through the static runner, one run.

``hvd-agents bench-gpu`` answers, on the machine it runs on:

* decode speed: tokens per second of HF ``generate`` (the model's own eager forward, what
  a transformers user gets), engine ``ar`` on the HF runner, engine ``ar``, ``hvd`` and
  ``hvd-cache`` (the cache drafter alone: ``hvd``'s host work is what sets them apart where
  verification is nearly free) on the static runner (:mod:`hvd_agents.runtime.static`), same
  prompts, greedy;
* how close ``ar`` is to the memory-bandwidth limit: bytes a step must read (weights, and
  the KV at the measured context) over the device's copy bandwidth measured in the same
  run, against the measured step time;
* synchronisations per steady-state step (PyTorch's sync debug mode; must be 1);
* the single-bucket mode's bitwise equality of speculative and plain decoding, greedy and
  teacher-forced (with the default buckets' teacher-forced count as the control);
* the static runner's cost profile (CUDA events).

Models: a model id or path as everywhere (the embedded SmolLM2 by default), or
``random:NAME`` for random weights of a known configuration (:data:`RANDOM_CONFIGS`;
built on the device, nothing to download or carry). Prompts are the benchmark's agent and
chat prompts when a tokenizer is at hand; a random-weight model without one gets
synthetic prompts whose tool-output spans repeat, and its ``hvd`` figures then say little
(random weights rarely copy their context): its ``ar`` step and bandwidth figures are the
point.

On a CPU it runs the same code without graphs (``--device cpu``, for checking the command).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from hvd_agents.bench.gpu_checks import (
    single_bucket,
    single_bucket_check,
    teacher_forced_check,
    teacher_forced_rows_equal,
    teacher_forced_tree_equal,
)
from hvd_agents.bench.prompts import agent_prompts, chat_prompts
from hvd_agents.chat.render import encode_prompt
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.errors import InvalidRequestError
from hvd_agents.runtime.device import resolve_device
from hvd_agents.runtime.loading import load_model
from hvd_agents.runtime.runner import HFRunner
from hvd_agents.runtime.static import StaticRunner

logger = logging.getLogger(__name__)

__all__ = ["RANDOM_CONFIGS", "Arm", "GpuReport", "chosen_arms", "copy_bandwidth", "print_report", "random_model",
           "run_gpu_benchmark", "single_bucket", "single_bucket_check", "step_bytes", "syncs_per_step",
           "teacher_forced_check", "teacher_forced_rows_equal", "teacher_forced_tree_equal", "warm_steady_state",
           "write_prompts"]  # the bitwise checks live in .gpu_checks; their callers import them from here too

_LLAMA_3 = {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "vocab_size": 128256, "max_position_embeddings": 8192,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}
RANDOM_CONFIGS: dict[str, dict] = {
    "tiny": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048},
    "smollm2-135m": {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
                     "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True},
    "llama-3.2-1b": {**_LLAMA_3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "tie_word_embeddings": True},
    "llama-3.1-8b": {**_LLAMA_3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}


def random_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """Random weights of :data:`RANDOM_CONFIGS` ``[name]`` on ``device`` (HF Llama).

    Raises:
        InvalidRequestError: an unknown name.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if name not in RANDOM_CONFIGS:
        raise InvalidRequestError(f"unknown random model {name!r}: one of {sorted(RANDOM_CONFIGS)}")
    config = LlamaConfig(**RANDOM_CONFIGS[name], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


@dataclass
class Arm:
    """One configuration's totals over the prompts."""

    name: str
    tokens: int = 0
    seconds: float = 0.0  # end to end, prefill included
    decode_s: float = 0.0
    steps: int = 0
    outputs: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s else 0.0


@dataclass
class GpuReport:
    """What :func:`run_gpu_benchmark` measured (``--json`` writes it)."""

    device: str
    model: str
    dtype: str
    prompts: int
    arms: dict[str, dict]
    ar_step_ms: float
    bandwidth_limit_ms: float
    copy_bandwidth_gbs: float
    syncs_per_step: dict[str, float | None]
    single_bucket_bitwise: bool
    teacher_forced_bitwise: dict[str, str]  # per runner: rows bitwise equal to one-row steps, e.g. "16/16"
    bitwise_mode_bitwise: bool  # the default (bitwise) runner: planted-draft speculation equals plain decoding
    cost_profile: str
    cost_points: list[tuple[int, float]]  # the bitwise runner's profile: (draft tokens, cost in plain steps)
    buckets_cost_profile: str
    graphs_captured: int


def _its_ar(arm: str) -> str:
    """The ``ar`` arm an arm's output must equal token for token: the same runner's."""
    return "engine-ar (static, buckets)" if "buckets" in arm else "engine-ar (static)"


def _prompt_ids(tokenizer, vocab: int, synthetic: int) -> list[list[int]]:
    if tokenizer is not None:
        return [encode_prompt(tokenizer, p.messages, p.tools) for p in agent_prompts() + chat_prompts()]
    gen = torch.Generator().manual_seed(0)
    prompts = []
    for _ in range(synthetic):  # a system part, then a tool output quoted twice (what agents copy)
        system = torch.randint(0, vocab, (200,), generator=gen).tolist()
        output = torch.randint(0, vocab, (150,), generator=gen).tolist()
        prompts.append(system + output + torch.randint(0, vocab, (20,), generator=gen).tolist() + output)
    return prompts


def _engine_arm(engine: Engine | Callable[[], Engine], params: GenerationParams) -> Callable[[list[int]], tuple]:
    """An arm decoding with ``engine``, or with a new engine per run (``engine`` a callable): a drafting arm's
    cache drafter must not find the same prompt's output from an earlier run (the warm-up's, another arm's) in
    its cross-request store, which would copy it whole."""
    def run(ids: list[int]) -> tuple:
        result = (engine() if callable(engine) else engine).generate(ids, params)
        return result.token_ids, result.stats.decode_s, result.stats.steps

    return run


def _hf_arm(model, max_new: int) -> Callable[[list[int]], tuple]:
    def run(ids: list[int]) -> tuple:
        x = torch.tensor([ids], device=next(model.parameters()).device)
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, min_new_tokens=max_new,
                                 do_sample=False, pad_token_id=0)
        tokens = tuple(out[0, len(ids):].tolist())
        return tokens, 0.0, len(tokens)

    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


SYNC_COUNT_STEPS = (16, 64)  # max_new_tokens of the two counted runs of syncs_per_step


def warm_steady_state(runner: StaticRunner, prompt: int, max_new: int) -> None:
    """Capture every row bucket, in every slot, at every KV length up to the last a request of ``prompt`` tokens
    reaches while it generates ``max_new`` (its last step may verify a full row bucket; a short prompt is
    prefilled through the row buckets too), so such a request captures nothing."""
    end = min(prompt + max_new + runner.buckets.max_rows, runner.buckets.kv[-1])
    for slot in range(runner.pool.slots):
        runner.warm_up(range(1, end + 1), slot)


def syncs_per_step(engine: Engine, ids: list[int], method: str) -> float | None:
    """Synchronising CUDA calls per additional decode step: two runs that differ in length.

    Every shape the runs use is captured first (a capture synchronises); None off CUDA, or with a warning
    when a counted run captured a graph all the same (its count would include the capture's syncs).
    """
    if engine.device.type != "cuda":
        return None
    graphs = engine.runner.graphs
    warm_steady_state(engine.runner, len(ids), max(SYNC_COUNT_STEPS))

    def count(n: int) -> tuple[int, int] | None:
        params = GenerationParams(max_new_tokens=n, method=method, reuse_prefix=False, stop_token_ids=())
        engine.generate(ids, params)
        _sync(engine.device)
        captured = graphs.captured
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                steps = engine.generate(ids, params).stats.steps
            finally:
                torch.cuda.set_sync_debug_mode("default")
        if graphs.captured != captured:
            logger.warning("the counted %s run of %d tokens captured %d graphs: no sync count", method, n,
                           graphs.captured - captured)
            return None
        return sum("synchroniz" in str(w.message) for w in caught), steps

    short, long = (count(n) for n in SYNC_COUNT_STEPS)
    if short is None or long is None or long[1] == short[1]:
        return None
    return (long[0] - short[0]) / (long[1] - short[1])


def copy_bandwidth(device: torch.device, megabytes: int = 1024) -> float:
    """Bytes per second a device-to-device copy moves (read + written), best of 5."""
    n = megabytes * 2**20 // 4
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        start = time.perf_counter()
        b.copy_(a)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * a.numel() * 4 / best


def step_bytes(model: torch.nn.Module, runner: StaticRunner, context: int) -> int:
    """Bytes one plain decode step must read: every weight once, and the KV of ``context``.

    The step looks up one row of the input embedding, so an embedding untied from the LM head counts one
    row; a tied one is read whole by the LM head, and ``parameters()`` yields it once.
    """
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    if embed is not model.get_output_embeddings().weight:
        weights -= (embed.shape[0] - 1) * embed.shape[1] * embed.element_size()
    d = runner.decoder
    kv = len(d.layers) * 2 * d.kv_heads * d.head_dim * context * runner.pool.data.element_size()
    return weights + kv


def write_prompts(path: str) -> int:
    """Write the benchmark's agent and chat prompts as token ids of the embedded tokenizer (what ``--prompts``
    reads on a machine without the embedded model); returns how many."""
    from hvd_agents.runtime.loading import load_tokenizer

    prompts = _prompt_ids(load_tokenizer(None), 0, 0)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(prompts, fh)
    return len(prompts)


def _load_prompts(path: str, vocab: int) -> list[list[int]]:
    """Token-id prompts from a JSON list of lists (what ``--prompts`` names).

    Raises:
        InvalidRequestError: not a list of non-empty lists of ids below ``vocab``.
    """
    with open(path, encoding="utf-8") as fh:
        prompts = json.load(fh)
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, list) and p and all(isinstance(t, int) and 0 <= t < vocab for t in p) for p in prompts):
        raise InvalidRequestError(f"{path}: expected a JSON list of non-empty lists of token ids below {vocab}")
    return prompts


ARM_KEYS = {  # --arms: the short names of the arms
    "hf": "hf-generate",
    "hf-runner": "engine-ar (HF runner)",
    "ar": "engine-ar (static)",
    "hvd": "engine-hvd (static)",
    "hvd-cache": "engine-hvd-cache (static)",
    "ar-buckets": "engine-ar (static, buckets)",
    "hvd-buckets": "engine-hvd (static, buckets)",
}


def chosen_arms(keys: str | None) -> tuple[str, ...]:
    """The arms ``keys`` names (comma-separated :data:`ARM_KEYS`; None: all), with the ``ar`` arms the others are
    compared with.

    >>> chosen_arms("hvd-buckets,hvd")
    ('engine-ar (static)', 'engine-hvd (static)', 'engine-ar (static, buckets)', 'engine-hvd (static, buckets)')
    """
    if keys is None:
        return tuple(ARM_KEYS.values())
    wanted = {k.strip() for k in keys.split(",") if k.strip()}
    unknown = sorted(wanted - set(ARM_KEYS))
    if unknown:
        raise InvalidRequestError(f"unknown arm(s) {', '.join(unknown)}: choose from {', '.join(ARM_KEYS)}")
    names = {ARM_KEYS[k] for k in wanted} | {"engine-ar (static)"}
    names |= {_its_ar(name) for name in names if name.startswith("engine-")}
    return tuple(name for name in ARM_KEYS.values() if name in names)


def run_gpu_benchmark(model: str | None = None, *, device: str | None = None, max_new_tokens: int = 128,
                      synthetic_prompts: int = 4, rounds: int = 1, json_path: str | None = None,
                      prompts_path: str | None = None, max_prompts: int | None = None,
                      arms: str | None = None) -> GpuReport:
    """Run the benchmark (see the module docstring), print its table and return the figures (``arms``: the
    arms to run, see :func:`chosen_arms`)."""
    selected = chosen_arms(arms)
    dev, dtype = resolve_device(device)
    began = time.perf_counter()
    target, tokenizer, label = _load_target(model, dev, dtype)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    prompts = _load_prompts(prompts_path, vocab) if prompts_path else _prompt_ids(tokenizer, vocab, synthetic_prompts)
    prompts = prompts[:max_prompts] if max_prompts else prompts
    logger.info("bench-gpu: %s loaded in %.1f s, %d prompts", label, time.perf_counter() - began, len(prompts))
    bench = _Bench(target, tokenizer, label, dev, dtype, max_new_tokens)
    runs = {name: run for name, run in bench.runs().items() if name in selected}
    bench.measure_profiles(any("buckets" in name for name in runs))  # one-time work, before the timed runs
    timed = _time_arms(runs, prompts, rounds, dev, label, json_path)
    began = time.perf_counter()
    report = bench.report(timed, prompts, buckets=any("buckets" in name for name in runs))
    logger.info("bench-gpu: checks in %.1f s", time.perf_counter() - began)
    print_report(report, len(prompts) * rounds)
    if json_path:
        _write_json(json_path, asdict(report))
    return report


def _load_target(model: str | None, dev: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, object, str]:
    """The model, its tokenizer (None: synthetic prompts) and its label."""
    if model is None or not model.startswith("random:"):
        loaded = load_model(model, device=str(dev), cpu_weights="none")  # the arms run the model's own forward
        return loaded.model, loaded.tokenizer, loaded.name
    target, tokenizer = random_model(model.removeprefix("random:"), dev, dtype), None
    try:
        from hvd_agents.runtime.loading import load_tokenizer

        tokenizer = load_tokenizer(None) if "smollm2" in model else None
    except Exception as exc:  # noqa: BLE001 - the embedded tokenizer is optional here
        logger.info("no tokenizer for %s (%s): synthetic prompts", model, exc)
    return target, tokenizer, model


class _Bench:
    """The benchmark's engines on one model: the arms that run on them, and the report's checks."""

    def __init__(self, target: torch.nn.Module, tokenizer, label: str, dev: torch.device, dtype: torch.dtype,
                 max_new: int) -> None:
        self.target, self.tokenizer, self.label, self.max_new = target, tokenizer, label, max_new
        self.dev, self.dtype = dev, dtype
        self.static = StaticRunner(target)  # bitwise: one row bucket, path attention
        self.engine = self._engine(self.static)
        self.bucketed = self._engine(StaticRunner(target, bitwise=False))
        self.hf_engine = self._engine(HFRunner(target))

    def _engine(self, runner) -> Engine:
        return Engine(self.target, self.tokenizer, eos_token_ids=(), draft_head=None, runner=runner)

    def runs(self) -> dict[str, Callable]:
        """Every arm, by name: a drafting arm gets a new engine per run (an empty cross-request store)."""
        params = GenerationParams(max_new_tokens=self.max_new, reuse_prefix=False, stop_token_ids=())
        engine, bucketed = self.engine, self.bucketed

        def fresh(like: Engine) -> Callable[[], Engine]:  # the same runner, an empty cross-request store
            return lambda: self._engine(like.runner)

        return {
            "hf-generate": _hf_arm(self.target, self.max_new),
            "engine-ar (HF runner)": _engine_arm(self.hf_engine, replace(params, method="ar")),
            "engine-ar (static)": _engine_arm(engine, replace(params, method="ar")),
            "engine-hvd (static)": _engine_arm(fresh(engine), replace(params, method="hvd")),
            "engine-hvd-cache (static)": _engine_arm(fresh(engine), replace(params, method="hvd-cache")),
            "engine-ar (static, buckets)": _engine_arm(bucketed, replace(params, method="ar")),
            "engine-hvd (static, buckets)": _engine_arm(fresh(bucketed), replace(params, method="hvd")),
        }

    def measure_profiles(self, buckets: bool) -> None:
        """The runners' cost profiles, measured before the timed runs."""
        began = time.perf_counter()
        self.engine.cost_model()
        if buckets:
            self.bucketed.cost_model()
        logger.info("bench-gpu: cost profiles measured in %.1f s", time.perf_counter() - began)

    def report(self, arms: dict[str, Arm], prompts: list[list[int]], *, buckets: bool) -> GpuReport:
        """The figures of the timed ``arms`` and the checks run after them."""
        dev, target, static = self.dev, self.target, self.static
        ar = arms["engine-ar (static)"]
        ar_step = ar.decode_s / ar.steps if ar.steps else float("nan")
        context = sum(len(p) for p in prompts) // len(prompts) + self.max_new // 2
        bandwidth = copy_bandwidth(dev) if dev.type == "cuda" else float("nan")
        limit = step_bytes(target, static, context) / bandwidth if dev.type == "cuda" else float("nan")
        return GpuReport(
            device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
            model=self.label, dtype=str(self.dtype), prompts=len(prompts),
            arms={n: {**_arm_figures(a),
                      "same_as_engine_ar": sum(x == y for x, y in zip(a.outputs, ar.outputs)),
                      "same_as_its_ar": sum(x == y for x, y in zip(a.outputs, arms[_its_ar(n)].outputs))}
                  for n, a in arms.items()},
            ar_step_ms=ar_step * 1e3, bandwidth_limit_ms=limit * 1e3, copy_bandwidth_gbs=bandwidth / 1e9,
            syncs_per_step={m: syncs_per_step(self.engine, prompts[0], m) for m in ("ar", "hvd")},
            single_bucket_bitwise=single_bucket_check(target, prompts[0], self.max_new),
            bitwise_mode_bitwise=single_bucket_check(target, prompts[0], self.max_new, bitwise=True),
            teacher_forced_bitwise=teacher_forced_check(target, prompts[0]),
            cost_profile=self.engine.cost_model().source, cost_points=list(self.engine.cost_model().points),
            graphs_captured=static.graphs.captured,
            buckets_cost_profile=self.bucketed.cost_model().source if buckets else "not run",
        )


def _time_arms(runs: dict[str, Callable], prompts: list[list[int]], rounds: int, dev: torch.device, label: str,
               json_path: str | None) -> dict[str, Arm]:
    """Each arm warmed up on the first prompt (graphs, kernels, allocator), then timed over every prompt, the
    arms' order reversed every other round; the JSON holds the arms of every finished prompt."""
    arms = {name: Arm(name) for name in runs}
    for name, run in runs.items():
        began = time.perf_counter()
        run(prompts[0])
        logger.info("bench-gpu: %s warmed up in %.1f s", name, time.perf_counter() - began)
    for r in range(rounds):
        for i, ids in enumerate(prompts):
            for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
                _sync(dev)
                start = time.perf_counter()
                tokens, decode_s, steps = runs[name](ids)
                _sync(dev)
                arm = arms[name]
                arm.seconds += time.perf_counter() - start
                arm.tokens += len(tokens)
                arm.decode_s += decode_s
                arm.steps += steps
                arm.outputs.append(tokens)
                logger.info("bench-gpu: %s, prompt %d of %d (%d tokens): %d tokens in %.2f s", name, i + 1,
                            len(prompts), len(ids), len(tokens), time.perf_counter() - start)
            if json_path:  # the arms so far, so that a run stopped at a time limit leaves its figures
                _write_json(json_path, {"partial": True, "model": label, "prompts_done": i + 1,
                                        "arms": {n: _arm_figures(a) for n, a in arms.items()}})
    return arms


def _arm_figures(arm: Arm) -> dict:
    return {"tokens": arm.tokens, "seconds": arm.seconds, "tokens_per_s": arm.tokens_per_s,
            "decode_tokens_per_s": arm.decode_tokens_per_s, "steps": arm.steps}


def _write_json(path: str, figures: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(figures, fh, indent=2)


def print_report(report: GpuReport, runs: int) -> None:
    print(f"{report.model} ({report.dtype}) on {report.device}: {runs} runs per arm, greedy, outputs vs engine-ar")
    print("| arm | tok/s end to end | decode tok/s | tokens/step | identical to engine-ar | identical to its ar |")
    print("|---|---|---|---|---|---|")
    for name, a in report.arms.items():
        per_step = a["tokens"] / a["steps"] if a["steps"] else 0.0
        decode = f"{a['decode_tokens_per_s']:.0f}" if a["decode_tokens_per_s"] else "-"
        print(f"| {name} | {a['tokens_per_s']:.0f} | {decode} | {per_step:.2f} | {a['same_as_engine_ar']}/{runs} | {a['same_as_its_ar']}/{runs} |")
    ar = report.arms["engine-ar (static)"]["tokens_per_s"]
    for name in ("hf-generate", "engine-ar (HF runner)", "engine-ar (static, buckets)"):
        if name not in report.arms:
            continue
        other = report.arms[name]["tokens_per_s"]
        if other and ar:
            print(f"engine-ar (static) / {name}: {ar / other:.2f}x")
    for name, base in (("engine-hvd (static)", "engine-ar (static)"),
                       ("engine-hvd-cache (static)", "engine-ar (static)"),
                       ("engine-hvd (static, buckets)", "engine-ar (static, buckets)")):
        if name not in report.arms:
            continue
        other, under = report.arms[name]["tokens_per_s"], report.arms[base]["tokens_per_s"]
        if other and under:
            print(f"{name} / {base}: {other / under:.2f}x"
                  + (" (random weights: not a speed-up figure)" if report.model.startswith("random:") else ""))
    print(f"ar step {report.ar_step_ms:.3f} ms; bandwidth limit {report.bandwidth_limit_ms:.3f} ms "
          f"({report.copy_bandwidth_gbs:.0f} GB/s copy): {report.ar_step_ms / report.bandwidth_limit_ms:.2f}x the limit")
    print(f"synchronisations per step: {report.syncs_per_step}; CUDA graphs captured: {report.graphs_captured}")
    print(f"single-bucket mode, speculation bitwise equal to plain decoding: {report.single_bucket_bitwise}")
    print(f"bitwise runner, speculation bitwise equal to plain decoding: {report.bitwise_mode_bitwise}")
    print(f"teacher-forced rows bitwise equal, one-row steps vs one forward: {report.teacher_forced_bitwise}")
    print(f"cost profile (bitwise): {report.cost_profile}")
    print(f"cost profile (buckets): {report.buckets_cost_profile}")

