"""A short digest of a benchmark's output tokens, so two runs (two commits, two machines) can show that
they produced the same tokens without printing them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def output_digest(outputs: Iterable[Sequence[int]]) -> str:
    """The first 16 hex digits of the SHA-256 of the outputs' token ids, in order.

    Example:
        >>> output_digest([(1, 2), (3,)]) == output_digest([[1, 2], [3]])
        True
        >>> output_digest([(1, 2), (3,)]) == output_digest([(1,), (2, 3)])
        False
    """
    digest = hashlib.sha256()
    for tokens in outputs:
        digest.update(",".join(str(int(t)) for t in tokens).encode())
        digest.update(b";")
    return digest.hexdigest()[:16]
