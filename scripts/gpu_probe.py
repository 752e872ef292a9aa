"""Decode-step cost of the static runner on a GPU, bitwise mode against per-bucket mode.

    python scripts/gpu_probe.py smollm2-135m [llama-3.1-8b ...]

For each random-weight configuration (``hvd_agents.bench.gpu.RANDOM_CONFIGS``, bfloat16, built on
the device): the milliseconds of one captured decode forward of ``rows`` real rows at a few
contexts, timed with CUDA events (median of repeated replays), in the bitwise mode (one row
bucket, path attention), the per-bucket mode (dense attention in the smallest bucket) and the
bitwise mode without the fused kernels (nor the step-input kernel), the weight-read floor at the
device's measured copy bandwidth, and per mode the device kernels of one step and of its inputs
(PyTorch's profiler over the step's eager forward: the kernels its graph holds). Needs CUDA.
``HVD_AGENTS_STEP_INPUT_KERNEL=0`` runs every mode with the step's inputs built by PyTorch's operations.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from hvd_agents.bench.gpu import copy_bandwidth, random_model, step_bytes
from hvd_agents.runtime.static import StaticRunner
from hvd_agents.runtime.static.step_inputs import CheckedKernel

ROWS = (1, 2, 5, 17, 33)
CONTEXTS = (256, 512, 4096)  # 256: the bitwise mode's one-chunk KV bucket (path attention as one kernel)
REPEATS = 20


def step_ms(runner: StaticRunner, kv, ids: list[int], context: int, rows: int) -> float:
    """Median milliseconds of a forward of ``rows`` tokens at ``context`` (the cache rolled back after each)."""
    times = []
    for i in range(REPEATS + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.forward(kv, ids[context : context + rows])
        end.record()
        end.synchronize()
        kv.rollback(context)
        if i >= 3:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels_per_step(runner: StaticRunner, kv) -> str:
    """Device kernels (and copies) of one decode forward at ``kv``'s length, and of building its inputs."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    graphs, rows = runner.graphs, runner.buckets.rows[0]
    length = runner.buckets.kv_for(kv.length + rows)
    packed = graphs.inputs(rows)  # the last forward's inputs; it writes only past the cache's length
    parts = {"step": lambda: graphs._eager(kv.slot, rows, length),
             "inputs": lambda: runner.decoder.decode_inputs(packed[rows + 1 : 2 * rows], packed[:1], length,
                                                           packed[2 * rows :] if graphs.paths else None)}
    counts = {}
    try:
        for part, fn in parts.items():
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            counts[part] = sum(e.device_type == DeviceType.CUDA for e in prof.events())
    except Exception as exc:  # noqa: BLE001 - the profiler is a report, never the probe's failure
        return f"kernels per step unknown ({exc})"
    return f"{counts['step']} kernels per {rows}-row step, {counts['inputs']} of them building its inputs"


def probe(name: str) -> None:
    began = time.perf_counter()
    model = random_model(name, torch.device("cuda"), torch.bfloat16)
    print(f"\n## {name}: built in {time.perf_counter() - began:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated, peak {torch.cuda.max_memory_allocated() / 2**30:.1f}")
    ids = torch.randint(0, model.config.vocab_size, (max(CONTEXTS) + 64,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    results = {}
    for mode, bitwise in (("bitwise", True), ("buckets", False), ("bitwise, unfused", True)):
        # the unfused row: PyTorch's small operations instead of the fused Triton kernels (more kernels per step)
        os.environ["HVD_AGENTS_FUSED_KERNELS"] = "0" if mode.endswith("unfused") else "1"
        runner = StaticRunner(model, bitwise=bitwise, slots=1, max_context=8192)
        build = "input_kernel" if isinstance(runner.decoder.build_inputs, CheckedKernel) else "step_inputs"
        print(f"{mode}: small operations from {runner.decoder.ops.__name__}, step inputs from {build}")
        kv = runner.new_kv()
        for context in CONTEXTS:
            kv.rollback(0)
            runner.forward(kv, ids[:context], logits_to_keep=1)
            for rows in ROWS:
                results[mode, context, rows] = step_ms(runner, kv, ids, context, rows)
            if context <= 512:  # past it the step's kernels are the 512 context's
                print(f"{mode}, {context} cached: {kernels_per_step(runner, kv)}")
            floor = step_bytes(model, runner, context) / bandwidth * 1e3
            results["floor", context, 1] = floor
        kv.release()
        del runner
        torch.cuda.empty_cache()
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print("| context | mode | " + " | ".join(f"{r} rows ms" for r in ROWS) + " |")
    print("|---|---|" + "---|" * len(ROWS))
    for context in CONTEXTS:
        for mode in ("bitwise", "buckets", "bitwise, unfused"):
            print(f"| {context} | {mode} | " + " | ".join(f"{results[mode, context, r]:.3f}" for r in ROWS) + " |")
        ratio = " | ".join(f"{results['bitwise', context, r] / results['buckets', context, r]:.2f}x" for r in ROWS)
        print(f"| {context} | bitwise / buckets | {ratio} |")
        print(f"| {context} | bandwidth floor (1 row) | {results['floor', context, 1]:.3f} |" + " |" * (len(ROWS) - 1))
    del model
    torch.cuda.empty_cache()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("gpu_probe needs a CUDA device")
    print(torch.cuda.get_device_name(), torch.__version__)
    for config in sys.argv[1:] or ["smollm2-135m"]:
        probe(config)
