"""The package's layers import only downward, with no cycles (read from the source, nothing imported).

Layers, bottom to top (a module may import its own layer and those below):

0. ``errors``, ``structure``: leaf types
1. ``policy``: payoff predictor, selection, calibration, cost curves (numpy only: no torch, no model calls)
2. ``runtime``: loading, kernels, KV cache, the runner, cost-profile measurement, paths
3. ``draft_head``: the draft head model
4. ``drafters``: ``base`` < ``cache``, ``model`` < ``hybrid`` < the registry (``drafters/__init__``)
5. ``engine``
6. ``chat``
7. ``cli``, ``demo``, ``bench``, ``trace``, ``distill``, ``server`` and the package's own ``__init__`` (its facade)

Every import counts, at module level or inside a function: a lazy import does not
make an upward dependency acceptable.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hvd_agents"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("hvd_agents.errors", "hvd_agents.structure"),
    ("hvd_agents.policy",),
    ("hvd_agents.runtime",),
    ("hvd_agents.draft_head",),
    ("hvd_agents.drafters.base",),
    ("hvd_agents.drafters.cache", "hvd_agents.drafters.model"),
    ("hvd_agents.drafters.hybrid",),
    ("hvd_agents.drafters",),
    ("hvd_agents.engine",),
    ("hvd_agents.chat",),
    ("hvd_agents.cli", "hvd_agents.demo", "hvd_agents.bench", "hvd_agents.trace", "hvd_agents.distill",
     "hvd_agents.server", "hvd_agents"),
)
NUMPY_ONLY = "hvd_agents.policy"
HEAVY = ("torch", "transformers")


def layer_of(module: str) -> int:
    """The layer of ``module``: the one whose longest prefix names it."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise ValueError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
    return best


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``source``, relative ones resolved."""
    found: list[tuple[str, int]] = []
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found.append((target, node.lineno))
            # `from hvd_agents.x import y` may import the submodule y
            found.extend((f"{target}.{alias.name}", node.lineno) for alias in node.names)
    return found


def violations(root: Path) -> list[str]:
    """Every upward import, every heavy import in the numpy-only layer, and every cycle under ``root``."""
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    problems: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target, line in imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py"):
            where = f"{path.relative_to(root.parent)}:{line}"
            if name.startswith(NUMPY_ONLY) and target.split(".")[0] in HEAVY:
                problems.append(f"{where}: {name} imports {target}, but the policy layer is numpy only")
            if target not in modules:
                continue
            if target != name:
                graph[name].add(target)
            if layer_of(target) > layer_of(name):
                problems.append(f"{where}: {name} (layer {layer_of(name)}) imports {target} "
                                f"(layer {layer_of(target)}), an upward import")
    problems.extend(f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(graph))
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules that import each other (package facades excluded:
    a package's ``__init__`` re-exporting its submodules is not a cycle with them)."""
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target] if target in path else [node, target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return cycles


def test_layers_import_only_downward_and_form_no_cycle() -> None:
    assert violations(PACKAGE) == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "hvd_agents"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # the policy layer reaching up into the engine, inside a function
        ({"policy/__init__.py": "", "engine/__init__.py": "",
          "policy/cost.py": "def f():\n    from hvd_agents.engine import Engine\n"}, "upward import"),
        # the runtime reaching up into drafters through a relative import
        ({"runtime/__init__.py": "", "drafters/__init__.py": "", "drafters/base.py": "",
          "runtime/kv.py": "from ..drafters import base\n"}, "upward import"),
        # a cache drafter importing the hybrid above it
        ({"drafters/__init__.py": "", "drafters/cache/__init__.py": "", "drafters/hybrid/__init__.py": "",
          "drafters/cache/suffix.py": "from hvd_agents.drafters.hybrid import HybridDrafter\n"}, "upward import"),
        # torch in the numpy-only layer
        ({"policy/__init__.py": "", "policy/payoff.py": "import torch\n"}, "numpy only"),
        # two modules of one layer importing each other
        ({"engine/__init__.py": "", "engine/a.py": "from hvd_agents.engine import b\n",
          "engine/b.py": "import hvd_agents.engine.a\n"}, "import cycle"),
    ],
)
def test_the_check_finds_a_planted_violation(tmp_path, files, expected) -> None:
    problems = violations(_plant(tmp_path, files))
    assert any(expected in problem for problem in problems), problems


def test_a_module_in_no_layer_is_named() -> None:
    with pytest.raises(ValueError, match="hvd_agents_extra is in no layer"):
        layer_of("hvd_agents_extra")
