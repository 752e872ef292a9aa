"""Build hook: wheels carry the top-level ``templates/`` as ``hvd_agents/templates/`` (package data).

Everything else about the build is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TEMPLATES = Path(__file__).resolve().parent / "templates"


class BuildWithTemplates(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout
            return
        target = Path(self.build_lib) / "hvd_agents" / "templates"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(TEMPLATES, target)


setup(cmdclass={"build_py": BuildWithTemplates})
