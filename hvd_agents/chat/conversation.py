"""From a chat request to an engine request: the one path every front end takes.

``prepare(engine, messages, tools)`` renders the conversation, analyses its
structure (:mod:`hvd_agents.chat.analyzer`), registers the system prompt, tool schemas,
call skeletons and prior turns in the engine's cache store for the session, and
returns the :class:`~hvd_agents.structure.PromptStructure` to decode from::

    structure = prepare(engine, messages, tools)
    result = engine.generate(structure.prompt_ids, params, structure=structure)

The CLI, the demo, the benchmarks and the LangChain / LlamaIndex adapters all go
through here, so agent loops get the same cache drafts whatever the front end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hvd_agents.chat.analyzer import analyze, register
from hvd_agents.engine import Engine
from hvd_agents.errors import ContextLengthError, InvalidRequestError
from hvd_agents.runtime.chat_template import require_chat_template
from hvd_agents.structure import PromptStructure


def prepare(
    engine: Engine,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    session_id: str | None = None,
    assistant_prefix: str = "",
    require_fit: bool = False,
) -> PromptStructure:
    """Analyse a chat request and register its structure in ``engine.cache_store``.

    Args:
        engine: the engine that will decode the request (its tokenizer renders it).
        messages: the conversation, OpenAI shape.
        tools: tool schemas, OpenAI shape.
        session_id: the conversation's id; derived from its first messages when None.
        assistant_prefix: forced start of the reply (e.g. a forced tool call).
        require_fit: refuse a prompt that leaves no room for a new token in the
            engine's context window, before anything is registered (for callers
            that run the request next: the engine would refuse it anyway, and a
            prompt that cannot run then leaves nothing in the store). False
            analyses and registers a conversation of any length.

    Returns:
        The prompt's structure; ``structure.prompt_ids`` is the prompt.

    Raises:
        InvalidRequestError: the messages or tools are malformed, or the engine has
            no tokenizer or its tokenizer no chat template (a base model: see
            :mod:`hvd_agents.runtime.chat_template`).
        ContextLengthError: with ``require_fit``, the prompt leaves no room for a new
            token in the engine's context window.
    """
    if engine.tokenizer is None:
        raise InvalidRequestError("chat requests need an engine with a tokenizer")
    require_chat_template(engine.tokenizer)
    structure = analyze(engine.tokenizer, messages, tools, session_id=session_id, assistant_prefix=assistant_prefix)
    if require_fit:
        check_fits(engine, structure.prompt_ids)
    register(engine.cache_store, structure)
    return structure


def check_fits(engine: Engine, prompt_ids: Sequence[int]) -> None:
    """Refuse a prompt that leaves no room for a new token in ``engine``'s context window.

    The engine refuses it too, when it runs; front ends call this first to refuse it
    before registering it or queueing it.

    Raises:
        ContextLengthError: the prompt has ``engine.context_window`` tokens or more.
    """
    if len(prompt_ids) >= engine.context_window:
        raise ContextLengthError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context window is "
            f"{engine.context_window}: no room for a new token"
        )
