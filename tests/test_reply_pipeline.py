"""The one chat reply pipeline, :func:`~hvd_agents.chat.delta_stream.stream_reply_deltas`, for every front end.

A cancel flag ends a batched request at once; the same scripted replies (a forced call closed by
its own ``</tool_call>``, a call closed by the stop string ``</tool_call>``, a forced call that
ended before its end tag, a call cut by ``max_tokens``, a forced call that does not parse, content
and a call, two calls, a block that is no call) end the same way for the server, ``ChatHVD`` and
``HVD``. The scripted engine ignores the grammar a forced call is decoded under, so it can write
what the grammar would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import add

import pytest
from langchain_hvd import ChatHVD
from llama_index.core.tools import FunctionTool
from llama_index.llms.hvd import HVD

from hvd_agents import Engine
from hvd_agents.chat.async_stream import CancelFlag
from hvd_agents.chat.delta_stream import CollectedReply, collect, stream_reply_deltas
from hvd_agents.chat.request import ChatSettings, build_chat_request
from hvd_agents.engine import batch
from hvd_agents.policy.cost import CostModel

ASK = [{"role": "user", "content": "Weather in Paris?"}]


def get_weather(city: str) -> str:
    """Weather of a city."""
    return "sunny"


LLAMA_TOOLS = [FunctionTool.from_defaults(get_weather)]


def test_a_cancel_flag_ends_a_batched_request_at_once(tiny_model, byte_tokenizer, monkeypatch) -> None:
    """Setting the flag cancels the batching engine's stream in the setting thread, not after its next event."""
    cancels: list[int] = []
    cancel = batch._Events.cancel

    def counted(events) -> None:
        cancels.append(1)
        cancel(events)

    monkeypatch.setattr(batch._Events, "cancel", counted)
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), cost_model=CostModel.linear(0.02), draft_head=None,
                    prefix_cache_bytes=0, max_batch=2)
    request = build_chat_request(engine, [{"role": "user", "content": "count on"}],
                                 settings=ChatSettings(method="ar", max_tokens=64))
    flag = CancelFlag()
    replies = stream_reply_deltas(request, flag)
    next(replies)
    assert cancels == []
    flag.set()
    assert cancels == [1]  # the request leaves the batch at the end of the step in progress
    replies.close()


# ====================================================================== one end-of-call rule for every front end

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'


@dataclass(frozen=True)
class Outcome:
    """A reply as a front end presents it: content, calls that parse, calls that do not, finish reason."""

    content: str
    calls: tuple[tuple[str, str, dict], ...]  # id, name, arguments
    invalid: tuple[tuple[str, str | None, str], ...]  # id, name, error
    finish: str


@dataclass(frozen=True)
class Case:
    pieces: list[str]
    tool_choice: str | None
    outcome: Outcome
    engine_finish: str = "stop"
    stop: tuple[str, ...] = ()  # the call's stop strings
    server_content: str | None = None  # the server's content when it shows a block that is no call


UNTERMINATED = "unterminated <tool_call> block"
OPENING = '<tool_call>\n{"name": "get_weather", "arguments": '
CASES = {
    # a forced call is written whole under its grammar, its own "</tool_call>" included: the call is complete
    "forced call closed by its own end tag": Case(
        [OPENING + '{"city": ', '"Paris"}', "}\n</tool_call>"], "get_weather",
        Outcome("", (("call_0", "get_weather", {"city": "Paris"}),), (), "tool_calls")),
    # the engine consumed the stop string "</tool_call>" (parallel_tool_calls=False): the call is complete
    "call closed by its stop string": Case(
        [OPENING + '{"city": ', '"Paris"}}'], None,
        Outcome("", (("call_0", "get_weather", {"city": "Paris"}),), (), "tool_calls"), stop=("</tool_call>",)),
    # a forced call has no stop string (its grammar ends it): a reply that ends before its end tag left it open
    "forced call ended before its end tag": Case(
        [OPENING + '{"city": ', '"Paris"}}'], "get_weather",
        Outcome("", (), (("call_0", "get_weather", UNTERMINATED),), "invalid_tool_call")),
    "call cut by max_tokens": Case(
        [OPENING + '{"city": "Pa'], "get_weather", Outcome("", (), (("call_0", "get_weather", UNTERMINATED),), "length"),
        engine_finish="length"),
    "forced call that does not parse": Case(
        [OPENING, "Paris", " is sunny}\n</tool_call>"], "get_weather",
        Outcome("", (), (("call_0", "get_weather", "invalid JSON: Expecting value: line 1 column 38 (char 37)"),),
                "invalid_tool_call"),
        server_content=OPENING + "Paris is sunny}\n</tool_call>"),
    "content and a call": Case(
        ["Let me", " check.\n", (CALL % "Paris")[:30], (CALL % "Paris")[30:]], None,
        Outcome("Let me check.", (("call_0", "get_weather", {"city": "Paris"}),), (), "tool_calls")),
    "two calls": Case(
        [CALL % "Paris", "\n", CALL % "Oslo"], None,
        Outcome("", (("call_0", "get_weather", {"city": "Paris"}), ("call_1", "get_weather", {"city": "Oslo"})), (),
                "tool_calls")),
    "a block read whole that is no call": Case(
        ["Checking. ", "<tool_call>\n[1, 2]\n</tool_call>"], None,
        Outcome("Checking.", (), (("call_0", None, "tool call is not a JSON object"),), "stop"),
        server_content="Checking. <tool_call>\n[1, 2]\n</tool_call>"),
}


def by_server(reply: CollectedReply) -> Outcome:
    parsed = reply.parsed()
    return Outcome(parsed.content, tuple((c.id, c.name, c.arguments) for c in parsed.tool_calls),
                   tuple((bad.id, bad.name, bad.error) for bad in parsed.invalid_tool_calls), reply.finish_reason)


def by_langchain(message) -> Outcome:
    errors = message.response_metadata.get("invalid_tool_call_errors", {})
    return Outcome(message.content, tuple((c["id"], c["name"], c["args"]) for c in message.tool_calls),
                   tuple((bad["id"], bad["name"] or None, bad["error"] or errors[bad["id"]])
                         for bad in message.invalid_tool_calls), message.response_metadata["finish_reason"])


def by_llama_index(llm, response) -> Outcome:
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=False)
    invalid = response.message.additional_kwargs.get("invalid_tool_calls", [])
    return Outcome(response.message.content, tuple((c.tool_id, c.tool_name, c.tool_kwargs) for c in calls),
                   tuple((bad["id"], bad["name"], bad["error"]) for bad in invalid), response.raw["finish_reason"])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES)
def test_every_front_end_ends_a_reply_by_the_same_rule(scripted, fixed_call_ids, case) -> None:
    """The server's collected deltas, ChatHVD (invoke and summed stream) and HVD (chat and stream) agree."""
    engine = scripted(case.pieces, finish=case.engine_finish)
    request = build_chat_request(engine, ASK, [WEATHER], settings=ChatSettings(), tool_choice=case.tool_choice,
                                 stop=list(case.stop))
    # every call is decoded under the tools' grammar; only the call's own stop strings end it at "</tool_call>"
    assert request.params.constraint.kind == "lark"
    assert ("</tool_call>" in request.params.stop) == ("</tool_call>" in case.stop)
    reply = collect(stream_reply_deltas(request))
    # the server shows a block read whole that is no call as written (OpenAI's reply has no place for it)
    assert reply.content == (case.server_content if case.server_content is not None else case.outcome.content)
    chat_hvd = ChatHVD(engine=engine, stop=list(case.stop)).bind_tools([WEATHER], tool_choice=case.tool_choice)
    llm = HVD(engine=engine, stop=list(case.stop))
    llama_kwargs = llm._prepare_chat_with_tools(LLAMA_TOOLS, user_msg=ASK[0]["content"], tool_choice=case.tool_choice)
    outcomes = {
        "server": by_server(reply),
        "ChatHVD.invoke": by_langchain(chat_hvd.invoke(ASK[0]["content"])),
        "ChatHVD.stream": by_langchain(reduce(add, chat_hvd.stream(ASK[0]["content"]))),
        "HVD.chat": by_llama_index(llm, llm.chat(**llama_kwargs)),
        "HVD.stream_chat": by_llama_index(llm, list(llm.stream_chat(**llama_kwargs))[-1]),
    }
    assert outcomes == dict.fromkeys(outcomes, case.outcome)
