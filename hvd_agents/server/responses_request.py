"""The body of ``POST /v1/responses`` (OpenAI's Responses API) and its checks.

The route runs a Responses request through the chat pipeline of ``/v1/chat/completions``,
so this model only translates: ``input`` to chat messages (:mod:`.responses_input`), the
flat function tools (``{"type": "function", "name", "parameters"}``) to chat tools,
``tool_choice`` (``"auto"``, ``"none"``, ``"required"``, ``{"type": "function", "name"}``),
``text.format`` to a ``response_format``, ``max_output_tokens`` to the generation's bound.

What the server cannot do is refused with a 400 naming the field, never ignored:
built-in tools (web search, file search, computer use, MCP, ...), ``include`` of extra
outputs, ``reasoning``, ``background``, ``conversation``, stored ``prompt`` templates,
``truncation: "auto"``, log-probabilities, ``max_tool_calls``, a ``text.verbosity``
other than medium. Fields that change nothing here (``metadata``, ``service_tier``,
``prompt_cache_key``, ``safety_identifier``, ...) are accepted; unknown ones are ignored,
as on the chat route. Defaults are the project's: ``temperature`` 0 (greedy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from hvd_agents.chat.reply_options import ReplyOptions, check_reply_options
from hvd_agents.chat.settings import ChatSettings
from hvd_agents.errors import InvalidRequestError
from hvd_agents.server.errors import invalid, param_of
from hvd_agents.server.request_schemas import (
    FALSY,
    METHOD,
    NO_ITEMS,
    NO_REASONING,
    NOT_SET,
    OFF,
    RESPONSE_INPUT,
    RESPONSE_TEXT_OPTIONS,
    RESPONSE_TOOL_CHOICE,
    RESPONSE_TOOLS,
    TRUNCATION,
    ZERO,
)
from hvd_agents.server.responses_input import turn_messages

# The tool types of the Responses API that run on OpenAI's side: this server has none of them.
_BUILT_IN_TOOLS = ("web_search", "file_search", "computer", "code_interpreter", "image_generation", "mcp", "shell")


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: Annotated[str | list[dict[str, Any]], RESPONSE_INPUT]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: StrictBool | None = None
    tools: Annotated[list[dict[str, Any]] | None, RESPONSE_TOOLS] = None
    tool_choice: Annotated[str | dict[str, Any] | None, RESPONSE_TOOL_CHOICE] = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: StrictBool = False
    text: Annotated[dict[str, Any] | None, RESPONSE_TEXT_OPTIONS] = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Annotated[str | None, TRUNCATION] = None
    include: Annotated[list[str] | None, NO_ITEMS] = None
    reasoning: Annotated[dict[str, Any] | None, NO_REASONING] = None
    background: Annotated[StrictBool | None, OFF] = None
    conversation: Annotated[Any, FALSY] = None
    prompt: Annotated[Any, FALSY] = None
    top_logprobs: Annotated[int | None, ZERO] = None
    max_tool_calls: Annotated[int | None, NOT_SET] = None
    # HVD's extensions (extra_body in the OpenAI SDK), as on the chat route
    seed: int | None = Field(None, ge=0, lt=2**64)
    top_k: int | None = Field(None, ge=0)
    method: Annotated[str | None, METHOD] = None
    num_draft_tokens: int | None = Field(None, ge=0)

    def check(self) -> ReplyOptions:
        """Refuse what the server cannot do, naming the field.

        Returns:
            ``tool_choice`` and ``text.format`` as the chat layer checked them
            (:func:`~hvd_agents.chat.reply_options.check_reply_options`), for the chat job.

        Raises:
            APIError: a 400 naming the field.
        """
        self._check_unsupported()
        for index, tool in enumerate(self.tools or ()):
            _check_tool(index, tool)
        choice = self.tool_choice_value()
        if choice not in (None, "none") and not self.tools:
            raise invalid("tool_choice forces a tool call, but no tools were given", "tool_choice")
        if choice not in (None, "none", "required"):
            names = [tool["name"] for tool in self.tools or ()]
            if choice not in names:
                raise invalid(f"tool_choice names {choice!r}, which is not among the tools {names}", "tool_choice")
        self.turn_messages()
        try:
            return check_reply_options(self.chat_tools(), choice, self.response_format_value())
        except InvalidRequestError as exc:
            raise invalid(str(exc), param_of(str(exc)) or "tools") from exc

    def _check_unsupported(self) -> None:
        refused = {
            "background": (self.background, "background responses are not supported: send stream=true instead"),
            "conversation": (self.conversation, "conversation objects are not supported: use previous_response_id"),
            "prompt": (self.prompt, "stored prompt templates are not supported: send instructions and input"),
            "reasoning": (_set_values(self.reasoning), "reasoning is not supported: the served models do not reason"),
            "include": (self.include, f"include is not supported (no extra outputs): got {self.include}"),
            "top_logprobs": (self.top_logprobs, "log-probabilities are not supported"),
            "max_tool_calls": (self.max_tool_calls is not None, ("max_tool_calls is not supported: "
                               "use parallel_tool_calls=false for one call per response")),
        }
        for field, (value, message) in refused.items():
            if value:
                raise invalid(message, field)
        if self.truncation not in (None, "disabled"):
            raise invalid(f"truncation {self.truncation!r} is not supported: a conversation that does not fit the "
                          "context window is refused, never cut (use 'disabled')", "truncation")
        verbosity = (self.text or {}).get("verbosity")
        if verbosity not in (None, "medium"):
            raise invalid(f"text.verbosity {verbosity!r} is not supported", "text.verbosity")

    def turn_messages(self) -> list[dict[str, Any]]:
        """This request's ``input`` as chat messages (without the instructions or the stored history)."""
        return turn_messages(self.input)

    def instruction_messages(self) -> list[dict[str, Any]]:
        """``instructions`` as a leading system message (they are not carried to the next response)."""
        return [{"role": "system", "content": self.instructions}] if self.instructions else []

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The function tools in the chat completions shape."""
        if not self.tools:
            return None
        return [{"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters")
                                                  if tool.get(key) is not None}} for tool in self.tools]

    def tool_choice_value(self) -> str | None:
        """``tool_choice`` as ``None`` (auto), ``"none"``, ``"required"`` or a tool name."""
        choice = self.tool_choice
        if choice is None or choice == "auto":
            return None
        if choice in ("none", "required"):
            return choice
        if isinstance(choice, Mapping) and choice.get("type") == "function":
            name = choice.get("name")
            if isinstance(name, str) and name:
                return name
            raise invalid("tool_choice of type 'function' needs a non-empty name", "tool_choice.name")
        if isinstance(choice, Mapping):
            raise invalid(f"tool_choice of type {choice.get('type')!r} is not supported: use 'auto', 'none', "
                          "'required' or {'type': 'function', 'name': ...}", "tool_choice.type")
        raise invalid(f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}", "tool_choice")

    def response_format_value(self) -> Mapping[str, Any] | None:
        """``text.format`` as the chat layer's ``response_format``; None for plain text."""
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, Mapping):
            raise invalid("text.format must be an object", "text.format")
        kind = fmt.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "json_object"}
        if kind == "json_schema":
            schema = fmt.get("schema")
            if not isinstance(schema, Mapping):
                raise invalid("text.format.schema must be an object", "text.format.schema")
            return {"type": "json_schema", "json_schema": {"schema": dict(schema), "strict": fmt.get("strict") is True}}
        raise invalid(f"text.format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                      "text.format.type")

    def stops(self) -> list[str]:
        """Stop strings: with ``parallel_tool_calls=false``, the end of the first call."""
        return ["</tool_call>"] if self.tools and self.parallel_tool_calls is False else []

    def settings(self, default_method: str, context_window: int, timeout: float | None) -> ChatSettings:
        """The generation settings (no ``max_output_tokens``: the rest of the context window)."""
        return ChatSettings(
            method=self.method or default_method,
            max_tokens=self.max_output_tokens if self.max_output_tokens is not None else context_window,
            temperature=self.temperature if self.temperature is not None else 0.0,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            num_draft_tokens=self.num_draft_tokens,
            timeout=timeout,
        )


def _set_values(options: Mapping[str, Any] | None) -> bool:
    """Whether ``reasoning`` asks for anything (OpenAI's SDKs send ``{"effort": null}`` alike)."""
    return bool(options) and any(value is not None for value in options.values())


def _check_tool(index: int, tool: Mapping[str, Any]) -> None:
    kind = tool.get("type")
    if kind != "function":
        detail = "a built-in tool this server does not run" if kind in _BUILT_IN_TOOLS else "not supported"
        raise invalid(f"tool type {kind!r} is {detail}: only function tools are", f"tools[{index}].type")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise invalid("a function tool needs a non-empty name", f"tools[{index}].name")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], Mapping):
        raise invalid("a function tool's parameters must be a JSON schema object", f"tools[{index}].parameters")
