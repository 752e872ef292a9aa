"""Shared fixtures: the embedded model is loaded once per test session; tiny and scripted engines; the server
tests' engine, server and client (``engine``, ``url``, ``client``: one of each per test module that uses them; their
packages are imported only there, so the GPU tests run on a machine without the server's dependencies)."""

from __future__ import annotations

import itertools

import pytest

import hvd_agents.chat.toolcall_parser
from hvd_agents.chat.toolcall_stream import ToolCallDeltaParser
from tests.helpers import make_byte_tokenizer
from tests.scripted import ScriptedEngine
from tests.tiny import make_tiny_llama


@pytest.fixture(scope="session")
def real_engine():
    """The process-wide engine on the embedded SmolLM2-135M-Instruct (CPU)."""
    from hvd_agents.engine.shared import shared_engine

    return shared_engine(None, device="cpu")


@pytest.fixture(scope="module")
def byte_tokenizer():
    """The in-process byte-level tokenizer of ``tests.helpers``."""
    return make_byte_tokenizer()


@pytest.fixture(scope="module")
def tiny_model(byte_tokenizer):
    """A tiny random Llama over the byte tokenizer's vocabulary."""
    return make_tiny_llama(len(byte_tokenizer), seed=7)


@pytest.fixture
def scripted(tiny_model, byte_tokenizer):
    """``scripted(pieces, finish="stop", delay=0.0)``: a :class:`ScriptedEngine` replaying ``pieces``."""

    def make(pieces, finish: str = "stop", delay: float = 0.0) -> ScriptedEngine:
        return ScriptedEngine(tiny_model, byte_tokenizer, pieces, finish, delay)

    return make


@pytest.fixture
def fixed_call_ids(monkeypatch):
    """Deterministic tool-call ids in every front end: each reply numbers its calls from 0."""

    def parser(prefix: str = "") -> ToolCallDeltaParser:
        counter = itertools.count()
        monkeypatch.setattr(hvd_agents.chat.toolcall_parser, "new_call_id", lambda: f"call_{next(counter)}")
        return ToolCallDeltaParser(prefix)

    monkeypatch.setattr("hvd_agents.chat.delta_stream.ToolCallDeltaParser", parser)


@pytest.fixture(scope="module")
def engine(tiny_model, byte_tokenizer):
    """The module's engine on the tiny random model, for the server tests (:func:`tests.server_helpers.tiny_engine`)."""
    from tests.server_helpers import tiny_engine  # the server's and clients' packages, only where a test needs them

    return tiny_engine(tiny_model, byte_tokenizer)


@pytest.fixture(scope="module")
def url(engine):
    """The base URL of a server over ``engine`` on a loopback port, running for the module."""
    from tests.server_helpers import running_server

    with running_server(engine) as base:
        yield base


@pytest.fixture
def client(url):
    """An OpenAI client of the server at ``url``."""
    from tests.server_helpers import client_of

    return client_of(url)
