"""Record the model calls an agent makes through the chat path, as a :class:`RecordedConversation`.

Every front end (LangChain ``ChatHVD``, LlamaIndex ``HVD``, the framework-free loop of the
examples, the server) turns a chat call into an engine request with
:func:`hvd_agents.chat.request.build_chat_request`, which renders the conversation with
:func:`~hvd_agents.chat.conversation.prepare` and then streams from the engine. While
:func:`record_calls` is active, both are watched for one engine: ``prepare`` gives the
call's messages, tools, session id and forced reply start; the engine's ``stream`` gives
the parameters (token budget, stop strings, method) and the generated tokens. Nothing
about the calls changes.

    with record_calls(engine, "airline_langchain", title=..., command=..., steering=...) as recording:
        ...                         # run the agent
    recording.conversation().save("airline_langchain.json")

(:func:`save_calls` does both, and nothing when given no path: what the examples'
``--save FILE`` uses.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvd_agents.chat.request as chat_request
from hvd_agents.bench.recorded import RecordedCall, RecordedConversation, prompt_digest
from hvd_agents.engine import Engine, GenerationParams, TokenEvent
from hvd_agents.errors import InvalidRequestError
from hvd_agents.structure import PromptStructure


def _plain(value: Any) -> Any:
    """A JSON copy (messages and schemas as they were sent; nothing shared with the caller)."""
    return json.loads(json.dumps(value, ensure_ascii=False))


@dataclass(frozen=True)
class _Prepared:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    session_id: str | None
    assistant_prefix: str


@dataclass
class Recording:
    """The calls recorded so far (see :func:`record_calls`)."""

    name: str
    title: str = ""
    command: str = ""
    steering: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_sets: list[list[dict[str, Any]]] = field(default_factory=list)
    calls: list[RecordedCall] = field(default_factory=list)

    def conversation(self) -> RecordedConversation:
        return RecordedConversation(self.name, self.title, self.command, self.steering, list(self.messages),
                                    list(self.tool_sets), list(self.calls))

    def _sent_messages(self, messages: list[dict[str, Any]]) -> int | list[dict[str, Any]]:
        n = len(messages)
        if self.messages[:n] == messages[: len(self.messages)]:  # one extends the other
            if n > len(self.messages):
                self.messages = messages
            return n
        return messages  # the history was rewritten: this call keeps its own list

    def _tools_index(self, tools: list[dict[str, Any]] | None) -> int | None:
        if tools is None:
            return None
        if tools not in self.tool_sets:
            self.tool_sets.append(tools)
        return self.tool_sets.index(tools)

    def _add(self, prepared: _Prepared, structure: PromptStructure, params: GenerationParams,
             token_ids: list[int], text: str, finish: str) -> None:
        if params.temperature != 0:
            raise InvalidRequestError("only greedy calls can be recorded for a replay (temperature 0)")
        self.calls.append(RecordedCall(
            messages=self._sent_messages(prepared.messages), tools=self._tools_index(prepared.tools),
            session_id=prepared.session_id, assistant_prefix=prepared.assistant_prefix, stop=tuple(params.stop),
            max_new_tokens=params.max_new_tokens, method=params.method,
            prompt_tokens=len(structure.prompt_ids), prompt_sha256=prompt_digest(structure.prompt_ids),
            token_ids=tuple(token_ids), text=text, finish_reason=finish))


@contextlib.contextmanager
def record_calls(engine: Engine, name: str, *, title: str = "", command: str = "",
                 steering: str = "") -> Iterator[Recording]:
    """Record the chat calls decoded by ``engine`` while the block runs.

    Only calls that go through :func:`hvd_agents.chat.request.build_chat_request` are seen
    (every front end's path); only finished calls are kept.
    """
    recording = Recording(name, title, command, steering)
    pending: dict[int, _Prepared] = {}
    original_prepare = chat_request.prepare
    original_stream = engine.stream

    def prepare(target: Engine, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                *, session_id: str | None = None, assistant_prefix: str = "", require_fit: bool = False
                ) -> PromptStructure:
        structure = original_prepare(target, messages, tools, session_id=session_id, assistant_prefix=assistant_prefix,
                                     require_fit=require_fit)
        if target is engine:
            pending[id(structure)] = _Prepared(_plain(list(messages)), _plain(list(tools)) if tools else None,
                                               session_id, assistant_prefix)
        return structure

    def stream(prompt_ids: Sequence[int], params: GenerationParams | None = None, *, req_id: str | None = None,
               structure: PromptStructure | None = None) -> Iterator[TokenEvent]:
        events = original_stream(prompt_ids, params, req_id=req_id, structure=structure)
        prepared = pending.pop(id(structure), None) if structure is not None else None
        if prepared is None:
            return events
        return _watched(events, prepared, structure, params or GenerationParams())

    def _watched(events: Iterator[TokenEvent], prepared: _Prepared, structure: PromptStructure,
                 params: GenerationParams) -> Iterator[TokenEvent]:
        tokens: list[int] = []
        texts: list[str] = []
        try:
            for event in events:
                tokens.extend(event.token_ids)
                texts.append(event.text)
                if event.finish_reason is not None:
                    recording._add(prepared, structure, params, tokens, "".join(texts), event.finish_reason)
                yield event
        finally:
            events.close()

    chat_request.prepare = prepare
    engine.stream = stream  # type: ignore[method-assign]
    try:
        yield recording
    finally:
        chat_request.prepare = original_prepare
        del engine.stream  # the class's method again


@contextlib.contextmanager
def save_calls(path: str | Path | None, engine: Engine, name: str, **meta: str) -> Iterator[Recording | None]:
    """:func:`record_calls`, saving the conversation to ``path`` at the end; nothing at all when ``path`` is None."""
    if path is None:
        yield None
        return
    with record_calls(engine, name, **meta) as recording:
        yield recording
    recording.conversation().save(path)
    print(f"recorded {len(recording.calls)} model calls to {path}")
