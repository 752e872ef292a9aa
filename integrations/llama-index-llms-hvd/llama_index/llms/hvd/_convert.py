"""Pure helpers of the adapter (no engine): LlamaIndex types to and from hvd-agents'.

* :func:`to_openai_messages` turns LlamaIndex ``ChatMessage`` s into the OpenAI-shape
  dicts that :func:`hvd_agents.chat.conversation.prepare` takes. An assistant message's
  calls come from its ``ToolCallBlock`` s (or, from older integrations, from
  ``additional_kwargs["tool_calls"]``); a tool message's call id from
  ``additional_kwargs["tool_call_id"]``.
* :func:`reply_message` builds the assistant ``ChatMessage`` of a reply: a
  ``TextBlock`` with the content, one ``ToolCallBlock`` per valid call; invalid
  calls go to ``additional_kwargs["invalid_tool_calls"]``.
* :func:`tool_selections` reads the calls of a message back as ``ToolSelection`` s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel
from llama_index.core.llms.llm import ToolSelection

from hvd_agents.chat.toolcalls import ParsedOutput
from hvd_agents.errors import InvalidRequestError

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}
# Blocks that carry no prompt text: calls are rendered from the ToolCallBlocks,
# reasoning traces and cache markers of other providers are dropped.
_SKIPPED_BLOCKS = (ThinkingBlock, CachePoint)


def _message_text(index: int, message: ChatMessage) -> str:
    """The text blocks of a message, joined with newlines.

    Raises:
        InvalidRequestError: an image, audio, video, document or citation block.
    """
    texts: list[str] = []
    for number, block in enumerate(message.blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif not isinstance(block, (ToolCallBlock, *_SKIPPED_BLOCKS)):
            raise InvalidRequestError(
                f"messages[{index}].blocks[{number}]: {type(block).__name__} is not supported "
                "(HVD models are text-only)"
            )
    return "\n".join(texts)


def _openai_call(index: int, number: int, block: ToolCallBlock) -> dict[str, Any]:
    arguments = block.tool_kwargs
    return {
        "id": block.tool_call_id or f"call_{index}_{number}",
        "type": "function",
        "function": {
            "name": block.tool_name,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False),
        },
    }


def _legacy_calls(calls: Any) -> list[dict[str, Any]]:
    """``additional_kwargs["tool_calls"]`` of older integrations (OpenAI-shape dicts or models)."""
    return [call.model_dump() if isinstance(call, BaseModel) else dict(call) for call in calls or ()]


def to_openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Convert LlamaIndex chat messages to OpenAI-shape message dicts.

    System / developer, user, assistant (chatbot, model) and tool (function) roles
    map to ``system``, ``user``, ``assistant`` and ``tool``.

    Raises:
        InvalidRequestError: an item that is not a ``ChatMessage``, an unsupported
            role or a non-text block.
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise InvalidRequestError(f"messages[{index}] must be a ChatMessage, got {type(message).__name__}")
        role = _ROLES.get(message.role)
        if role is None:
            raise InvalidRequestError(f"messages[{index}] has unsupported role {message.role!r}")
        entry: dict[str, Any] = {"role": role, "content": _message_text(index, message)}
        if role == "assistant":
            blocks = [block for block in message.blocks if isinstance(block, ToolCallBlock)]
            calls = [_openai_call(index, number, block) for number, block in enumerate(blocks)]
            calls = calls or _legacy_calls(message.additional_kwargs.get("tool_calls"))
            if calls:
                entry["tool_calls"] = calls
        elif role == "tool":
            entry["tool_call_id"] = message.additional_kwargs.get("tool_call_id") or message.additional_kwargs.get(
                "name", ""
            )
        out.append(entry)
    return out


def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI-shape schemas of LlamaIndex tools (``BaseTool``) or of schemas given as mappings."""
    return [
        dict(tool) if isinstance(tool, Mapping) else tool.metadata.to_openai_tool(skip_length_check=True)
        for tool in tools
    ]


def invalid_calls(parsed: ParsedOutput) -> list[dict[str, Any]]:
    """The invalid calls of a reply as dicts: ``id``, ``name``, ``text`` (as written) and ``error``."""
    return [{"id": bad.id, "name": bad.name, "text": bad.text, "error": bad.error} for bad in parsed.invalid_tool_calls]


def reply_message(content: str, parsed: ParsedOutput) -> ChatMessage:
    """The assistant message of a reply: its text, then a ``ToolCallBlock`` per valid call."""
    blocks: list[Any] = [TextBlock(text=content)]
    blocks.extend(
        ToolCallBlock(tool_call_id=call.id, tool_name=call.name, tool_kwargs=dict(call.arguments))
        for call in parsed.tool_calls
    )
    additional: dict[str, Any] = {}
    if parsed.invalid_tool_calls:
        additional["invalid_tool_calls"] = invalid_calls(parsed)
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=additional)


def tool_selections(message: ChatMessage) -> list[ToolSelection]:
    """The message's ``ToolCallBlock`` s as ``ToolSelection`` s (string arguments are decoded)."""
    selections = []
    for block in message.blocks:
        if not isinstance(block, ToolCallBlock):
            continue
        arguments: Any = block.tool_kwargs
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                arguments = {}
        selections.append(
            ToolSelection(tool_id=block.tool_call_id or block.tool_name, tool_name=block.tool_name,
                          tool_kwargs=arguments if isinstance(arguments, dict) else {})
        )
    return selections
