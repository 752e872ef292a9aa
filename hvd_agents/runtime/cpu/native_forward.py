"""The native quantized forward (``native/quant_forward.cpp``): one build per instruction-set path, chosen at run time.

Paths (:data:`PATHS`), each the same source compiled with other flags:

* ``avx2``: every x86-64 CPU with AVX2 and FMA; the reference.
* ``avx512-vnni``: AVX-512 (F, BW, VL) with VNNI (``vpdpbusd`` for the integer block dots).
* ``amx``: the ``avx512-vnni`` code, with the integer block dots of passes of many input rows (prefills, chunks,
  long drafts: at least the module's ``TILE_MIN_ROWS`` of a pass's 16) on AMX-INT8 tiles (``native/amx.h``); the
  CPU must have AMX-TILE and AMX-INT8 and the OS must grant the process the tile state (Linux's ``arch_prctl``).

Every path computes every output element with the same integer block dots and the same float operations in the
same order (``native/isa.h``), so logits are bitwise the same on every path and every machine. A path other than
``avx2`` is enabled on a machine only after a bitwise self-check against ``avx2`` at its first build there
(:func:`self_check`; the verdict is cached beside the build); a path that fails it is not used, and the loader
logs why. The check runs in a child process (:func:`compare_in_child`), so a path whose code faults there (an
illegal instruction, a wrong tile configuration, an abort) or hangs is refused with that reason, not fatal. ``HVD_AGENTS_CPU_ISA`` (``avx2``, ``avx512-vnni``, ``amx`` or ``auto``, the default: the best path that
passed its check) forces a path; a forced path the CPU cannot run, or that fails its self-check, is refused with
the reason.

:data:`EMULATED_AMX` is the ``amx`` path's test build: its tile instructions run on a software model of the tile
state (``native/amx_emulate.h``), over the best vector code this CPU runs, so its tiling, packing and float phase
are checked bit for bit on a CPU without AMX. It is never chosen to run a model.

:func:`module` is the chosen path's compiled module (``Matrix``, ``QuantModel``, ``linear``, ``dequantize``);
:func:`available` says whether any path builds and runs here, and :func:`unavailable_reason` why not.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from hvd_agents.runtime.cpu.native_build import (
    NATIVE_DIR,
    build_key,
    build_python_module,
    cache_dir,
    cpu_supports_avx2,
    load_extension,
)

logger = logging.getLogger(__name__)

SOURCE = NATIVE_DIR / "quant_forward.cpp"
ENV = "HVD_AGENTS_CPU_ISA"
# OpenMP only for at::parallel_for at load (the forward has its own threads, team.h); no floating-point
# contraction, so every sum is the one written in the source
BASE_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off")
VNNI_FLAGS = (*BASE_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
PATH_FLAGS = {
    "avx2": BASE_FLAGS,
    "avx512-vnni": VNNI_FLAGS,
    "amx": (*VNNI_FLAGS, "-mamx-tile", "-mamx-int8"),
}
PATHS = tuple(PATH_FLAGS)  # best last
REFERENCE = "avx2"
FLAGS = PATH_FLAGS[REFERENCE]
# the amx path's test build: the tiles on their software model, over the best of these this CPU runs
EMULATED_AMX = "amx-emulated"
EMULATION_FLAG = "-DHVD_AMX_EMULATE"
VECTOR_PATHS = ("avx2", "avx512-vnni")

# weight formats of native Matrix objects (native/tile_formats.h): q4f is Q4_1 with float32 scale and minimum,
# q5f the same with 5-bit weights a byte each, q6s int8 weights with a float32 scale per 16; q4k, q5k and q6k
# the K-quants' super-blocks of 256 weights with their own fields; q5_0 and q5_1 the 5-bit blocks as nibbles
# and a plane of 5th bits; f16 and bf16 float weights in 16 bits (rows of 2-byte values, read as float32); q2k
# Q2_K's super-blocks (d, -dmin, a 4-bit scale and minimum per 16 weights, 2-bit weights)
F32, Q4_1, Q8_0, Q4F, Q5F, Q6S, Q4K, Q5K, Q6K, Q5_0, Q5_1, F16, BF16, Q2K = range(14)
FORMAT_NAMES = {F32: "f32", Q4_1: "q4_1", Q8_0: "q8_0", Q4F: "q4f", Q5F: "q5f", Q6S: "q6s", Q4K: "q4k", Q5K: "q5k",
                Q6K: "q6k", Q5_0: "q5_0", Q5_1: "q5_1", F16: "f16", BF16: "bf16", Q2K: "q2k"}
FLOATS = (F32, F16, BF16)  # float weights: float32 inputs, no tiles
QUANTIZED = (Q4_1, Q8_0, Q4F, Q5F, Q6S, Q4K, Q5K, Q6K, Q5_0, Q5_1, Q2K)
# what a row holds per record (one block of 32 weights, or a K-quant super-block of 8): blocks of 32 and the
# fields (unit bytes, count, what they hold: a scale "s" or minimum "m" in float16 or float32, K-quant
# sub-scales "u6" (0..63) or "i8", Q2_K's scale and minimum nibbles "u4u4", weights "w")
RECORDS = {
    Q4_1: (1, ((2, 1, "s16"), (2, 1, "m16"), (4, 4, "w"))),
    Q8_0: (1, ((2, 1, "s16"), (4, 8, "w"))),
    Q4F: (1, ((4, 1, "s32"), (4, 1, "m32"), (4, 4, "w"))),
    Q5F: (1, ((4, 1, "s32"), (4, 1, "m32"), (4, 8, "w"))),
    Q6S: (1, ((4, 1, "s32"), (4, 1, "s32"), (4, 8, "w"))),
    Q4K: (8, ((2, 1, "s16"), (2, 1, "m16"), (1, 8, "u6"), (1, 8, "u6"), (4, 32, "w"))),
    Q5K: (8, ((2, 1, "s16"), (2, 1, "m16"), (1, 8, "u6"), (1, 8, "u6"), (4, 40, "w"))),
    Q6K: (8, ((2, 1, "s16"), (1, 16, "i8"), (4, 48, "w"))),
    Q5_0: (1, ((2, 1, "s16"), (4, 5, "w"))),
    Q5_1: (1, ((2, 1, "s16"), (2, 1, "m16"), (4, 5, "w"))),
    Q2K: (8, ((2, 1, "s16"), (2, 1, "m16"), (1, 16, "u4u4"), (4, 16, "w"))),
}


def record_bytes(fmt: int) -> int:
    """Bytes a row holds per record of ``fmt``."""
    return sum(unit * count for unit, count, _ in RECORDS[fmt][1])


def bytes_per_block(fmt: int) -> float:
    """Bytes a row holds per 32 weights in ``fmt`` (float32: 128, f16 and bf16: 64)."""
    if fmt in FLOATS:
        return 128.0 if fmt == F32 else 64.0
    return record_bytes(fmt) / RECORDS[fmt][0]


_lock = threading.RLock()
_state: dict[str, object] = {}
_modules: dict[str, ModuleType] = {}


def build(path: str, extra_flags: tuple[str, ...] = ()) -> ModuleType:
    """The module of ``path`` (compiled once per build key, then loaded from the cache).

    Args:
        path: one of :data:`PATHS`, or :data:`EMULATED_AMX`.
        extra_flags: more compiler flags (the tests build mutated kernels this way).

    Raises:
        ValueError: an unknown path.
        Exception: whatever the compiler or the loader raise.
    """
    flags = (*path_flags(path), *extra_flags)
    name = f"hvd_quant_{path.replace('-', '_')}" + ("_x" if extra_flags else "")
    with _lock:
        if name not in _modules or extra_flags:
            module = build_python_module(SOURCE, flags, name)
            if extra_flags:
                return module
            _modules[name] = module
        return _modules[name]


def path_flags(path: str) -> tuple[str, ...]:
    """The compiler flags of ``path``'s build (:data:`EMULATED_AMX`: the best vector path's, and the emulation's).

    Raises:
        ValueError: an unknown path.
    """
    if path == EMULATED_AMX:
        base = [p for p in VECTOR_PATHS if p in cpu_paths()][-1]
        return (*PATH_FLAGS[base], EMULATION_FLAG)
    if path not in PATH_FLAGS:
        raise ValueError(f"unknown CPU path {path!r}: one of {', '.join(PATHS)} (or the test build {EMULATED_AMX})")
    return PATH_FLAGS[path]


def path_key(path: str, extra_flags: tuple[str, ...] = ()) -> str:
    """The build key of ``path``'s kernel (its cache directory; part of cost-profile keys), or of its build with
    ``extra_flags`` (as :func:`build` takes them)."""
    return build_key(SOURCE, (*path_flags(path), *extra_flags))


def cpu_paths() -> list[str]:
    """The paths this CPU (and, for ``amx``, the OS) can run, reference first (the reference build reads the CPU's
    features)."""
    reference = build(REFERENCE)
    return [p for p in PATHS if reference.cpu_supports(p)]


def cpu_refusal(path: str) -> str:
    """Why this CPU or OS cannot run ``path`` ("" when it can)."""
    return str(build(REFERENCE).cpu_refusal(path))


def _random_field(rng: np.random.Generator, kind: str, shape: tuple[int, int]) -> np.ndarray:
    """Random bytes ``[records, unit * count]`` for a field of ``kind`` (scales small and finite)."""
    if kind in ("s16", "s32", "m16", "m32"):
        low = -0.1 if kind[0] == "m" else 0.001
        values = rng.uniform(low, 0.1 if kind[0] == "m" else 0.05, shape[0]).astype(np.float16 if "16" in kind else np.float32)
        return values.view(np.uint8).reshape(shape)
    if kind == "u6":
        return rng.integers(0, 64, size=shape, dtype=np.uint8)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)  # i8 and u4u4 scales, weights (masked by the caller)


def random_weight(module: ModuleType, fmt: int, rows: int, cols: int, rng: np.random.Generator,
                  fill: int | None = None):
    """A ``module.Matrix`` of random records in ``fmt`` (scales kept small and finite, weights in the format's range):
    the same weight in two builds from the same state of ``rng``. ``fill``: every byte of the weights field set to it
    (then brought into the format's range as random bytes are): 0xFF puts every unsigned weight at its largest, 0x80
    every int8 weight (Q8_0, Q6S) at its most negative."""
    if fmt == F32:
        return module.Matrix(F32, rows, cols, torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32)))
    if fmt in (F16, BF16):
        values = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32))
        half = values.to(torch.float16 if fmt == F16 else torch.bfloat16)
        return module.Matrix(fmt, rows, cols, half.view(torch.uint8).reshape(-1).contiguous())
    blocks, fields = RECORDS[fmt]
    records = rows * cols // 32 // blocks
    parts = [_random_field(rng, kind, (records, unit * count)) for unit, count, kind in fields]
    weights = parts[-1]
    if fill is not None:
        weights[:] = fill
    if fmt == Q5F:
        weights &= 0x1F
    elif fmt == Q6S:
        weights[:] = (weights.view(np.int8) // 4).view(np.uint8)  # -32..31
    data = np.concatenate(parts, axis=1)
    return module.Matrix(fmt, rows, cols, torch.from_numpy(data.reshape(-1)))


# input rows of the comparison: a decode step and few-row passes (vector code on every path), passes of 8 to 16 rows
# (AMX tiles on the amx path), and calls of several passes whose last is partial (tiles, then vectors)
COMPARED_ROWS = (1, 3, 7, 8, 16, 17, 31, 64, 100, 130)


def compare_paths(a: ModuleType, b: ModuleType, seed: int = 0) -> list[str]:
    """Where two builds' ``linear`` differ, bit for bit, on random weights of every format and inputs of
    :data:`COMPARED_ROWS` rows (whole and partial groups of blocks, partial tiles, passes on the vector code and on
    AMX tiles), and where their ``attention`` does (:func:`attention_differences`); an empty list when they agree
    everywhere."""
    rng = np.random.default_rng(seed)
    differences = []
    for fmt in (*QUANTIZED, *FLOATS):
        shapes = ((37, 1280), (16, 256), (5, 512)) if RECORDS.get(fmt, (1,))[0] == 8 else ((37, 800), (16, 256), (5, 96))
        for rows, cols in shapes:
            state = rng.bit_generator.state
            wa = random_weight(a, fmt, rows, cols, rng)
            rng.bit_generator.state = state
            wb = random_weight(b, fmt, rows, cols, rng)
            values = rng.standard_normal((max(COMPARED_ROWS), cols))
            x = torch.from_numpy((values * rng.uniform(0.1, 10)).astype(np.float32))
            for m in COMPARED_ROWS:
                ya, yb = a.linear(wa, x[:m]), b.linear(wb, x[:m])
                if not torch.equal(ya.view(torch.int32), yb.view(torch.int32)):
                    differences.append(f"{FORMAT_NAMES[fmt]} {rows}x{cols}, {m} rows")
    return differences + attention_differences(a, b, rng)


# (queries, head_dim, slots): one or few queries (pairs of keys), many (a path's passes over several queries),
# head sizes of one, several and a partial pass of 64 lanes, one not of 16-lane vectors, and gemma's 256; runs
# ending inside a chunk of 64 keys
ATTENTION_CASES = ((1, 64, 37), (3, 64, 200), (6, 64, 131), (24, 64, 300), (48, 64, 77), (13, 80, 150), (30, 128, 90),
                   (9, 40, 100), (8, 256, 70))


def attention_differences(a: ModuleType, b: ModuleType, rng: np.random.Generator) -> list[str]:
    """Where two builds' attention differ, bit for bit, on random queries, keys and values; each query sees its own
    run of the slots (as the rows of a prompt, a draft or a window do)."""
    differences = []
    for queries, hd, slots in ATTENTION_CASES:
        case = attention_case(rng, queries, hd, slots)
        if not torch.equal(a.attention(*case).view(torch.int32), b.attention(*case).view(torch.int32)):
            differences.append(f"attention of {queries} queries, head_dim {hd}, {slots} slots")
    return differences


def attention_case(rng: np.random.Generator, queries: int, hd: int, slots: int) -> tuple:
    """Arguments of a module's ``attention`` (``q, k, v, lo, hi, scale``): random queries of a random magnitude,
    keys and values of ``slots`` float16 rows, each query seeing its own run of them."""
    q = torch.from_numpy((rng.standard_normal((queries, hd)) * rng.uniform(0.5, 4.0)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((slots, hd)).astype(np.float16))
    v = torch.from_numpy(rng.standard_normal((slots, hd)).astype(np.float16))
    lo = rng.integers(0, slots // 3 + 1, queries).tolist()
    hi = [int(rng.integers(low + 1, slots + 1)) for low in lo]
    return q, k, v, lo, hi, hd**-0.5


# how long the self-check's child may take to load two builds and compare them (seconds where it runs normally)
SELF_CHECK_TIMEOUT = 300.0
# what the child runs, and the mark it prints once it runs (a line), then before its answer (a JSON object)
_CHILD = ("import sys; from hvd_agents.runtime.cpu import native_forward; "
          "sys.exit(native_forward._compare_child(sys.argv[1:]))")
_MARK = "hvd-agents-self-check:"


class SelfCheckFault(Exception):
    """The self-check's child crashed, exited with a non-zero status or did not answer in time; the message is
    the refusal ("its self-check crashed (SIGILL, ...)", "... exited with status N ...", "... timed out after N s")."""


def compare_in_child(a: ModuleType, b: ModuleType, timeout: float = SELF_CHECK_TIMEOUT) -> list[str]:
    """:func:`compare_paths` of two loaded builds, run in a child process that loads the same libraries (the files
    ``a`` and ``b`` came from): a build whose code faults takes down the child, not this process.

    The child imports this package from where this process does, with this environment (the cache, ``PYTHONPATH``),
    and with ``HVD_AGENTS_CPU_ISA`` set to the reference: it compares, it never chooses or checks a path itself.

    Returns:
        what ``compare_paths(a, b)`` returns.

    Raises:
        SelfCheckFault: once started, the child died by a signal, exited with a non-zero status or gave no answer;
            or it did not answer within ``timeout`` seconds.
        RuntimeError: the child raised (its exception in the message), or died before it started (this package
            not importable there): nothing said about the builds.
    """
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])  # the directory holding hvd_agents/
    env["PYTHONPATH"] = os.pathsep.join([package_root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env[ENV] = REFERENCE
    command = [sys.executable, "-c", _CHILD, str(a.__file__), str(b.__file__)]
    try:
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # the child is killed
        raise SelfCheckFault(f"its self-check timed out after {timeout:g} s in a child process") from None
    lines = [line[len(_MARK):] for line in done.stdout.splitlines() if line.startswith(_MARK)]
    errors = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    said = f": {errors[-1]}" if errors else ""
    if not lines and done.returncode != 0:  # it died before it ran the builds' code: nothing said about them
        raise RuntimeError(f"the self-check's child process could not start (status {done.returncode}{said})")
    if done.returncode < 0:
        raise SelfCheckFault(f"its self-check crashed ({_signal_name(-done.returncode)}) in a child process")
    if done.returncode > 0:
        raise SelfCheckFault(f"its self-check exited with status {done.returncode} in a child process{said}")
    answer = json.loads(lines[-1]) if lines and lines[-1] else {}
    if "error" in answer:
        raise RuntimeError(f"the self-check's comparison raised {answer['error']}")
    if "differences" not in answer:
        raise SelfCheckFault(f"its self-check gave no answer in a child process{said}")
    return [str(d) for d in answer["differences"]]


def _signal_name(number: int) -> str:
    """``SIGILL, illegal instruction`` for 4 (``signal N`` for a number Python does not name)."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    text = signal.strsignal(number) or ""
    return f"{name}, {text[:1].lower()}{text[1:]}" if text else name


def _compare_child(libraries: list[str]) -> int:
    """The self-check's child (:func:`compare_in_child`): load the two builds, compare them, print the answer."""
    print(_MARK, flush=True)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a build that faults here leaves no core file
    except (ImportError, ValueError, OSError):
        pass
    try:
        a, b = (load_extension(Path(library)) for library in libraries)
        answer = {"differences": compare_paths(a, b)}
    except Exception as exc:  # noqa: BLE001 (said to the parent, which raises it)
        text = str(exc).strip()
        answer = {"error": f"{type(exc).__name__}: {text.splitlines()[-1] if text else exc!r}"}
    print(_MARK + json.dumps(answer), flush=True)
    return 0


def self_check(path: str, extra_flags: tuple[str, ...] = ()) -> str:
    """Check ``path`` against the reference bit for bit on this machine (cached per pair of builds).

    Both builds are built (or loaded) here, then compared in a child process (:func:`compare_in_child`): a path
    whose code crashes there (an illegal instruction, a fault, an abort), exits otherwise or hangs is refused with
    that reason, and this process goes on. Every verdict is recorded beside the build, so a refused path is not
    tried again on that build.

    Args:
        path: one of :data:`PATHS`, or :data:`EMULATED_AMX` (the same check of the amx path's test build).
        extra_flags: more compiler flags of the build checked (the tests' mutated builds, as :func:`build` takes
            them); its verdict is recorded beside that build.

    Returns:
        "" when it agrees, else why it may not run here.

    Raises:
        Exception: whatever building or loading either build raise, or the comparison raised in the child (not
            recorded: the next check tries again).
    """
    if path == REFERENCE and not extra_flags:
        return ""
    record = cache_dir(path_key(path, extra_flags)) / f"selfcheck-{path_key(REFERENCE)}.json"
    if record.exists():
        return str(json.loads(record.read_text()).get("why", ""))
    try:
        differences = compare_in_child(build(REFERENCE), build(path, extra_flags))
        why = f"its results differ from {REFERENCE}'s ({'; '.join(differences[:3])})" if differences else ""
    except SelfCheckFault as exc:
        why = str(exc)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"path": path, "why": why}))
    return why


def _choose() -> tuple[str, str]:
    """(the path to run, "") or ("", why none can run)."""
    forced = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if forced == EMULATED_AMX:
        raise ValueError(
            f"{ENV}={forced}: a test build (the amx path on a software model of the tiles), never run "
            f"for a model: auto, {', '.join(PATHS)}"
        )
    if forced != "auto" and forced not in PATH_FLAGS:
        raise ValueError(f"{ENV}={forced!r} is not a CPU path: auto, {', '.join(PATHS)}")
    runnable = cpu_paths()
    if forced != "auto":
        if forced not in runnable:
            why = cpu_refusal(forced)
            raise ValueError(f"{ENV}={forced}: this CPU cannot run it ({why}; it runs {', '.join(runnable)})")
        why = self_check(forced)
        if why:
            raise ValueError(f"{ENV}={forced}: the path failed its self-check on this machine: {why}")
        return forced, ""
    for path in reversed(runnable):
        try:
            why = self_check(path)
        except Exception as exc:  # noqa: BLE001 (a path that does not build is skipped, with the reason)
            why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}"
        if not why:
            return path, ""
        logger.warning("CPU path %s not used: %s", path, why)
    return REFERENCE, ""


def available() -> bool:
    """Whether the kernel is loaded, choosing and building its path on first call (cached on disk).

    Raises:
        ValueError: ``HVD_AGENTS_CPU_ISA`` names a path that is unknown or cannot run here.
    """
    with _lock:
        if "ok" not in _state:
            module, path, why = None, "", ""
            if not cpu_supports_avx2():
                why = f"this CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()}) has no AVX2"
            else:
                try:
                    path, _ = _choose()
                    module = build(path)
                except ValueError:
                    raise
                except Exception as exc:  # noqa: BLE001 (no compiler, no ninja, no headers: say why, fall back)
                    text = str(exc).strip()
                    why = f"{type(exc).__name__}: {text.splitlines()[-1] if text else exc!r}"
            if module is None:
                logger.warning("quantized CPU forward unavailable (%s); using the float32 model", why)
            else:
                logger.info("native CPU forward: %s path", path)
            _state.update(ok=module is not None, why=why, module=module, path=path)
        return bool(_state["ok"])


def unavailable_reason() -> str:
    """Why :func:`available` is False ("" when it is True or has not been asked)."""
    return str(_state.get("why", ""))


def path() -> str:
    """The path the forward runs on this machine (one of :data:`PATHS`).

    Raises:
        RuntimeError: the kernel is unavailable here.
    """
    module()
    return str(_state["path"])


def key() -> str:
    """The build key of the running path's kernel (its cache directory; part of cost-profile keys)."""
    return path_key(path())


def module() -> ModuleType:
    """The compiled module of the running path.

    Raises:
        RuntimeError: it is unavailable here (the reason is in the message).
    """
    if not available():
        raise RuntimeError(f"the quantized CPU forward is unavailable: {unavailable_reason()}")
    return _state["module"]  # type: ignore[return-value]


def reset() -> None:
    """Forget the chosen path (the next :func:`available` chooses again, reading ``HVD_AGENTS_CPU_ISA``)."""
    with _lock:
        _state.clear()
