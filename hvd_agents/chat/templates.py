"""The earlier import path of :mod:`hvd_agents.chat.prompt_templates` (prompt templates tuned for cache reuse).

``from hvd_agents.chat.templates import load_template, canonicalize_tools`` is what earlier
documentation showed, so it keeps working; nothing in the package imports this module
(``tests/test_layers.py`` checks it), and new code imports :mod:`hvd_agents.chat.prompt_templates`.
"""

from hvd_agents.chat.prompt_templates import (
    FUNCTION_KEY_ORDER,
    SCHEMA_KEY_ORDER,
    TEMPLATES_ENV,
    Template,
    apply_system_template,
    available_templates,
    canonicalize_tools,
    load_template,
    templates_dir,
)

__all__ = [
    "FUNCTION_KEY_ORDER",
    "SCHEMA_KEY_ORDER",
    "TEMPLATES_ENV",
    "Template",
    "apply_system_template",
    "available_templates",
    "canonicalize_tools",
    "load_template",
    "templates_dir",
]
