"""The three distributions' pyproject.toml files: read by setuptools without a warning, editable-installed as a
plain path entry."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = [ROOT, ROOT / "integrations" / "langchain-hvd", ROOT / "integrations" / "llama-index-llms-hvd"]


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_setuptools_reads_the_metadata_without_warnings(project: Path, monkeypatch) -> None:
    pytest.importorskip("setuptools", minversion="77")  # the first to take an SPDX license string
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(project)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert [str(w.message).splitlines()[0] for w in caught] == []  # e.g. a license given as a TOML table
    assert dist.metadata.license_expression == "Apache-2.0"
    # with a root package directory, an editable install is a .pth entry; without one setuptools installs an
    # import hook and prints a notice about it on every set-up
    assert dist.package_dir == {"": "."}
