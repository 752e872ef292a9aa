"""Every docstring example in the package runs: each module whose source has a ``>>>`` example is
doctested here (examples that need a loaded model are written as literal blocks instead)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hvd_agents"
WITH_EXAMPLES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    for path in PACKAGE.rglob("*.py")
    if ">>>" in path.read_text(encoding="utf-8")
)


def test_the_package_has_doctests() -> None:
    assert WITH_EXAMPLES, "no module with a >>> example was found"


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has '>>>' in its source but no example doctest found"
    assert result.failed == 0
