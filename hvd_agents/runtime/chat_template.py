"""A model's chat template: whether it has one, giving it one, and plain text for models without.

A model's chat template is its tokenizer's ``chat_template``: from ``tokenizer_config.json``
or ``chat_template.jinja`` for an HF model, from the ``tokenizer.chat_template`` metadata of
a GGUF file (transformers reads it), rendered as transformers renders it. A base model has
none: it continues text, and wrapping a prompt in a template it was never trained on (ChatML,
say) makes it answer with the template's markers. So:

* :func:`plain_prompt_ids` is how a raw prompt (``generate --raw``, ``/v1/completions``, and
  ``generate`` on a model without a template) becomes token ids: the text and the tokenizer's
  own special tokens (a BOS where the model adds one), never a template.
* :func:`require_chat_template` refuses a chat request to a model without a template, with an
  error that names what is missing and how to give one.
* :func:`read_chat_template` reads a template file (``--chat-template FILE``) and
  :func:`set_chat_template` gives it to a tokenizer, before any request is rendered.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jinja2

from hvd_agents.errors import InvalidRequestError

NO_TEMPLATE_HINT = (
    "give it one (--chat-template FILE for generate and serve, or "
    "load_model(..., chat_template=read_chat_template(FILE)) in Python), "
    "or send the text as a plain completion (generate --raw, /v1/completions)"
)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template (a non-empty ``chat_template``)."""
    return bool(getattr(tokenizer, "chat_template", None))


def require_chat_template(tokenizer: Any) -> None:
    """Refuse a chat request to a model whose tokenizer has no chat template.

    Raises:
        InvalidRequestError: ``tokenizer.chat_template`` is missing or empty.
    """
    if not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        raise InvalidRequestError(f"{name} has no chat template (tokenizer.chat_template), so it cannot take "
                                  f"chat messages: {NO_TEMPLATE_HINT}")


def read_chat_template(path: str | os.PathLike) -> str:
    """The text of a chat template file (a Jinja template, as transformers renders it).

    Raises:
        InvalidRequestError: the file cannot be read, is empty, or is not a valid Jinja template.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the chat template {os.fspath(path)!r}: {exc}") from exc
    if not text.strip():
        raise InvalidRequestError(f"the chat template {os.fspath(path)!r} is empty")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidRequestError(f"the chat template {os.fspath(path)!r} is not a valid Jinja template "
                                  f"(line {exc.lineno}: {exc.message})") from exc
    return text


def set_chat_template(tokenizer: Any, template: str) -> None:
    """Give ``tokenizer`` the chat template ``template`` (its text), replacing any it had."""
    tokenizer.chat_template = template


def plain_prompt_ids(tokenizer: Any, text: str) -> Sequence[int]:
    """``text`` as prompt token ids for a plain completion: no chat template, the tokenizer's own
    special tokens (the BOS a model such as Gemma is trained to see first, where its tokenizer adds one)."""
    return list(tokenizer(text).input_ids)
