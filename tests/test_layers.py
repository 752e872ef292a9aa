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
make an upward dependency acceptable. The core imports no integration (the partner
packages under ``integrations/`` sit on top of it), and no module of the core or of an
integration reads another object's private member (``other._name``): what one object
needs of another is public. A module kept only as an earlier public import path
(:data:`KEPT_IMPORT_PATHS`) is imported by nothing in the package: it re-exports, it is not used.
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
# earlier public import paths, kept for users' code: the package itself imports the modules they re-export
KEPT_IMPORT_PATHS = {"hvd_agents.chat.templates": "hvd_agents.chat.prompt_templates"}
HEAVY = ("torch", "transformers")
ROOT = PACKAGE.parent
INTEGRATION_SOURCES = (ROOT / "integrations" / "langchain-hvd" / "langchain_hvd",
                       ROOT / "integrations" / "llama-index-llms-hvd" / "llama_index")
# the partner packages under integrations/, and the agent frameworks they adapt to
INTEGRATIONS = ("langchain_hvd", "llama_index", "langchain", "langchain_core", "vllm")
# Private names of third-party objects read because their libraries offer no public equivalent.
THIRD_PARTY_PRIVATE = {
    "_attn_implementation": "transformers' config names its attention backend only so",
    "_name_or_path": "transformers' config keeps the model's source only so",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owned(tree: ast.AST) -> set[str]:
    """Names the module defines itself: its functions and classes, what they assign to ``self`` / ``cls``,
    and every other name it binds. A module reads its own private members freely (a class's instances, a
    helper class beside it)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _foreign_modules(tree: ast.AST, package: str) -> set[str]:
    """Local names bound to other packages' modules by ``import x`` (their private helpers are theirs to offer)."""
    return {(alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names if alias.name.split(".")[0] != package}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def private_reads(source: str, package: str = "hvd_agents") -> list[tuple[str, int]]:
    """``(expression, line)`` for every read of another object's private member in ``source``.

    ``x._name`` (or ``getattr(x, "_name")``) counts unless ``x`` is ``self``, ``cls`` or
    ``super()``, ``_name`` is defined in the same module, or ``x`` is reached from another
    package's module (``torch._C``).
    """
    tree = ast.parse(source)
    mine, modules = _owned(tree), _foreign_modules(tree, package)
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            name, base = node.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            name, base = node.args[1].value, node.args[0]
        else:
            continue
        root = _root(base)
        if ((isinstance(base, ast.Name) and base.id in ("self", "cls"))
                or (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super")
                or (isinstance(root, ast.Name) and root.id in modules)
                or name in mine or name in THIRD_PARTY_PRIVATE):
            continue
        found.append((f"{ast.unparse(base)}.{name}", node.lineno))
    return found


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
            if any(target == i or target.startswith(i + ".") for i in INTEGRATIONS):
                problems.append(f"{where}: {name} imports {target}, an integration or agent framework: the core must not depend on one")
            if target in KEPT_IMPORT_PATHS and name != target:
                problems.append(f"{where}: {name} imports {target}, an earlier import path kept for users; "
                                f"import {KEPT_IMPORT_PATHS[target]}")
            if target not in modules:
                continue
            if target != name:
                graph[name].add(target)
            if layer_of(target) > layer_of(name):
                problems.append(f"{where}: {name} (layer {layer_of(name)}) imports {target} "
                                f"(layer {layer_of(target)}), an upward import")
    problems.extend(f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(graph))
    problems.extend(private_problems(root))
    return problems


def private_problems(root: Path, package: str = "hvd_agents") -> list[str]:
    """Every read of another object's private member in the modules under ``root``."""
    return [f"{path.relative_to(root.parent)}:{line}: reads {expression}, another object's private member"
            for path in sorted(root.rglob("*.py"))
            for expression, line in private_reads(path.read_text(encoding="utf-8"), package)]


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


def test_the_integrations_read_no_private_member() -> None:
    problems = [p for source in INTEGRATION_SOURCES for p in private_problems(source, source.name)]
    assert problems == []


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
        # a benchmark importing an integration, inside a function
        ({"bench/__init__.py": "", "bench/burst.py": "def f():\n    from langchain_hvd import ChatHVD\n"},
         "an integration"),
        # the package importing an earlier path kept for users, not the module it re-exports
        ({"chat/__init__.py": "", "chat/templates.py": "", "trace/__init__.py": "",
          "trace/replay.py": "from hvd_agents.chat import templates\n"}, "an earlier import path"),
        # a scheduler driving another object's step through its private members
        ({"engine/__init__.py": "", "engine/batch.py": "def step(engine, req):\n    engine._emit(req)\n"},
         "private member"),
        # ... or through getattr
        ({"bench/__init__.py": "", "bench/arms.py": "def f(d):\n    return getattr(d, '_requests', {})\n"},
         "private member"),
    ],
)
def test_the_check_finds_a_planted_violation(tmp_path, files, expected) -> None:
    problems = violations(_plant(tmp_path, files))
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    def f(self):\n        return self._x\n",  # its own member
        ("class A:\n    def __init__(self):\n        self._x = 1\n\n    def same(self, other):\n"
         "        return other._x\n"),  # another instance of a class of this module
        "import torch\n\ntorch._C._nn.mkldnn_linear\n",  # another package's module
        "class B(A):\n    def f(self):\n        return super()._x\n",  # a base class's member
    ],
)
def test_the_private_check_allows_what_is_the_modules_own(source: str) -> None:
    assert private_reads(source) == []


def test_a_module_in_no_layer_is_named() -> None:
    with pytest.raises(ValueError, match="hvd_agents_extra is in no layer"):
        layer_of("hvd_agents_extra")
