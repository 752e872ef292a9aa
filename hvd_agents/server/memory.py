"""Giving freed memory back to the operating system after a large request.

Parsing a 10 MB body and tokenizing a long prompt allocate tens to hundreds of MB in
many small pieces (the body's copies on the event loop's thread; the tokenizer's words,
offsets and ids in the preparing thread's malloc arena). Once freed, glibc keeps those
pages: it returns only the free space at the top of a heap, so every large request left
the process larger (measured on the embedded model: +18 MB per refused 600,000-character
prompt, hundreds of MB per 10 MB one, without end). ``malloc_trim(0)`` returns the free
pages of every arena; :class:`TrimMiddleware` calls it, in a thread, after answering a
request whose body reached :data:`LARGE_BODY_BYTES`, where it costs little beside the
work that request caused. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

# Bodies from which answering a request is followed by a trim: a prompt of a quarter of
# a million characters is ~60,000 tokens of tokenizer work, some 20 MB of transient allocations.
LARGE_BODY_BYTES = 1 << 18


@lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_memory() -> bool:
    """Return the allocator's free pages to the operating system (glibc); True if it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class TrimMiddleware:
    """ASGI middleware: after answering a request whose body reached ``min_bytes``, release free memory."""

    def __init__(self, app: Callable[..., Awaitable[None]], min_bytes: int = LARGE_BODY_BYTES) -> None:
        self.app = app
        self.min_bytes = min_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = 0

        async def counting_receive() -> MutableMapping[str, Any]:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counting_receive, send)
        finally:
            if size >= self.min_bytes:
                await asyncio.to_thread(release_free_memory)
