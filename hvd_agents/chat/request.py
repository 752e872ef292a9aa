"""One chat call, framework-neutral: settings + messages + tools -> :class:`ChatRequest`.

Both adapters (``langchain_hvd.ChatHVD``, ``llama_index.llms.hvd.HVD``), the examples' loop
and the server convert their framework's types to OpenAI-shape messages and tool schemas,
then call :func:`build_chat_request`: it applies ``tool_choice`` (a forced choice
pre-fills the start of the call and stops at ``</tool_call>``; ``"none"`` stops at
``<tool_call>``) and ``response_format`` (JSON mode: the format is asked for at the end of
the last user message, an object reply is pre-filled with ``{`` and cut after its first
JSON object), calls :func:`hvd_agents.chat.conversation.prepare` (which registers the
conversation in the engine's cache store) and returns a :class:`ChatRequest`, which
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.engine_choice import check_method, resolve_engine
from hvd_agents.chat.forced_name import arguments_start
from hvd_agents.chat.json_reply import json_instruction, json_schema_of
from hvd_agents.chat.reply_options import ReplyOptions, check_reply_options, normalize_tool_choice
from hvd_agents.chat.settings import DECODE_FIELDS, DEFAULT_MODEL_NAME, SETTING_NAMES, ChatSettings, field_kwargs
from hvd_agents.chat.toolcall_parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from hvd_agents.chat.toolcalls import named_call_prefix, normalize_tool, tool_list
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
        prefix: the forced start of the reply (a tool call's opening, ``{``, ...);
            part of the reply, not generated.
        parse_tools: tools were given: ``<tool_call>`` blocks are split out.
        forced_call: the prefix opens a tool call and ``</tool_call>`` is a stop string.
        json_mode: the reply is cut after its first JSON object.
        model_name: the model's name in the reply's metadata.
        name_choices: the tool names a forced call's name is decoded among before
            the call (:mod:`hvd_agents.chat.forced_name`); empty when the prefix holds it.
        call_to: a forced call to the named tool: its pre-fill and the conversation
            rendered with it (set with ``name_choices``).
    """

    engine: Engine
    structure: PromptStructure
    params: GenerationParams
    prefix: str = ""
    parse_tools: bool = False
    forced_call: bool = False
    json_mode: bool = False
    model_name: str = DEFAULT_MODEL_NAME
    name_choices: tuple[str, ...] = ()
    call_to: Callable[[str], tuple[str, PromptStructure]] | None = None

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
            choice pre-fills the call's start and stops at ``</tool_call>``, ``"none"``
            stops at ``<tool_call>``; without tools it is ignored.
        stop: the call's own stop strings (after ``settings.stop``).
        session_id: the conversation key; None derives it from the first messages.
        prefix: forced start of the reply when no tool call is forced and no
            ``response_format`` is given.
        response_format: JSON mode: ``"json"``, ``{"type": "json_object"}``, a JSON
            schema or ``{"type": "json_schema", "json_schema": {"schema": ...}}``. The
            format is asked for at the end of the last user message; an object reply
            is pre-filled with ``{`` and cut after its first JSON object (unless a
            forced tool call takes precedence).
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
    stops = merge_stops(settings.stop, stop)
    json_mode = False
    if options.json_format is not None:
        messages = options.json_format.ask(messages)
        prefix = options.json_format.prefix
        json_mode = prefix == "{"
    if options.forces_call:
        prefix = options.call_prefix()
        stops = merge_stops(stops, [TOOL_CALL_CLOSE])
    elif options.forbids_calls:
        stops = merge_stops(stops, [TOOL_CALL_OPEN])
    params = settings.to_params(stops)
    structure = prepare(engine, messages, tools, session_id=session_id, assistant_prefix=prefix, require_fit=True)
    forced = options.forces_call

    functions = {function["name"]: function for function in map(normalize_tool, tools or ())}

    def call_to(name: str) -> tuple[str, PromptStructure]:
        start = named_call_prefix(name) + arguments_start(functions[name])
        return start, prepare(engine, messages, tools, session_id=session_id, assistant_prefix=start, require_fit=True)

    return ChatRequest(engine, structure, params, prefix, bool(tools), forced, json_mode and not forced, model_name,
                       options.name_choices, call_to if options.name_choices else None)
