"""Agent stacks pointed at the server: LangChain ``ChatOpenAI``, LlamaIndex ``OpenAILike``, and a bounded load test."""

from __future__ import annotations

import json

from langchain_hvd import ChatHVD
from langchain_openai import ChatOpenAI
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from hvd_agents.server.loadtest import run_load_test
from tests.server_helpers import MODEL, running_server

QUESTION = [("system", "Be brief."), ("human", "Name a colour.")]


def test_chat_openai_equals_chat_hvd(url, engine) -> None:
    remote = ChatOpenAI(base_url=f"{url}/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=10,
                        max_retries=0)
    local = ChatHVD(engine=engine, max_tokens=10)
    expected = local.invoke(QUESTION).content
    assert remote.invoke(QUESTION).content == expected
    assert "".join(chunk.content for chunk in remote.stream(QUESTION)) == expected


def test_openai_like_equals_chat_hvd(url, engine) -> None:
    llm = OpenAILike(model=MODEL, api_base=f"{url}/v1", api_key="unused", is_chat_model=True, temperature=0,
                     max_tokens=10, context_window=512, max_retries=0)
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Name a colour.")]
    expected = ChatHVD(engine=engine, max_tokens=10).invoke(QUESTION).content
    assert llm.chat(messages).message.content == expected
    assert "".join(r.delta or "" for r in llm.stream_chat(messages)) == expected


def test_chat_openai_tool_calls(scripted) -> None:
    engine = scripted(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}', "}\n</tool_call>"],
                      finish="stop")

    def get_weather(city: str) -> str:
        """Weather of a city."""
        return "sunny"

    with running_server(engine) as base:
        llm = ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model=MODEL, max_retries=0)
        forced = llm.bind_tools([get_weather], tool_choice="get_weather")
        message = forced.invoke("Weather in Oslo?")
        streamed = None
        for chunk in forced.stream("Weather in Oslo?"):
            streamed = chunk if streamed is None else streamed + chunk
    assert [(call["name"], call["args"]) for call in message.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert [(call["name"], call["args"]) for call in streamed.tool_calls] == [("get_weather", {"city": "Oslo"})]
    sent_tools = engine.tokenizer.decode(engine.requests[0][0])
    assert json.dumps("get_weather") in sent_tools


def test_bounded_load_no_errors_nothing_lost_or_mixed(url) -> None:
    report = run_load_test(url, requests=24, clients=6, max_tokens=6, time_cap_s=60)
    assert report.problems == []
    assert len(report.outcomes) == 24 and {o.index for o in report.outcomes} == set(range(24))
    assert report.latency(0.5) <= report.latency(0.95)
    assert "latency p50" in report.summary()


def test_the_load_test_notices_mixed_up_answers(url, monkeypatch) -> None:
    from hvd_agents.server import loadtest

    real = loadtest._one

    async def swapped(client, index, model, max_tokens):  # answer 3 comes back as if it were another prompt's
        outcome = await real(client, index, model, max_tokens)
        if index == 3:
            outcome.text += " (someone else's)"
        return outcome

    monkeypatch.setattr(loadtest, "_one", swapped)
    report = run_load_test(url, requests=12, clients=3, max_tokens=4, time_cap_s=60)
    assert any("different greedy replies" in problem for problem in report.problems)
