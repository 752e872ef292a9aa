"""The former name of :mod:`hvd_agents.chat.render` (rendering messages to prompt text and ids).

Kept so that code importing ``hvd_agents.chat.template`` keeps working; new code imports
:mod:`hvd_agents.chat.render` (or ``hvd_agents.chat.encode_prompt`` / ``render_prompt``).
"""

from hvd_agents.chat.render import (
    CHATML_GENERATION_PROMPT,
    CHATML_MESSAGE,
    CONTENT_REQUIRED,
    ROLES,
    TEXT_ONLY,
    encode_prompt,
    render_prompt,
    to_template_messages,
    unsupported_part,
)

__all__ = [
    "CHATML_GENERATION_PROMPT",
    "CHATML_MESSAGE",
    "CONTENT_REQUIRED",
    "ROLES",
    "TEXT_ONLY",
    "encode_prompt",
    "render_prompt",
    "to_template_messages",
    "unsupported_part",
]
