"""A forced tool call's name, kept to the declared tools.

``tool_choice="required"`` with one tool pre-fills that tool's name (what frameworks mean
by it: "call this tool"). With several tools the reply is pre-filled with ``<tool_call>\\n``
and the model writes the call; :class:`NameWatch` reads the name as it is written:

* a declared name: decoding goes on untouched, so the reply is exactly the model's own;
* any other name, or a block that does not start ``{"name": "...", "arguments": ``: the
  generation is dropped there and the call is decoded again with a declared name
  pre-filled (:func:`closest_name`: of the names sharing the longest prefix with what the
  model wrote, the first declared; the model left the declared names right after that
  prefix, so those are the continuations it was on), and with it the start of its
  arguments: ``{"`` and the schema's first required key (:func:`arguments_start`), so
  the arguments follow the schema where the model had left it.

Under greedy decoding, whenever the model's own greedy name is a declared one the result
is token for token its greedy output; otherwise the name is the declared one closest to
what it wrote. Requests without a forced call never take this path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from hvd_agents.chat.toolcall_parser import BlockClosed, CallOpened, ToolCallReader, guess_name


class NameState(Enum):
    PENDING = "pending"  # the name is not read yet
    DECLARED = "declared"  # the model wrote a declared name
    UNDECLARED = "undeclared"  # it wrote another name, or no name where one belongs


def closest_name(written: str, names: Sequence[str]) -> str:
    """The declared name the model wrote, or the first declared of those sharing the longest prefix with it.

    Example:
        >>> closest_name("get_weather", ["get_time", "get_weather"])
        'get_weather'
        >>> closest_name("get_wind", ["get_time", "get_weather"])
        'get_weather'
    """
    if written in names:
        return written
    return max(names, key=lambda name: len(os.path.commonprefix([name, written])))  # max keeps the first of ties


class NameWatch:
    """Reads a forced call's reply as it streams until its name is known (see the module docstring).

    Args:
        prefix: the reply's pre-filled start (``<tool_call>\\n``).
        names: the declared tool names.
    """

    def __init__(self, prefix: str, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.written = ""  # the name as written, once read
        self.state = NameState.PENDING
        self._text = ""
        self._reader = ToolCallReader()
        self.push(prefix)

    def push(self, text: str) -> NameState:
        """Read more of the reply; the state once it is read."""
        if self.state is NameState.PENDING:
            self._text += text
            for event in self._reader.push(text):
                self._see(event)
            if self.state is NameState.PENDING and self._reader.reads_whole:
                self.state = NameState.UNDECLARED  # the block does not start with its name
            if self.state is NameState.UNDECLARED and not self.written:
                self.written = guess_name(self._text) or ""
        return self.state

    def _see(self, event: object) -> None:
        if self.state is not NameState.PENDING:
            return
        if isinstance(event, CallOpened):
            self.written = event.name
            self.state = NameState.DECLARED if event.name in self.names else NameState.UNDECLARED
        elif isinstance(event, BlockClosed):
            self.state = NameState.UNDECLARED

    def choice(self) -> str:
        """The declared name to decode the call with."""
        return closest_name(self.written, self.names)


def arguments_start(function: Mapping[str, Any]) -> str:
    """The start of a restarted call's arguments: ``{"KEY": `` for the schema's first required key, else ``""``.

    Example:
        >>> arguments_start({"name": "f", "parameters": {"type": "object", "required": ["city"]}})
        '{"city": '
    """
    parameters = function.get("parameters")
    required = parameters.get("required") if isinstance(parameters, Mapping) else None
    if isinstance(required, Sequence) and required and isinstance(required[0], str) and required[0]:
        return "{" + json.dumps(required[0], ensure_ascii=False) + ": "
    return ""
