"""Shared fixtures: the embedded model is loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_engine():
    """The process-wide engine on the embedded SmolLM2-135M-Instruct (CPU)."""
    from hvd_agents.engine.shared import shared_engine

    return shared_engine(None, device="cpu")
