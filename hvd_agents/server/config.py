"""How the server is set up: what it serves, where it listens, and its bounds."""

from __future__ import annotations

from dataclasses import dataclass

from hvd_agents.chat.settings import DEFAULT_MODEL_NAME
from hvd_agents.engine.params import DEFAULT_METHOD

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Requests queued or running before new ones get 503 + Retry-After: a few per client
# of a 16-client agent harness; each waiting request holds only its parsed body.
DEFAULT_MAX_PENDING = 64
# Request bodies larger than this get 413: long agent conversations with many tool
# outputs fit many times over; anything larger would not fit a local model's context.
DEFAULT_MAX_BODY_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ServerConfig:
    """The server's settings (``hvd-agents serve`` flags).

    Attributes:
        model: hub id, local path or .gguf file; None = the embedded SmolLM2-135M-Instruct.
        device: "cpu", "cuda", ...; None picks CUDA when available.
        draft_model: a smaller model with the same tokenizer that drafts; None = the
            target's shipped draft head, if any.
        served_model_name: the id clients send as ``model`` and ``/v1/models`` lists;
            None = ``model`` (or the embedded model's name). ``model`` itself is accepted too.
        method: the decoding method when a request names none.
        host: the address to bind; loopback by default, so nothing outside this machine
            can reach the server unless asked for.
        port: the TCP port.
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <key>``.
        max_pending: generation requests queued or running before 503s.
        max_batch: generations decoded together (the engine's ``max_batch``); 1 runs
            them one at a time.
        request_timeout_s: the most seconds a generation may take, waiting in line
            included; past it the request gets a 504 (a stream: an error event).
            None: no limit.
        max_body_bytes: largest request body accepted (413 above it).
        retry_after_s: ``Retry-After`` of 503 answers, in seconds.
        chat_template: a chat template (its text) to render chat requests with, instead of
            the model's own; None keeps the model's (a model without one refuses chat requests
            and takes plain completions).
    """

    model: str | None = None
    device: str | None = None
    draft_model: str | None = None
    served_model_name: str | None = None
    method: str = DEFAULT_METHOD
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    max_pending: int = DEFAULT_MAX_PENDING
    max_batch: int = 1
    request_timeout_s: float | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    retry_after_s: int = 1
    chat_template: str | None = None

    @property
    def model_name(self) -> str:
        """The served model's id."""
        if self.served_model_name:
            return self.served_model_name
        return self.model if self.model is not None else DEFAULT_MODEL_NAME

    def serves(self, name: str) -> bool:
        """Whether a request's ``model`` names the served model."""
        return name in {self.model_name, self.model, DEFAULT_MODEL_NAME if self.model is None else None} - {None}
