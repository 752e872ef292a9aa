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
from hvd_agents.errors import InvalidRequestError
from hvd_agents.structure import PromptStructure


def prepare(
    engine: Engine,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    session_id: str | None = None,
    assistant_prefix: str = "",
) -> PromptStructure:
    """Analyse a chat request and register its structure in ``engine.cache_store``.

    Args:
        engine: the engine that will decode the request (its tokenizer renders it).
        messages: the conversation, OpenAI shape.
        tools: tool schemas, OpenAI shape.
        session_id: the conversation's id; derived from its first messages when None.
        assistant_prefix: forced start of the reply (e.g. a forced tool call).

    Returns:
        The prompt's structure; ``structure.prompt_ids`` is the prompt.

    Raises:
        InvalidRequestError: the messages or tools are malformed, or the engine has
            no tokenizer.
    """
    if engine.tokenizer is None:
        raise InvalidRequestError("chat requests need an engine with a tokenizer")
    structure = analyze(engine.tokenizer, messages, tools, session_id=session_id, assistant_prefix=assistant_prefix)
    register(engine.cache_store, structure)
    return structure
