"""Decode-step cost of the static runner on a GPU, bitwise mode against per-bucket mode.

    python scripts/gpu_probe.py smollm2-135m [llama-3.1-8b ...]

For each random-weight configuration (``hvd_agents.bench.gpu.RANDOM_CONFIGS``, bfloat16, built on
the device): the milliseconds of one captured decode forward of ``rows`` real rows at a few
contexts, timed with CUDA events (median of repeated replays), in the bitwise mode (one row
bucket, path attention), the per-bucket mode (dense attention in the smallest bucket), the
bitwise mode without any fused kernel (nor the step-input kernel), the weight-read floor at the
device's measured copy bandwidth, and per mode the device kernels of one step and of its inputs,
with their device time by kernel (PyTorch's profiler over the step's eager forward: the kernels
its graph holds). Needs CUDA. ``HVD_AGENTS_STEP_INPUT_KERNEL=0`` runs every mode with the step's inputs built by PyTorch's
operations; ``PROBE_MODES`` names the modes, ``;``-separated (see :func:`configure`: ``bitwise,
CHUNK=128``, ``bitwise, FOLD=0``, ``buckets, PW=2``). Each mode also reports its teacher-forced rows that are
bitwise a one-row step's, chains and trees.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import hvd_agents.runtime.static.runner as runner_module
from hvd_agents.bench.gpu import (
    copy_bandwidth,
    random_model,
    step_bytes,
    teacher_forced_rows_equal,
    teacher_forced_tree_equal,
)
from hvd_agents.runtime.static import StaticRunner, path_kernels, paths
from hvd_agents.runtime.static.step_inputs import CheckedKernel

ROWS = (1, 2, 5, 17, 33)
MODES = [(mode, not mode.startswith("buckets")) for mode in (
    os.environ.get("PROBE_MODES") or "bitwise;buckets;bitwise, unfused").split(";")]
CONTEXTS = (256, 512, 4096)  # 256: the bitwise mode's one-chunk KV bucket (path attention as one kernel)
REPEATS = 20
DEFAULTS = {"CHUNK": paths.CHUNK, "TILE": paths.TILE, "PW": path_kernels.WARPS, "PS": path_kernels.STAGES}


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
    counts, busy = {}, {}
    try:
        for part, fn in parts.items():
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
            counts[part] = len(kernels)
            if part == "step":  # device time by kernel name: what the step's time is spent in, launch gaps aside
                for e in kernels:
                    n, us = busy.get(e.name[:60], (0, 0.0))
                    busy[e.name[:60]] = (n + 1, us + e.device_time_total)
    except Exception as exc:  # noqa: BLE001 - the profiler is a report, never the probe's failure
        return f"kernels per step unknown ({exc})"
    top = sorted(busy.items(), key=lambda item: -item[1][1])[:8]
    lines = "".join(f"\n    {us:8.1f} us in {n:4d} x {name}" for name, (n, us) in top)
    total = sum(us for _, us in busy.values())
    return (f"{counts['step']} kernels per {rows}-row step, {counts['inputs']} of them building its inputs; "
            f"{total:.1f} us of kernel time{lines}")


def configure(mode: str) -> None:
    """Set the kernels a mode names: ``unfused`` (PyTorch's small operations, not the fused Triton kernels),
    ``CHUNK=n`` (path attention's chunk of virtual positions), ``TILE=n`` (its reduction tile), ``FOLD=0``
    (path attention's chunks combined by a second kernel, not by each row's last chunk), ``PW=n`` / ``PS=n``
    (path attention's warps per program and pipelining stages)."""
    words = [w.strip() for w in mode.split(",")[1:]]
    os.environ["HVD_AGENTS_FUSED_KERNELS"] = "0" if "unfused" in words else "1"
    values = dict(w.split("=") for w in words if "=" in w)
    paths.CHUNK = runner_module.CHUNK = int(values.get("CHUNK", DEFAULTS["CHUNK"]))
    paths.FOLD = values.get("FOLD", "1") != "0"
    paths.TILE = int(values.get("TILE", DEFAULTS["TILE"]))
    path_kernels.WARPS = int(values.get("PW", DEFAULTS["PW"]))
    path_kernels.STAGES = int(values.get("PS", DEFAULTS["PS"]))


def bitwise_rows(runner: StaticRunner, ids: list[int]) -> str:
    """Teacher-forced rows bitwise equal between one-row steps and one forward, chain and tree, at a cached length
    in the one-chunk KV bucket and one past it."""
    cells = []
    for past in (200, 600):
        chain = teacher_forced_rows_equal(runner, ids[:past], ids[past : past + 16])
        tree = teacher_forced_tree_equal(runner, ids[:past], ids[past : past + 16])
        cells.append(f"{past} cached: chain {chain}/16, tree {tree}/16")
    return "; ".join(cells)


def probe(name: str) -> None:
    began = time.perf_counter()
    model = random_model(name, torch.device("cuda"), torch.bfloat16)
    print(f"\n## {name}: built in {time.perf_counter() - began:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated, peak {torch.cuda.max_memory_allocated() / 2**30:.1f}")
    ids = torch.randint(0, model.config.vocab_size, (max(CONTEXTS) + 64,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    results = {}
    for mode, bitwise in MODES:
        configure(mode)
        runner = StaticRunner(model, bitwise=bitwise, slots=1, max_context=8192)
        build = "input_kernel" if isinstance(runner.decoder.build_inputs, CheckedKernel) else "step_inputs"
        print(f"{mode}: small operations from {runner.decoder.ops.__name__}, step inputs from {build}, "
              f"path attention tile {paths.TILE}, chunk {paths.CHUNK} ({'combined by the last chunk' if paths.FOLD else 'two kernels'}, "
              f"{path_kernels.WARPS} warps, "
              f"{path_kernels.STAGES} stages); bitwise rows: "
              f"{bitwise_rows(runner, ids)}")
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
        for mode, _ in MODES:
            print(f"| {context} | {mode} | " + " | ".join(f"{results[mode, context, r]:.3f}" for r in ROWS) + " |")
        if ("bitwise", context, 1) in results and ("buckets", context, 1) in results:
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
