"""API keys: with a key configured, every route but ``/health`` needs ``Authorization: Bearer <key>``.

The comparison takes constant time. A missing or wrong key is a 401 in the OpenAI
envelope (``type`` ``authentication_error``, ``code`` ``invalid_api_key``), which the
OpenAI client does not retry.
"""

from __future__ import annotations

import hmac

from hvd_agents.server.errors import APIError

OPEN_PATHS = frozenset({"/health"})


def check_api_key(path: str, authorization: str | None, api_key: str | None) -> None:
    """Refuse a request to ``path`` whose ``Authorization`` header does not carry ``api_key``.

    Raises:
        APIError: 401 when a key is configured and the header lacks it.
    """
    if api_key is None or path in OPEN_PATHS:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                       "authentication_error", None, "invalid_api_key")
