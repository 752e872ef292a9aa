"""A streamed chat completion, reassembled the way real clients do it, equals the non-streamed one.

For any split of a reply's text into decode steps, the server's SSE chunks are accumulated by
the official ``openai`` SDK (``ChatCompletionStreamState``), by LangChain (tool-call chunks
summed as ``langchain-openai`` builds them) and by LlamaIndex (``update_tool_calls``, which
reads only the first ``tool_calls`` entry of a chunk); each must give the content and the
calls (name, argument text) of the reply sent whole. Every chunk holds at most one entry
per call index, as OpenAI sends them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk
from llama_index.llms.openai.utils import update_tool_calls
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from hvd_agents import GenerationParams, RequestStats, TokenEvent
from hvd_agents.chat.delta_stream import collect, stream_reply_deltas
from hvd_agents.chat.request import ChatRequest
from hvd_agents.chat.toolcalls import named_call_prefix, parse_tool_calls, render_tool_call
from hvd_agents.server.shaping import ChatChunks, Envelope, chat_completion
from hvd_agents.structure import PromptStructure

FORCED = named_call_prefix("get_weather")


class StepsEngine:
    """Replays the reply's text as the given decode steps (one event each)."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def stream(self, prompt_ids, params=None, *, req_id=None, structure=None) -> Iterator[TokenEvent]:
        for index, text in enumerate(self.steps):
            last = index == len(self.steps) - 1
            stats = RequestStats(prompt_tokens=len(prompt_ids), new_tokens=len(self.steps), steps=index + 1)
            yield TokenEvent((1,), text, "stop" if last else None, stats if last else None)


def request(steps: list[str], forced: bool) -> ChatRequest:
    stop = ("</tool_call>",) if forced else ()
    return ChatRequest(StepsEngine(steps), PromptStructure((1, 2, 3)), GenerationParams(stop=stop),
                       prefix=FORCED if forced else "", parse_tools=True, forced_call=forced)


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({cut % (len(text) + 1) for cut in cuts} | {0, len(text)})
    steps = [text[a:b] for a, b in itertools.pairwise(bounds)]
    return steps or [""]


def sse_chunks(steps: list[str], forced: bool) -> list[dict]:
    shaper = ChatChunks(Envelope("chatcmpl-", "m"), include_usage=False)
    data = shaper.first() + b"".join(shaper.step(delta) for delta in stream_reply_deltas(request(steps, forced)))
    lines = [line[len(b"data: "):] for line in data.split(b"\n\n") if line.startswith(b"data: ")]
    return [json.loads(line) for line in lines if line != b"[DONE]"]


def by_openai(chunks: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    message = state.current_completion_snapshot.choices[0].message
    return message.content or "", [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def by_langchain(chunks: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    total = AIMessageChunk(content="")
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        calls = [tool_call_chunk(name=c["function"].get("name"), args=c["function"].get("arguments"), id=c.get("id"),
                                 index=c["index"]) for c in delta.get("tool_calls") or ()]
        total = total + AIMessageChunk(content=delta.get("content") or "", tool_call_chunks=calls)
    return total.content, [(c["name"], c["args"]) for c in total.tool_call_chunks]


def by_llama_index(chunks: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    content, calls = "", []
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        content += delta.get("content") or ""
        entries = [ChoiceDeltaToolCall.model_validate(c) for c in delta.get("tool_calls") or ()]
        calls = update_tool_calls(calls, entries)
    return content, [(c.function.name, c.function.arguments) for c in calls]


_text = st.text(st.sampled_from("ab ,.:{}\"\n"), max_size=12)
_args = st.dictionaries(st.sampled_from(["city", "unit", "q"]), st.one_of(st.integers(-5, 99), _text), max_size=3)
_call = st.tuples(st.sampled_from(["get_weather", "search"]), _args)


@st.composite
def replies(draw) -> tuple[str, bool]:
    """A reply: content and calls (auto), or a forced call's continuation after its pre-filled opening."""
    if draw(st.booleans()):
        arguments = draw(_args)
        return json.dumps(arguments) + "}", True  # the model's text after FORCED; stops at "</tool_call>"
    calls = [render_tool_call(name, arguments) for name, arguments in draw(st.lists(_call, min_size=1, max_size=2))]
    return draw(_text) + "\n".join(calls) + draw(_text), False


@settings(max_examples=150, deadline=None)
@given(replies(), st.lists(st.integers(0, 400), max_size=8))
def test_any_split_reassembles_to_the_whole_reply(reply, cuts) -> None:
    text, forced = reply
    whole = chat_completion(Envelope("chatcmpl-", "m"), collect(stream_reply_deltas(request([text], forced))))
    message = whole["choices"][0]["message"]
    expected = (message["content"] or "", [(c["function"]["name"], c["function"]["arguments"])
                                           for c in message.get("tool_calls", ())])
    assert expected[1], "every generated reply holds a call"
    chunks = sse_chunks(split(text, cuts), forced)
    for chunk in chunks:
        indexes = [call["index"] for call in chunk["choices"][0]["delta"].get("tool_calls") or ()] if chunk["choices"] else []
        assert len(indexes) == len(set(indexes)), f"two entries for one call in a chunk: {chunk}"
    assert by_openai(chunks) == expected
    assert by_langchain(chunks) == expected
    assert by_llama_index(chunks) == expected
    # the adapters' reading of the same deltas is the whole-reply parse
    parsed = collect(stream_reply_deltas(request(split(text, cuts), forced))).parsed()
    whole = parse_tool_calls(FORCED + text + "</tool_call>" if forced else text)
    assert (parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls], parsed.invalid_tool_calls) == (
        whole.content, [(c.name, c.arguments) for c in whole.tool_calls], ())
