"""Recorded agent conversations: what an example sent the model, call by call, as JSON.

An example run with ``--save FILE`` (:mod:`hvd_agents.bench.recorder`) writes every model
call it made: the OpenAI-shape messages of the call (tool calls and tool outputs included,
the earlier example exchanges that steer a small model too), the tool schemas, the
session id, the reply's forced start (a forced ``tool_choice`` pre-fills the start of the
call), the stop strings (``</tool_call>`` after a forced call, ``<tool_call>`` under
``tool_choice="none"``), the token budget, and what the model generated. The call's
messages are kept once: a conversation holds the longest message list, and each call the
number of its leading messages it sent (or its own list, when a call rewrote the history).

Replaying a call (``hvd-agents bench-agents``) renders the same messages through
:func:`hvd_agents.chat.conversation.prepare`, which gives the same prompt token ids as the
recording run (checked against :attr:`RecordedCall.prompt_sha256`).

The four examples' recordings ship with the package (``agent_conversations/*.json``):
:func:`load_conversations` reads them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hvd_agents.errors import InvalidRequestError

FORMAT = 1
PACKAGE_DIR = "agent_conversations"


def prompt_digest(prompt_ids: Sequence[int]) -> str:
    """SHA-256 (hex) of prompt token ids, to check a replayed prompt without storing it.

    Example:
        >>> prompt_digest([1, 2]) == prompt_digest((1, 2)) != prompt_digest([12])
        True
    """
    return hashlib.sha256(",".join(str(int(t)) for t in prompt_ids).encode()).hexdigest()


@dataclass(frozen=True)
class RecordedCall:
    """One model call of a recorded conversation.

    Attributes:
        messages: how many leading messages of the conversation's list the call sent (an
            int), or the call's own message list when it does not extend that list.
        tools: index into the conversation's ``tool_sets`` (None: no tools).
        session_id: the session id the call passed (None: derived from the messages).
        assistant_prefix: the reply's forced start (not generated; part of the prompt).
        stop: the call's stop strings.
        max_new_tokens: its token budget.
        method: the decoding method of the recording run.
        prompt_tokens: length of the prompt it decoded from.
        prompt_sha256: :func:`prompt_digest` of that prompt.
        token_ids: the tokens it generated (greedy; a final stop id included).
        text: their text.
        finish_reason: ``"stop"`` or ``"length"``.
    """

    messages: int | list[dict[str, Any]]
    tools: int | None
    session_id: str | None
    assistant_prefix: str
    stop: tuple[str, ...]
    max_new_tokens: int
    method: str
    prompt_tokens: int
    prompt_sha256: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordedCall:
        return cls(**{**data, "stop": tuple(data["stop"]), "token_ids": tuple(data["token_ids"])})


@dataclass(frozen=True)
class RecordedConversation:
    """One example run: its model calls in order, and what they share.

    Attributes:
        name: the example's name (``airline_langchain``, ...).
        title: one line on what the agent does.
        command: the command that recorded it.
        steering: how the example steers the embedded model (empty when it does not).
        messages: the longest message list the calls sent (a call's reply is its ``text``).
        tool_sets: the distinct tool-schema lists the calls sent.
        calls: the model calls, in order.
    """

    name: str
    title: str
    command: str
    steering: str
    messages: list[dict[str, Any]]
    tool_sets: list[list[dict[str, Any]]]
    calls: list[RecordedCall] = field(default_factory=list)

    def call_messages(self, index: int) -> list[dict[str, Any]]:
        """The messages call ``index`` sent."""
        sent = self.calls[index].messages
        return list(sent) if isinstance(sent, list) else self.messages[:sent]

    def call_tools(self, index: int) -> list[dict[str, Any]] | None:
        """The tool schemas call ``index`` sent (None: none)."""
        which = self.calls[index].tools
        return None if which is None else self.tool_sets[which]

    @property
    def generated_tokens(self) -> int:
        return sum(len(call.token_ids) for call in self.calls)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordedConversation:
        if data.get("format") != FORMAT:
            raise InvalidRequestError(f"unknown recorded-conversation format {data.get('format')!r} (want {FORMAT})")
        fields = {key: value for key, value in data.items() if key not in ("format", "calls")}
        return cls(**fields, calls=[RecordedCall.from_json(call) for call in data["calls"]])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> RecordedConversation:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))


def shipped_names() -> list[str]:
    """Names of the conversations shipped with the package, sorted."""
    folder = resources.files("hvd_agents.bench") / PACKAGE_DIR
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".json"))


def load_conversations(names: Sequence[str] | None = None) -> list[RecordedConversation]:
    """The shipped conversations (all when ``names`` is None), in the order asked.

    A name ending in ``.json`` is a file an example's ``--save`` wrote, read as it is.

    Raises:
        InvalidRequestError: an unknown name (the message lists the shipped ones).
    """
    known = shipped_names()
    wanted = list(known) if names is None else list(names)
    unknown = [name for name in wanted if name not in known and not name.endswith(".json")]
    if unknown:
        raise InvalidRequestError(f"unknown conversation {', '.join(unknown)}: choose from {', '.join(known)}, "
                                  "or give a .json file an example's --save wrote")
    folder = resources.files("hvd_agents.bench") / PACKAGE_DIR
    return [RecordedConversation.load(name) if name.endswith(".json") else
            RecordedConversation.from_json(json.loads((folder / f"{name}.json").read_text(encoding="utf-8")))
            for name in wanted]
