"""Building the native CPU kernels at first use, once per build key, and loading them.

Each kernel is one C++ file under ``native/``, compiled with
``torch.utils.cpp_extension`` (a C++ compiler and ninja) into
``<cache>/native/<key>/``, where later processes load it without compiling.
The key hashes what a build depends on (source, flags, torch, Python, machine), so an
edited source or a new torch builds again. The kernels need an x86-64 CPU with AVX2
and FMA (:func:`cpu_supports_avx2`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

from hvd_agents.runtime.paths import cache_root
from hvd_agents.runtime.progress import waiting

logger = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).with_name("native")


def cpu_supports_avx2() -> bool:
    """Whether this CPU can run the kernels: x86-64 with AVX2 (and FMA, which every AVX2 CPU PyTorch detects has)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512"))


def build_key(source: Path, flags: tuple[str, ...]) -> str:
    """What a build of ``source`` depends on (source, the headers beside it, flags, torch, Python, machine), hashed:
    its cache directory."""
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]
    text = "\n".join([source.read_text(), *headers, " ".join(flags), torch.__version__, sys.version, platform.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir(key: str) -> Path:
    """Where the build of ``key`` lives (and what is recorded about it on this machine)."""
    return cache_root() / "native" / key


def with_scripts_on_path() -> None:
    """Put the interpreter's scripts directory (where ninja may be) on PATH."""
    # ninja may come from the environment's own scripts directory, which need not be on PATH
    scripts = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if scripts not in path.split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + path


def build_python_module(source: Path, flags: tuple[str, ...], prefix: str) -> ModuleType:
    """Compile ``source`` (a pybind11 module) once per build key and import it.

    Raises:
        Exception: whatever the compiler or the loader raise (no compiler, no ninja, no headers).
    """
    key = build_key(source, flags)
    name = f"{prefix}_{key}"
    if name in sys.modules:  # loaded already (the same build, whichever cache it came from)
        return sys.modules[name]
    directory = cache_dir(key)
    library = directory / f"{name}.so"
    if not library.exists():
        from torch.utils import cpp_extension

        logger.info("building %s (once, under a minute) in %s", source.name, directory)
        directory.mkdir(parents=True, exist_ok=True)
        with_scripts_on_path()
        with waiting(f"building the native kernel {source.name} (once)"):
            module = cpp_extension.load(name=name, sources=[str(source)], extra_cflags=list(flags),
                                        extra_ldflags=["-fopenmp"], build_directory=str(directory), verbose=False)
        sys.modules[name] = module
        return module
    return load_extension(library)


def load_extension(library: Path) -> ModuleType:
    """Import the built module ``library`` (``<name>.so``, its module named ``name``), once per process.

    Raises:
        ImportError: whatever its initialization raises.
    """
    name = library.name.split(".")[0]
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(library))
    spec = importlib.util.spec_from_file_location(name, str(library), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module
