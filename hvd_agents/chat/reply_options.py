"""What a chat request asks of its reply besides the messages: ``tool_choice`` and ``response_format``.

They are checked in one place, :func:`check_reply_options`, which returns a
:class:`ReplyOptions`; :func:`~hvd_agents.chat.request.build_chat_request` takes it as
it is (a front end that checked a request first, as the server does to answer a 400
naming the field before queueing it, passes the checked options on and nothing is
checked twice).

* :func:`normalize_tool_choice` maps the ``tool_choice`` values of LangChain, OpenAI and
  LlamaIndex to ``None`` (auto), ``"none"``, ``"required"`` or a tool name.
* A named choice must name one of the tools; a choice is ignored without tools.
* ``response_format`` becomes a :class:`~hvd_agents.chat.json_reply.JsonFormat`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvd_agents.chat.json_reply import JsonFormat
from hvd_agents.chat.toolcalls import normalize_tool, tool_list
from hvd_agents.errors import InvalidRequestError


def normalize_tool_choice(tool_choice: Any) -> str | None:
    """A ``tool_choice`` as ``None`` (auto), ``"none"``, ``"required"`` or a tool name.

    Accepts ``None``, ``"auto"``, ``"none"``, ``"any"``, ``"required"``, ``True``
    (required), ``False`` (none), a tool name, and the dicts
    ``{"type": "function", "function": {"name": ...}}`` and ``{"name": ...}``.

    Raises:
        InvalidRequestError: any other value.
    """
    if tool_choice is None or tool_choice == "auto":
        return None
    if tool_choice is True or tool_choice in ("any", "required"):
        return "required"
    if tool_choice is False or tool_choice == "none":
        return "none"
    if isinstance(tool_choice, str) and tool_choice:
        return tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        if isinstance(name, str) and name:
            return name
        kind = tool_choice.get("type")
        if kind in ("any", "required", "auto", "none"):
            return normalize_tool_choice(kind)
    raise InvalidRequestError(f"unsupported tool_choice {tool_choice!r}")


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> tuple[str, ...]:
    """The function names of tool schemas, in order.

    Raises:
        InvalidRequestError: ``tools`` is not a list, or a schema is invalid.
    """
    names = []
    for index, tool in enumerate(tool_list(tools)):
        try:
            names.append(normalize_tool(tool)["name"])
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"tools[{index}]: {exc}") from exc
    return tuple(names)


@dataclass(frozen=True)
class ReplyOptions:
    """A checked ``tool_choice`` and ``response_format`` (:func:`check_reply_options`).

    Attributes:
        tool_choice: the normalised ``tool_choice``: ``None`` (auto), ``"none"``,
            ``"required"`` or a tool name (one of the tools' when there are tools).
        tool_names: the tools' names, in order.
        json_format: the checked ``response_format``, or None.
    """

    tool_choice: str | None = None
    tool_names: tuple[str, ...] = ()
    json_format: JsonFormat | None = None

    @property
    def forces_call(self) -> bool:
        """Tools were given and a call is forced (``"required"`` or a tool name)."""
        return bool(self.tool_names) and self.tool_choice not in (None, "none")

    @property
    def forbids_calls(self) -> bool:
        """Tools were given and ``tool_choice`` is ``"none"``."""
        return bool(self.tool_names) and self.tool_choice == "none"


def check_reply_options(
    tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = None, response_format: Any = None
) -> ReplyOptions:
    """Check ``tool_choice`` against the tools, and ``response_format``.

    Args:
        tools: the request's tool schemas (OpenAI shape or bare function dicts).
        tool_choice: anything :func:`normalize_tool_choice` takes; ignored without tools.
        response_format: None, or anything :class:`~hvd_agents.chat.json_reply.JsonFormat` takes.

    Raises:
        InvalidRequestError: an unsupported ``tool_choice``, one naming no tool, or an
            unsupported ``response_format``; the message starts with the field.
    """
    choice = normalize_tool_choice(tool_choice)
    names = tool_names(tools)
    if names and choice not in (None, "none", "required") and choice not in names:
        raise InvalidRequestError(f"tool_choice {choice!r} names no available tool (tools: {list(names)})")
    json_format = JsonFormat.of(response_format) if response_format is not None else None
    return ReplyOptions(choice, names, json_format)
