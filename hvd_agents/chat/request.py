"""One chat call, framework-neutral: settings + messages + tools -> :class:`ChatRequest`.

Both adapters (``langchain_hvd.ChatHVD``, ``llama_index.llms.hvd.HVD``), the examples' loop
and the server convert their framework's types to OpenAI-shape messages and tool schemas,
then call :func:`build_chat_request`: it turns ``tool_choice``, the tools (``strict`` too)
and ``response_format`` into one grammar the reply is decoded under
(:mod:`~hvd_agents.chat.constraints`: a forced choice is exactly one valid call, ``"auto"``
free text or valid calls, a ``response_format`` JSON valid against its schema; ``"none"``
stops at ``<tool_call>``), calls :func:`hvd_agents.chat.conversation.prepare` (which
registers the conversation in the engine's cache store) and returns a :class:`ChatRequest`, which
:func:`~hvd_agents.chat.delta_stream.stream_reply_deltas` runs for every front end.

The rest of a chat call has its own module, each re-exported here:
:mod:`~hvd_agents.chat.settings` (:class:`ChatSettings`, the adapters' fields),
:mod:`~hvd_agents.chat.reply_options` (``tool_choice`` and ``response_format``, checked
once), :mod:`~hvd_agents.chat.json_reply` (JSON mode) and
:mod:`~hvd_agents.chat.engine_choice` (which engine runs a call). Running it is
:mod:`~hvd_agents.chat.reply` (where decoding starts, what a reply reports at its end) and
:mod:`~hvd_agents.chat.delta_stream` (the reply as deltas).

Example::

    request = build_chat_request(engine, [{"role": "user", "content": "Weather in Oslo?"}], tools,
                                 settings=ChatSettings(max_tokens=64), tool_choice="required")
    for delta in stream_reply_deltas(request):
        print(delta.content, delta.tool_calls)
    print(delta.finish_reason, delta.summary.completion_tokens)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.constraints import reply_constraint
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.engine_choice import check_method, resolve_engine
from hvd_agents.chat.json_reply import json_instruction, json_schema_of
from hvd_agents.chat.reply_options import ReplyOptions, check_reply_options, normalize_tool_choice
from hvd_agents.chat.settings import DECODE_FIELDS, DEFAULT_MODEL_NAME, SETTING_NAMES, ChatSettings, field_kwargs
from hvd_agents.chat.toolcall_parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from hvd_agents.chat.toolcalls import tool_list
from hvd_agents.engine import Engine, GenerationParams
from hvd_agents.errors import InvalidRequestError
from hvd_agents.structure import PromptStructure

__all__ = [
    "DECODE_FIELDS",
    "DEFAULT_MODEL_NAME",
    "SETTING_NAMES",
    "ChatRequest",
    "ChatSettings",
    "ReplyOptions",
    "build_chat_request",
    "check_method",
    "check_reply_options",
    "field_kwargs",
    "json_instruction",
    "json_schema_of",
    "merge_stops",
    "normalize_tool_choice",
    "resolve_engine",
]


@dataclass(frozen=True)
class ChatRequest:
    """One prepared engine request and how to read its output.

    Attributes:
        engine: the engine that decodes it.
        structure: the analysed prompt (``structure.prompt_ids`` is the prompt).
        params: the engine parameters.
        prefix: the forced start of the reply (the caller's own pre-fill); part of
            the reply, not generated.
        parse_tools: tools were given: ``<tool_call>`` blocks are split out.
        forced_call: ``tool_choice`` forces a call (the grammar holds the reply to one).
        json_mode: the reply is cut after its first JSON object.
        model_name: the model's name in the reply's metadata.
    """

    engine: Engine
    structure: PromptStructure
    params: GenerationParams
    prefix: str = ""
    parse_tools: bool = False
    forced_call: bool = False
    json_mode: bool = False
    model_name: str = DEFAULT_MODEL_NAME

    def closes_open_call(self, finish_reason: str) -> bool:
        """How a call ends: whether a block still open when the reply ended is complete.

        It is when the reply stopped (``"stop"``) and ``</tool_call>`` is one of its stop
        strings: the engine consumed the block's closing tag as the stop (a forced call
        always stops so). The engine reports an end-of-turn token and a stop string alike
        as ``"stop"``, so a block open at either is read as closed. A block left open
        otherwise (cut by ``max_tokens``, or a reply without that stop string) is
        unterminated: no call. Every front end reads a reply's end by this one rule
        (:func:`~hvd_agents.chat.delta_stream.stream_reply_deltas`).

        Args:
            finish_reason: the engine's finish reason, ``"stop"`` or ``"length"``.
        """
        return finish_reason == "stop" and TOOL_CALL_CLOSE in self.params.stop


def merge_stops(*lists: Sequence[str] | str | None) -> list[str]:
    """Stop strings of several sources, in order, without duplicates (a bare string is one stop string).

    Raises:
        InvalidRequestError: a source that is neither a string nor a list.
    """
    merged: list[str] = []
    for stops in lists:
        if isinstance(stops, str):
            stops = [stops]
        elif stops is not None and not isinstance(stops, Sequence):
            raise InvalidRequestError(f"stop must be a string or a list of strings, got {type(stops).__name__}")
        for stop in stops or ():
            if stop not in merged:
                merged.append(stop)
    return merged


def build_chat_request(
    engine: Engine,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    settings: ChatSettings,
    tool_choice: Any = None,
    stop: Sequence[str] | None = None,
    session_id: str | None = None,
    prefix: str = "",
    response_format: Any = None,
    model_name: str = DEFAULT_MODEL_NAME,
    options: ReplyOptions | None = None,
) -> ChatRequest:
    """Prepare one chat call (registers the conversation in ``engine.cache_store``).

    Args:
        engine: the engine.
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tool schemas.
        settings: the generation settings (``settings.stop`` applies to every call).
        tool_choice: anything :func:`normalize_tool_choice` takes; with tools, a forced
            choice makes the reply exactly one valid call, ``"auto"`` free text or valid
            calls, ``"none"`` stops at ``<tool_call>``; without tools it is ignored.
        stop: the call's own stop strings (after ``settings.stop``).
        session_id: the conversation key; None derives it from the first messages.
        prefix: forced start of the reply when the reply has no grammar (no tools, no
            ``response_format``).
        response_format: JSON mode: ``"json"``, ``{"type": "json_object"}``, a JSON
            schema or ``{"type": "json_schema", "json_schema": {"schema": ..., "strict": ...}}``:
            the reply is JSON valid against the schema (decoded under its grammar), and the
            format is asked for at the end of the last user message (unless a forced tool
            call takes precedence).
        model_name: the model's name in the reply's :class:`~hvd_agents.chat.reply.ReplySummary`.
        options: ``tool_choice`` and ``response_format`` as :func:`check_reply_options`
            returned them for these tools (a front end that checked them already);
            ``tool_choice`` and ``response_format`` are then not read.

    Raises:
        InvalidRequestError: bad messages, tools, tool_choice, response_format or settings.
        ContextLengthError: the prompt leaves no room for a new token (refused before
            the conversation is registered).
    """
    tools = tool_list(tools) or None
    if options is None:
        options = check_reply_options(tools, tool_choice, response_format)
    json_format = options.json_format
    constraint = reply_constraint(engine, tools, options.tool_choice if tools else None,
                                  json_format.schema if json_format is not None else None,
                                  json_mode=json_format is not None, json_strict=bool(json_format and json_format.strict))
    stops = merge_stops(settings.stop, stop)
    if json_format is not None:
        messages = json_format.ask(messages)
    if constraint is not None:
        prefix = ""  # the grammar writes the reply from its first token
    if options.forbids_calls:
        stops = merge_stops(stops, [TOOL_CALL_OPEN])
    params = dataclasses.replace(settings.to_params(stops), constraint=constraint)
    structure = prepare(engine, messages, tools, session_id=session_id, assistant_prefix=prefix, require_fit=True)
    # a JSON object reply is also cut after its object (a scripted or foreign engine may not hold the grammar)
    json_object = json_format is not None and (json_format.schema is None or json_format.schema.get("type", "object")
                                               == "object")
    return ChatRequest(engine, structure, params, prefix, bool(tools), options.forces_call,
                       json_object and not options.forces_call, model_name)
