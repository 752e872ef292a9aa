"""The bodies of Ollama's ``POST /api/chat`` and ``POST /api/generate`` and their checks.

Both routes run through the chat pipeline of ``/v1/chat/completions``, so this module only
translates:

* ``messages`` (``system``, ``user``, ``assistant`` with ``tool_calls`` whose ``arguments`` are an
  object, ``tool``) to chat messages; ``images`` are refused by name (the served models read text);
* ``tools`` (already OpenAI's shape in Ollama's API);
* ``format``: ``"json"`` is ``{"type": "json_object"}``, a JSON schema object is
  ``{"type": "json_schema", "json_schema": {"schema": ...}}``: the chat call's ``response_format``,
  so structured output behaves exactly as on the chat route;
* ``options``: ``temperature``, ``top_p``, ``top_k``, ``seed``, ``num_predict`` (``-1`` / ``-2``:
  the rest of the context window) and ``stop``; other options (``num_ctx``, ``repeat_penalty``,
  ``mirostat``, ...) are accepted and ignored, as Ollama ignores those a model does not use;
* ``/api/generate``'s ``prompt`` and ``system`` become a user and a system message (the model's
  chat template applies, as in Ollama); with ``raw: true`` the prompt is sent as it is, without
  a template, as on ``/v1/completions``.

HVD's own extension fields, as on the chat route: ``tool_choice`` on ``/api/chat`` (Ollama's API
has none; ``auto``, ``none``, ``required`` or a tool's name), ``method`` and ``num_draft_tokens``.

``keep_alive`` and ``think`` are accepted and ignored (the model stays loaded; the served models do
not reason). ``stream`` defaults to true, as in Ollama. What cannot be honoured is refused with a
400 naming the field: ``images``, ``suffix``, a ``template`` other than the model's, ``context``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from hvd_agents.chat.reply_options import ReplyOptions, check_reply_options
from hvd_agents.chat.settings import ChatSettings
from hvd_agents.errors import InvalidRequestError
from hvd_agents.server.errors import invalid, param_of
from hvd_agents.server.request_schemas import (
    CHAT_TOOL_CHOICE,
    CHAT_TOOLS,
    METHOD,
    NOTHING,
    OLLAMA_FORMAT,
    OLLAMA_MESSAGES,
    STOP,
)

_ROLES = ("system", "user", "assistant", "tool")
# num_predict values that mean "no bound" in Ollama (-1: infinite, -2: fill the context)
_UNBOUNDED = (-1, -2)


class OllamaOptions(BaseModel):
    """``options``: the sampling settings this server honours (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    temperature: StrictFloat | None = Field(None, ge=0.0, le=2.0)
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=0)
    seed: StrictInt | None = Field(None, ge=0, lt=2**64)
    num_predict: StrictInt | None = Field(None, ge=-2)
    stop: Annotated[str | list[str] | None, STOP] = None


class _OllamaBody(BaseModel):
    """Fields both generation routes share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    format: Annotated[str | dict[str, Any] | None, OLLAMA_FORMAT] = None
    options: OllamaOptions | None = None
    stream: StrictBool = True
    keep_alive: str | int | float | None = None
    think: StrictBool | str | None = None
    # HVD's own
    method: Annotated[str | None, METHOD] = None
    num_draft_tokens: StrictInt | None = Field(None, ge=0)

    def model_name(self) -> str:
        """``model`` without Ollama's default tag (``name:latest`` is ``name``)."""
        return self.model.removesuffix(":latest")

    def response_format(self) -> Mapping[str, Any] | None:
        """``format`` as the chat call's ``response_format``; None for free text.

        Raises:
            APIError: 400 for a string other than ``"json"``.
        """
        fmt = self.format
        if fmt is None or fmt == "":
            return None
        if fmt == "json":
            return {"type": "json_object"}
        if isinstance(fmt, dict):
            return {"type": "json_schema", "json_schema": {"schema": dict(fmt)}}
        raise invalid(f"format must be 'json' or a JSON schema object, got {fmt!r}", "format")

    def stops(self) -> list[str]:
        """``options.stop`` as a list."""
        stop = self.options.stop if self.options is not None else None
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        for index, value in enumerate(stops):
            if not value:
                raise invalid("stop strings must be non-empty", f"options.stop[{index}]")
        return stops

    def settings(self, default_method: str, context_window: int, timeout: float | None) -> ChatSettings:
        """The generation settings (``num_predict`` unset or unbounded: the rest of the context window)."""
        options = self.options or OllamaOptions()
        bounded = options.num_predict is not None and options.num_predict not in _UNBOUNDED
        if bounded and options.num_predict < 1:
            raise invalid("options.num_predict must be positive, -1 or -2", "options.num_predict")
        return ChatSettings(
            method=self.method or default_method,
            max_tokens=options.num_predict if bounded else context_window,
            temperature=options.temperature if options.temperature is not None else 0.0,
            top_p=options.top_p,
            top_k=options.top_k or None,
            seed=options.seed,
            num_draft_tokens=self.num_draft_tokens,
            timeout=timeout,
        )

    def _check_options(self, tools: list[dict[str, Any]] | None, tool_choice: Any = None) -> ReplyOptions:
        self.stops()
        try:
            return check_reply_options(tools, tool_choice, self.response_format())
        except InvalidRequestError as exc:
            raise invalid(str(exc), param_of(str(exc)) or ("tool_choice" if tool_choice else "format")) from exc


class ChatBody(_OllamaBody):
    """The body of ``POST /api/chat``."""

    messages: Annotated[list[dict[str, Any]], OLLAMA_MESSAGES] = Field(min_length=1)
    tools: Annotated[list[dict[str, Any]] | None, CHAT_TOOLS] = None
    # HVD's own: Ollama's API has no tool_choice; the chat route's values (auto, none, required, a name)
    tool_choice: Annotated[str | dict[str, Any] | None, CHAT_TOOL_CHOICE] = None

    def check(self) -> ReplyOptions:
        """Refuse what the server cannot do, naming the field; returns ``format`` as the chat layer checked it.

        Raises:
            APIError: a 400 naming the field.
        """
        for index, tool in enumerate(self.tools or ()):
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
                raise invalid("a tool must be {'type': 'function', 'function': {...}}", f"tools[{index}]")
        self.chat_messages()
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise invalid("tool_choice forces a tool call, but no tools were given", "tool_choice")
        return self._check_options(self.tools, self.tool_choice)

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the chat layer takes them (tool-call arguments as JSON text).

        Raises:
            APIError: 400 naming the message that is malformed or not text.
        """
        return [_message(index, message) for index, message in enumerate(self.messages)]


class GenerateBody(_OllamaBody):
    """The body of ``POST /api/generate``."""

    prompt: str = ""
    system: str | None = None
    raw: StrictBool = False
    suffix: Annotated[str | None, NOTHING] = None
    template: Annotated[str | None, NOTHING] = None
    context: Annotated[list[int] | None, NOTHING] = None
    images: Annotated[list[Any] | None, NOTHING] = None

    def check(self) -> ReplyOptions:
        """Refuse what the server cannot do, naming the field.

        Raises:
            APIError: a 400 naming the field.
        """
        refused = {"images": "images are not supported: the served model reads text",
                   "suffix": "suffix (fill-in-the-middle) is not supported",
                   "template": "a request's own template is not supported: the model's chat template applies "
                               "(or send raw=true with the prompt as the model reads it)",
                   "context": "context (the token ids of an earlier reply) is not supported: send the whole "
                              "conversation to /api/chat instead"}
        for name, message in refused.items():
            if getattr(self, name):
                raise invalid(message, name)
        if self.raw and self.format is not None:
            raise invalid("format needs the chat template: it is not supported with raw=true", "format")
        return self._check_options(None)

    def chat_messages(self) -> list[dict[str, Any]]:
        """``system`` and ``prompt`` as a system and a user message."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.prompt}]


def _message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise invalid(f"{where} must be an object", where)
    role = message.get("role")
    if role not in _ROLES:
        raise invalid(f"{where}.role must be one of {list(_ROLES)}, got {role!r}", f"{where}.role")
    if message.get("images"):
        raise invalid(f"{where}.images: images are not supported: the served model reads text", f"{where}.images")
    content = message.get("content", "")
    if content is not None and not isinstance(content, str):
        raise invalid(f"{where}.content must be a string", f"{where}.content")
    out: dict[str, Any] = {"role": role, "content": content or ""}
    calls = message.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise invalid(f"{where}.tool_calls must be a list on an assistant message", f"{where}.tool_calls")
        out["tool_calls"] = [_call(f"{where}.tool_calls[{number}]", number, call) for number, call in enumerate(calls)]
        out["content"] = content or None
    return out


def _call(where: str, number: int, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise invalid(f"{where} must be {{'function': {{'name', 'arguments'}}}}", where)
    arguments = function.get("arguments", {})
    if isinstance(arguments, Mapping):
        arguments = json.dumps(arguments)
    elif not isinstance(arguments, str):
        raise invalid(f"{where}.function.arguments must be an object", f"{where}.function.arguments")
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{number}"
    return {"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}}
