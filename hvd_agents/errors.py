"""Exceptions raised by hvd-agents.

Every error a caller can trigger with bad input derives from :class:`HVDError`, so
``except HVDError`` catches all of them, and each also derives from the builtin an
ordinary Python user would expect (``ValueError`` for bad arguments, ``LookupError``
for a model that cannot be found), so existing handlers keep working.
"""

from __future__ import annotations


class HVDError(Exception):
    """Base class of every error raised by hvd-agents."""


class ModelNotFoundError(HVDError, LookupError):
    """The model id or path names nothing that can be loaded (no such path, hub id or GGUF file)."""


class ModelLoadError(HVDError, RuntimeError):
    """The model exists but could not be loaded (unsupported architecture, broken files, ...)."""


class InvalidRequestError(HVDError, ValueError):
    """A request argument is invalid: empty messages, bad sampling parameters, unknown method, ..."""


class ContextLengthError(InvalidRequestError):
    """The prompt (plus at least one new token) does not fit in the model's context window."""


class StoreFormatError(HVDError, ValueError):
    """A saved cache store file is missing, truncated, corrupt or of another format."""


class TraceFormatError(HVDError, ValueError):
    """An agent trace file (for ``hvd-agents analyze``) is missing or malformed; the message names file and line."""


class RequestTimeoutError(HVDError, TimeoutError):
    """A request ran past its ``timeout_s`` (waiting for the engine included); the message says where it was."""


class QueueFullError(HVDError, RuntimeError):
    """A batching engine already holds ``max_queue`` requests waiting for a place in the batch."""
