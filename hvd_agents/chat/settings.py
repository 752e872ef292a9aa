"""The generation settings of a chat model: the one declaration of their defaults and docs.

Both adapters (``langchain_hvd.ChatHVD``, ``llama_index.llms.hvd.HVD``) expose them as
fields: an adapter's pydantic field is ``Field(**field_kwargs(name))``.
``ChatSettings.from_fields`` reads an adapter's values (a call's keyword arguments
override the :data:`DECODE_FIELDS`) and :meth:`ChatSettings.to_params` turns them into
:class:`~hvd_agents.engine.GenerationParams`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from hvd_agents.engine import GenerationParams
from hvd_agents.engine.params import DEFAULT_METHOD

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""The model name adapters report when no ``model`` is given (the embedded model)."""

DECODE_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "method", "num_draft_tokens", "timeout")
"""The :class:`ChatSettings` a call's keyword arguments may override."""

def _setting(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class ChatSettings:
    """The generation settings of a chat model: the one declaration of their defaults and docs.

    Each adapter declares one pydantic field per setting with
    ``Field(**field_kwargs(name))`` (plus its own constraints or alias), so both
    adapters default and document them alike. Values are checked where they are
    used: :meth:`to_params` (and the engine) raise ``InvalidRequestError``.
    """

    model: str | None = _setting(
        None, "Hub id, local model directory or .gguf file; None = the embedded SmolLM2-135M-Instruct."
    )
    device: str | None = _setting(
        None, "'cpu', 'cuda', ...; None picks CUDA when available. Used when the engine is created here."
    )
    draft_model: str | None = _setting(
        None,
        "A smaller model with the same tokenizer that drafts (methods 'model' and 'hvd'); None = the target's "
        "shipped draft head, if any. Used when the engine is created here.",
    )
    method: str = _setting(
        DEFAULT_METHOD,
        "Decoding method: a name in hvd_agents.drafters.available_methods() ('hvd', 'hvd-cache', 'model', 'pld', "
        "'ar') or a drafter added to the injected engine.",
    )
    max_tokens: int = _setting(256, "Most tokens generated per call.")
    temperature: float = _setting(0.0, "Sampling temperature; 0 = greedy.")
    top_p: float | None = _setting(None, "Nucleus sampling mass; None = no cut-off.")
    top_k: int | None = _setting(None, "Top-k cut-off; None = none.")
    seed: int | None = _setting(None, "Sampling seed; None = a fresh one per call.")
    num_draft_tokens: int | None = _setting(
        None, "Most draft tokens verified per step (K); None = the method's default."
    )
    stop: Sequence[str] | None = _setting(None, "Stop strings for every call (merged with a call's own stop).")
    timeout: float | None = _setting(
        None, "Seconds a call may take, waiting for the engine included; past it the call raises "
        "hvd_agents.RequestTimeoutError (a stream keeps what it streamed). None = no limit."
    )

    @classmethod
    def from_fields(cls, source: Any, overrides: Mapping[str, Any] | None = None) -> ChatSettings:
        """The settings of ``source`` (an adapter), with a call's :data:`DECODE_FIELDS` from ``overrides``."""
        overrides = overrides or {}
        return cls(**{
            spec.name: overrides[spec.name] if spec.name in DECODE_FIELDS and spec.name in overrides
            else getattr(source, spec.name)
            for spec in fields(cls)
        })

    def to_params(self, stop: Sequence[str] = ()) -> GenerationParams:
        """The engine parameters (unset optional knobs keep the engine's defaults).

        Args:
            stop: the call's stop strings (``self.stop`` is not added here).

        Raises:
            InvalidRequestError: a value out of range.
        """
        optional = {
            name: getattr(self, name) for name in ("top_p", "top_k", "num_draft_tokens") if getattr(self, name) is not None
        }
        return GenerationParams(
            max_new_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            method=self.method,
            stop=tuple(stop),
            timeout_s=self.timeout,
            **optional,
        )


SETTING_NAMES = tuple(spec.name for spec in fields(ChatSettings))
"""Names of the :class:`ChatSettings`, in declaration order."""


def field_kwargs(name: str) -> dict[str, Any]:
    """``default`` and ``description`` of setting ``name``, for the adapter's ``Field(...)``.

    Raises:
        KeyError: ``name`` is no :class:`ChatSettings` field.
    """
    spec = ChatSettings.__dataclass_fields__[name]
    return {"default": spec.default, "description": spec.metadata["doc"]}
