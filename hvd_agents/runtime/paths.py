"""Where the project keeps what it computes once per machine: converted models, built kernels, cost profiles."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache directory: ``$HVD_AGENTS_CACHE``, else ``$XDG_CACHE_HOME/hvd-agents``, else ``~/.cache/hvd-agents``."""
    explicit = os.environ.get("HVD_AGENTS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "hvd-agents"
