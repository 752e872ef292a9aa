"""The bodies of ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API)
and their checks.

The route runs a Messages request through the chat pipeline of ``/v1/chat/completions``, so this
module only translates: ``system`` and ``messages`` to chat messages (:mod:`.anthropic_input`), tools
(``{"name", "description", "input_schema"}``) to chat tools, ``tool_choice`` (``auto``, ``any``,
``tool`` + ``name``, ``none``; ``disable_parallel_tool_use`` stops after the first call),
``output_config.format`` (structured output: the chat call's ``response_format``, so it behaves
exactly as on the chat route; ``output_config.effort`` is ignored), ``stop_sequences``, ``max_tokens`` (required, as Anthropic's API requires it), ``temperature``,
``top_p`` and ``top_k``.

Accepted and ignored, because they do not change the output: ``metadata`` (its ``user_id`` names
the conversation's session in the cache drafter), ``cache_control`` on any block (the prefix
cache reuses every shared prefix by itself), ``thinking`` (the served models do not reason: no
thinking blocks come back), ``service_tier``, ``container``, ``context_management`` and the
``anthropic-beta`` / ``anthropic-version`` headers. Unknown fields are ignored, as on the other
routes. Server tools (web search, code execution, computer use, bash and text editor by their
versioned types) and ``mcp_servers`` are refused by name. Defaults are the project's:
``temperature`` 0 (greedy; Anthropic's is 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from hvd_agents.chat.reply_options import ReplyOptions, check_reply_options
from hvd_agents.chat.settings import ChatSettings
from hvd_agents.errors import InvalidRequestError
from hvd_agents.server.anthropic_input import chat_messages
from hvd_agents.server.errors import invalid, param_of
from hvd_agents.server.request_schemas import (
    ANTHROPIC_MESSAGES,
    ANTHROPIC_OUTPUT,
    ANTHROPIC_SYSTEM,
    ANTHROPIC_TOOL_CHOICE,
    ANTHROPIC_TOOLS,
    METHOD,
    NON_EMPTY_STRINGS,
    NOTHING,
)

_CHOICES = ("auto", "any", "tool", "none")


class CountTokensRequest(BaseModel):
    """The body of ``POST /v1/messages/count_tokens``: the conversation and tools, no generation settings."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: Annotated[list[dict[str, Any]], ANTHROPIC_MESSAGES] = Field(min_length=1)
    system: Annotated[str | list[dict[str, Any]] | None, ANTHROPIC_SYSTEM] = None
    tools: Annotated[list[dict[str, Any]] | None, ANTHROPIC_TOOLS] = None
    tool_choice: Annotated[dict[str, Any] | None, ANTHROPIC_TOOL_CHOICE] = None
    thinking: dict[str, Any] | None = None
    mcp_servers: Annotated[list[Any] | None, NOTHING] = None

    def chat_messages(self) -> list[dict[str, Any]]:
        """``system`` and ``messages`` as chat messages (Claude Code's billing header dropped)."""
        return chat_messages(self.system, self.messages)

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools in the chat completions shape.

        Raises:
            APIError: 400 naming a tool that is not a client tool with a name and a schema object.
        """
        if self.mcp_servers:
            raise invalid("mcp_servers are not supported: declare the tools in 'tools'", "mcp_servers")
        if not self.tools:
            return None
        return [_chat_tool(index, tool) for index, tool in enumerate(self.tools)]

    def tool_choice_value(self) -> str | None:
        """``tool_choice`` as ``None`` (auto), ``"none"``, ``"required"`` (any) or a tool name.

        Raises:
            APIError: 400 for another type, or a ``tool`` choice without a name.
        """
        choice = self.tool_choice
        if choice is None:
            return None
        kind = choice.get("type")
        if kind not in _CHOICES:
            raise invalid(f"tool_choice.type must be one of {list(_CHOICES)}, got {kind!r}", "tool_choice.type")
        if kind == "tool":
            name = choice.get("name")
            if not isinstance(name, str) or not name:
                raise invalid("tool_choice of type 'tool' needs the tool's name", "tool_choice.name")
            names = [tool.get("name") for tool in self.tools or ()]
            if name not in names:
                raise invalid(f"tool_choice names {name!r}, which is not among the tools {names}", "tool_choice.name")
            return name
        return {"auto": None, "any": "required", "none": "none"}[kind]


class MessagesRequest(CountTokensRequest):
    """The body of ``POST /v1/messages``."""

    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: Annotated[list[str] | None, NON_EMPTY_STRINGS] = None
    stream: StrictBool = False
    temperature: StrictFloat | None = Field(None, ge=0.0, le=1.0)
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    output_config: Annotated[dict[str, Any] | None, ANTHROPIC_OUTPUT] = None
    # HVD's extensions, as on the chat route
    seed: StrictInt | None = Field(None, ge=0, lt=2**64)
    method: Annotated[str | None, METHOD] = None
    num_draft_tokens: StrictInt | None = Field(None, ge=0)

    def check(self) -> ReplyOptions:
        """Refuse what the server cannot do, naming the field.

        Returns:
            ``tool_choice`` as the chat layer checked it, for the chat job.

        Raises:
            APIError: a 400 naming the field.
        """
        tools = self.chat_tools()
        choice = self.tool_choice_value()
        if choice not in (None, "none") and not tools:
            raise invalid("tool_choice forces a tool call, but no tools were given", "tool_choice")
        for index, stop in enumerate(self.stop_sequences or ()):
            if not stop:
                raise invalid("stop sequences must be non-empty", f"stop_sequences[{index}]")
        try:
            return check_reply_options(tools, choice, self.response_format())
        except InvalidRequestError as exc:
            raise invalid(str(exc), param_of(str(exc)) or "tool_choice") from exc

    def response_format(self) -> dict[str, Any] | None:
        """``output_config.format`` (``{"type": "json_schema", "schema"}``) as the chat call's ``response_format``.

        Raises:
            APIError: 400 for a format of another type or without a schema object.
        """
        fmt = (self.output_config or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
            raise invalid("output_config.format must be {'type': 'json_schema', 'schema': {...}}",
                          "output_config.format")
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise invalid("output_config.format.schema must be a JSON schema object", "output_config.format.schema")
        return {"type": "json_schema", "json_schema": {"schema": dict(schema)}}

    def stops(self) -> list[str]:
        """``stop_sequences``; with ``disable_parallel_tool_use`` also the end of the first call."""
        stops = list(self.stop_sequences or ())
        if self.tools and (self.tool_choice or {}).get("disable_parallel_tool_use") is True:
            stops.append("</tool_call>")
        return stops

    def session_id(self) -> str | None:
        """``metadata.user_id``, the conversation's session in the cache drafter (None: derived)."""
        user = (self.metadata or {}).get("user_id")
        return user if isinstance(user, str) and user else None

    def settings(self, default_method: str, timeout: float | None) -> ChatSettings:
        """The generation settings."""
        return ChatSettings(
            method=self.method or default_method,
            max_tokens=self.max_tokens,
            temperature=self.temperature if self.temperature is not None else 0.0,
            top_p=self.top_p,
            top_k=self.top_k or None,  # Anthropic's clients send top_k=0 for "no cut-off"
            seed=self.seed,
            num_draft_tokens=self.num_draft_tokens,
            timeout=timeout,
        )


def _chat_tool(index: int, tool: Mapping[str, Any]) -> dict[str, Any]:
    where = f"tools[{index}]"
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise invalid(f"tool type {kind!r} is a server tool this server does not run: only client tools "
                      "({'name', 'description', 'input_schema'}) are", f"{where}.type")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("a tool needs a non-empty name", f"{where}.name")
    schema = tool.get("input_schema")
    if not isinstance(schema, Mapping):
        raise invalid("a tool needs an input_schema object (a JSON schema)", f"{where}.input_schema")
    function: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    function["parameters"] = dict(schema)  # the key order of an OpenAI tool: the same prompt as the chat route
    return {"type": "function", "function": function}
