"""The README's Python code blocks run as written on the embedded model (the session's shared engine) and do
what they show: the quick starts call the tool and answer, the OpenAI client gets a reply from the server."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from pathlib import Path

import pytest

from hvd_agents import Engine
from hvd_agents.bench.recorder import record_calls
from tests.server_helpers import running_server

pytestmark = pytest.mark.real_model

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


def block(marker: str) -> str:
    """The one README python block that contains ``marker``."""
    [found] = [source for source in BLOCKS if marker in source]
    return found


def run(source: str) -> dict:
    """Execute a README block (top-level ``await`` allowed, as in a notebook); returns its namespace."""
    namespace: dict = {"__name__": "readme"}
    result = eval(compile(source, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), namespace)
    if inspect.iscoroutine(result):
        asyncio.run(result)
    return namespace


@pytest.fixture
def engine(real_engine, monkeypatch):
    """The shared engine, also what ``Engine.load()`` returns here (the model is loaded once per session)."""
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *args, **kwargs: real_engine))
    return real_engine


def test_every_python_block_is_checked() -> None:
    markers = ("Engine.load()", "from langchain_hvd import ChatHVD", "from llama_index.llms.hvd import HVD",
               "from openai import OpenAI")
    assert sorted(BLOCKS) == sorted(block(marker) for marker in markers)


def test_python_quick_start_streams_and_parses_the_call(engine, capsys) -> None:
    run(block("Engine.load()"))
    out = capsys.readouterr().out
    assert re.search(r"^ [\d.]+ tokens per target forward pass$", out, re.MULTILINE), out
    parsed = out.split("tokens per target forward pass\n", 1)[1].splitlines()[0]
    assert re.fullmatch(r"\(ToolCall\(name='get_weather', arguments=\{'city': 'Paris'\}, id='call_\w+'\),\)", parsed), out


def test_langchain_quick_start_calls_the_tool_then_answers(engine, capsys) -> None:
    with record_calls(engine, "readme") as recording:
        run(block("from langchain_hvd import ChatHVD"))
    first, second = recording.calls
    # the forced call is decoded under the tool's grammar: nothing pre-filled, the model writes it whole
    assert first.assistant_prefix == "" and first.text.startswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert '"Paris"' in first.text
    result = second.messages[-1] if isinstance(second.messages, list) else recording.messages[second.messages - 1]
    assert result["role"] == "tool" and "Sunny, 21 degrees celsius in Paris" in result["content"]
    assert second.assistant_prefix == "" and "<tool_call>" not in second.text and second.text.strip()
    assert second.text.strip() in capsys.readouterr().out


def test_llama_index_quick_start_calls_the_tool_then_answers(engine, capsys) -> None:
    with record_calls(engine, "readme") as recording:
        run(block("from llama_index.llms.hvd import HVD"))
    first, second = recording.calls
    assert first.assistant_prefix == ""
    assert first.text.startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}')
    result = second.messages[-1] if isinstance(second.messages, list) else recording.messages[second.messages - 1]
    assert result["role"] == "tool" and "Sunny, 21 degrees celsius in Paris" in result["content"]
    assert second.assistant_prefix == "" and "<tool_call>" not in second.text and second.text.strip()
    assert second.text.strip().splitlines()[0] in capsys.readouterr().out


def test_openai_client_gets_a_reply_from_the_server(engine) -> None:
    source = block("from openai import OpenAI")
    with running_server(engine) as url, record_calls(engine, "readme") as recording:
        assert "http://127.0.0.1:8000/v1" in source
        namespace = run(source.replace("http://127.0.0.1:8000/v1", f"{url}/v1"))
    assert namespace["client"].base_url.host == "127.0.0.1"
    [call] = recording.calls
    assert recording.messages == [{"role": "user", "content": "Hi"}] and call.messages == 1 and call.token_ids
