"""A GGUF file's tokenizer, built as ``AutoTokenizer`` builds it, without its second read of the file's config.

``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` parses the file's config again (through
``gguf.GGUFReader`` for most architectures: tens of seconds on a large vocabulary) only to choose the tokenizer
class. :func:`gguf_tokenizer` chooses it from the config already read (the class transformers registers for
the config's type, as ``AutoTokenizer`` does for a file with no tokenizer files beside it) and lets that class
read the vocabulary from the file (transformers' fast reader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tokenizer_class(config) -> type:
    """The tokenizer class ``AutoTokenizer`` takes for a GGUF file whose config is ``config``."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    chosen = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if chosen is None or getattr(chosen, "__name__", "") == "MistralCommonBackend":  # needs mistral-format files
        return TokenizersBackend
    return chosen


def gguf_tokenizer(path: str | Path, config) -> Any:
    """The tokenizer of the GGUF file at ``path`` (``config``: the file's transformers config)."""
    path = Path(path)
    return tokenizer_class(config).from_pretrained(str(path.parent), gguf_file=path.name)
