"""The chat layer: OpenAI-shape messages (and tool schemas) to prompt text and ids.

Contract:

* Messages are plain dicts in OpenAI shape: ``role`` (``system``, ``user``,
  ``assistant``, ``tool``), ``content`` (``str`` or a list of
  ``{"type": "text", "text": ...}`` parts; missing or ``None`` only on assistant
  messages, where it renders as ``""``), and on assistant messages optional
  ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments"}}]``,
  arguments a JSON string or an object; a string that is not valid JSON, such as a
  call cut short by ``max_tokens`` and sent back as the history holds it, is rendered
  as the text it is, with a warning in the log). Other keys are ignored.
* :func:`to_template_messages` validates them (raising
  :class:`~hvd_agents.errors.InvalidRequestError` naming the offending index: a
  message that is not an object, a missing or unknown role, a missing content on a
  system, user or tool message, content of a wrong type, a non-text content part
  such as an image ("not supported": the models are text-only), a malformed tool
  call, invalid or duplicate tool schemas) and
  lowers them to ``{"role", "content"}`` dicts whose content is always a ``str``:
  the Hermes tools block (:mod:`hvd_agents.chat.toolcalls`) is appended to the leading
  system message (created if missing), assistant tool calls are rendered as
  ``<tool_call>`` blocks after the content, and tool results are wrapped in
  ``<tool_response>`` tags.
* Rendering is deterministic and prefix-stable: the prompt of ``messages[:n]``
  (without generation prompt) is a text prefix of the prompt of ``messages[:n+1]``.
* :func:`render_prompt` uses the tokenizer's chat template when it has one, else a
  built-in ChatML template; :func:`encode_prompt` tokenizes that text without
  adding special tokens (the template already holds them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hvd_agents.chat.toolcalls import (
    check_unicode,
    render_raw_tool_call,
    render_tool_call,
    render_tools_system_block,
    tool_list,
)
from hvd_agents.errors import InvalidRequestError

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
CONTENT_REQUIRED = ("system", "user", "tool")
"""Roles whose messages must have a content (an assistant message may be tool calls only)."""
TEXT_ONLY = "the model reads text only"
CHATML_MESSAGE = "<|im_start|>{role}\n{content}<|im_end|>\n"
CHATML_GENERATION_PROMPT = "<|im_start|>assistant\n"


def to_template_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> list[dict]:
    """Validate OpenAI-shape messages and lower them to template messages.

    Args:
        messages: the conversation, OpenAI shape.
        tools: tool schemas (OpenAI shape or bare function dicts), or None.

    Returns:
        A new list of ``{"role": str, "content": str}`` dicts.

    Raises:
        InvalidRequestError: ``messages`` not a list or empty, a message that is
            not an object, a missing or unknown role, no content on a system, user
            or tool message, content of the wrong type, a non-text content part, a
            malformed tool call, ``tools`` not a list, an invalid tool schema, or two
            tools of one name.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError(f"messages must be a list of objects, got {type(messages).__name__}")
    if not messages:
        raise InvalidRequestError("messages is empty")
    tools = tool_list(tools)
    out = [_lower_message(index, message) for index, message in enumerate(messages)]
    if tools:
        block = render_tools_system_block(tools)
        if out[0]["role"] == "system":
            system = out[0]["content"]
            out[0] = {"role": "system", "content": f"{system}\n\n{block}" if system else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _lower_message(index: int, message: Any) -> dict:
    """One validated template message."""
    if not isinstance(message, Mapping):
        raise InvalidRequestError(f"messages[{index}] must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role is None:
        raise InvalidRequestError(f"messages[{index}] has no role (expected one of {', '.join(ROLES)})")
    if role not in ROLES:
        raise InvalidRequestError(f"messages[{index}] has unknown role {role!r} (expected one of {', '.join(ROLES)})")
    if message.get("content") is None and role in CONTENT_REQUIRED:
        raise InvalidRequestError(f"messages[{index}] ({role}) has no content; only assistant messages may omit it")
    content = _content_text(index, message.get("content"))
    if role == "tool":
        check_unicode(f"messages[{index}]", content)
        return {"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"}
    tool_calls = message.get("tool_calls")
    if tool_calls:
        if role != "assistant":
            raise InvalidRequestError(f"messages[{index}] has tool_calls but role {role!r} (only assistant)")
        blocks = "\n".join(_render_call(index, number, call) for number, call in enumerate(_as_list(index, tool_calls)))
        content = f"{content}\n{blocks}" if content else blocks
    check_unicode(f"messages[{index}]", content)
    return {"role": role, "content": content}


def _content_text(index: int, content: Any) -> str:
    """The content as a string: ``None`` is ``""``, text parts are joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = []
        for number, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if isinstance(kind, str) and kind != "text":
                raise InvalidRequestError(f"messages[{index}].content[{number}]: {unsupported_part(kind)}")
            if not isinstance(part, Mapping) or kind != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(
                    f"messages[{index}].content[{number}] must be a {{'type': 'text', 'text': str}} part"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidRequestError(
        f"messages[{index}].content must be a string, null or a list of text parts, got {type(content).__name__}"
    )


def unsupported_part(kind: str) -> str:
    """The message refusing a content part of type ``kind`` (an image, audio, a file, ...)."""
    return f"content parts of type {kind!r} are not supported: {TEXT_ONLY}"


def _as_list(index: int, tool_calls: Any) -> Sequence[Any]:
    if isinstance(tool_calls, (str, bytes)) or not isinstance(tool_calls, Sequence):
        raise InvalidRequestError(f"messages[{index}].tool_calls must be a list, got {type(tool_calls).__name__}")
    return tool_calls


def _render_call(index: int, number: int, call: Any) -> str:
    """One assistant tool call as a ``<tool_call>`` block."""
    where = f"messages[{index}].tool_calls[{number}]"
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        raise InvalidRequestError(f"{where} must be an object with a 'function' object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}.function.name must be a non-empty string")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError) as exc:
            # A call cut short (max_tokens) or written wrong by the model, sent back as the history holds
            # it: render the text it was, so the conversation goes on.
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            logger.warning("%s.function.arguments is not valid JSON (%s): rendered as the text it is", where, reason)
            return render_raw_tool_call(name, arguments)
    if not isinstance(arguments, Mapping):
        raise InvalidRequestError(f"{where}.function.arguments must be a JSON object, got {type(arguments).__name__}")
    try:
        return render_tool_call(name, arguments)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"{where}.function.arguments cannot be written as JSON: {exc}") from None


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """Render the conversation as prompt text.

    Args:
        tokenizer: a HuggingFace tokenizer; its ``chat_template`` is used when set,
            else the built-in ChatML template.
        messages: the conversation, OpenAI shape (see :func:`to_template_messages`).
        tools: tool schemas, or None.
        add_generation_prompt: end with the opening of an assistant turn.

    Returns:
        The prompt text.

    Raises:
        InvalidRequestError: see :func:`to_template_messages`.
    """
    template_messages = to_template_messages(messages, tools)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            template_messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        if not isinstance(text, str):  # defensive: some versions wrap the text
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text
    logger.debug("tokenizer has no chat template; using built-in ChatML")
    text = "".join(CHATML_MESSAGE.format(role=m["role"], content=m["content"]) for m in template_messages)
    return text + CHATML_GENERATION_PROMPT if add_generation_prompt else text


def encode_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    assistant_prefix: str = "",
) -> list[int]:
    """Render the conversation (see :func:`render_prompt`) and tokenize it.

    Args:
        assistant_prefix: text the assistant turn is forced to start with (e.g. the
            opening of a tool call, see :func:`hvd_agents.chat.toolcalls.forced_call_prefix`);
            the model continues after it, so callers prepend it to the output.

    Returns:
        The prompt token ids (no special tokens added beyond the template's own).

    Raises:
        InvalidRequestError: see :func:`to_template_messages`; also an
            ``assistant_prefix`` without ``add_generation_prompt``.
    """
    if assistant_prefix and not add_generation_prompt:
        raise InvalidRequestError("assistant_prefix needs add_generation_prompt=True")
    text = render_prompt(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
    return list(tokenizer(text + assistant_prefix, add_special_tokens=False).input_ids)
