"""Cheap refusals: a prompt's size bounds its token count from below, before anything is tokenized.

Tokenizing a 10 MB prompt takes seconds and hundreds of MB only to learn that it does
not fit the context window. No token covers more characters than the tokenizer's
longest vocabulary entry (byte-level BPE: one entry character per byte, so per text
character at most; SentencePiece: one per character, byte-fallback entries are
longer than what they cover), so text holding ``c`` characters other than whitespace
is at least ``ceil(c / longest)`` tokens. Whitespace is not counted because chat
templates may trim it and some tokenizers fold runs of it. A chat message is at
least one token too. A request whose lower bound already fills the context window
is refused with ``context_length_exceeded`` at once; the rest is tokenized off the
generation worker and checked exactly (:mod:`hvd_agents.server.jobs`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from hvd_agents.server.errors import APIError, invalid

# The characters str.isspace() accepts (tests/test_server_hostile.py checks the list).
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


@lru_cache(maxsize=8)
def longest_token_chars(tokenizer: Any) -> int | None:
    """The longest vocabulary entry of ``tokenizer``, in characters (None: it lists no vocabulary)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    lengths = [len(token) for token in get_vocab() if isinstance(token, str)]
    return max(lengths) if lengths else None


def min_tokens(texts: Iterable[str], longest: int) -> int:
    """A lower bound on the tokens of ``texts``: their non-whitespace characters over ``longest``."""
    chars = 0
    for text in texts:
        chars += len(text) - sum(text.count(space) for space in WHITESPACE)
    return math.ceil(chars / longest)


def check_chat_size(messages: Sequence[Mapping[str, Any]], tokenizer: Any, context_window: int) -> int:
    """Refuse a conversation that cannot fit ``context_window`` by its size alone.

    Returns:
        The characters of its message texts.

    Raises:
        APIError: 400 ``context_length_exceeded`` naming ``messages``.
    """
    if len(messages) >= context_window:
        raise _too_long(f"{len(messages)} messages", context_window, "messages")
    texts = list(_message_texts(messages))
    _check_texts(texts, tokenizer, context_window, "messages")
    return sum(len(text) for text in texts)


def check_completion_size(prompt: str | Sequence[int], tokenizer: Any, context_window: int) -> int:
    """Refuse a raw prompt (text or token ids) that cannot fit ``context_window`` by its size alone.

    Returns:
        The characters of a text prompt (0 for token ids).

    Raises:
        APIError: 400 ``context_length_exceeded`` naming ``prompt``.
    """
    if not isinstance(prompt, str):
        if len(prompt) >= context_window:
            raise _too_long(f"{len(prompt)} tokens", context_window, "prompt")
        return 0
    _check_texts([prompt], tokenizer, context_window, "prompt")
    return len(prompt)


def _check_texts(texts: Sequence[str], tokenizer: Any, context_window: int, param: str) -> None:
    longest = longest_token_chars(tokenizer) if tokenizer is not None else None
    if longest is None or sum(len(text) for text in texts) < context_window * longest:  # short: nothing to count
        return
    bound = min_tokens(texts, longest)
    if bound >= context_window:
        raise _too_long(f"at least {bound} tokens", context_window, param)


def _message_texts(messages: Sequence[Mapping[str, Any]]) -> Iterable[str]:
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    yield part["text"]


def _too_long(size: str, context_window: int, param: str) -> APIError:
    return invalid(f"the prompt has {size} but the model's context window is {context_window}: "
                   "no room for a new token", param, "context_length_exceeded")
