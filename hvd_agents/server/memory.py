"""Giving freed memory back to the operating system after a large request.

Tokenizing a long prompt allocates tens of MB in many small pieces (the tokenizer's
words, offsets and ids, in the preparing thread's malloc arena). Once freed, glibc
keeps those pages: it returns only the free space at the top of a heap, so every
large preparation left the process larger (measured on the embedded model: +18 MB per
600,000-character prompt, without end). ``malloc_trim(0)`` returns the free pages
of every arena. It is called after a preparation whose prompt text reached
:data:`LARGE_PROMPT_CHARS`, where it costs little beside the tokenization it follows.
Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import lru_cache

logger = logging.getLogger(__name__)

# Prompt text (characters) from which a request's preparation is followed by a trim:
# about 100,000 tokens of the tokenizer's work, some 20 MB of transient allocations.
LARGE_PROMPT_CHARS = 1 << 18


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
