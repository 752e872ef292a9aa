"""A GGUF file's transformers config, from its already-parsed metadata (:class:`~hvd_agents.runtime.gguf_file.GGUFFile`).

``AutoConfig.from_pretrained(dir, gguf_file=name)`` reads these architectures' configs through
``gguf.GGUFReader`` (tens of seconds on a large vocabulary, and once more inside ``AutoTokenizer``).
:func:`gguf_config` applies the same mapping (transformers' ``GGUF_CONFIG_MAPPING``: metadata key -> config
attribute) to the metadata read once, with the rules of transformers' reader for the families the native
forward runs (:data:`FAMILIES`): a llama file named ``mistral`` is a Mistral model, a file without
``output.weight`` ties its embeddings, ``gemma3`` is ``gemma3_text``, the vocabulary size is the token count
when no key gives it. Any other architecture returns None (the caller asks transformers).
"""

from __future__ import annotations

from hvd_agents.runtime.gguf_file import GGUFFile, StringArray

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")  # GGUF architectures read here


def config_dict(gguf: GGUFFile) -> dict | None:
    """The config's attributes (what transformers' GGUF reader gives), or None for another architecture."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    arch = gguf.architecture
    if arch not in FAMILIES:
        return None
    name = gguf.field("general.name")
    model_type = "mistral" if arch == "llama" and name == "mistral" else arch
    config: dict = {"tie_word_embeddings": "output.weight" not in gguf.tensors}
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type, GGUF_CONFIG_DEFAULTS_MAPPING.get(arch) or {}).items():
        config.setdefault(key, value)
    for key, value in gguf.metadata.items():
        prefix, _, rest = key.replace(arch, model_type).partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if renamed is None or renamed == -1 or isinstance(value, StringArray):
            continue
        config[renamed] = value.replace(arch, model_type) if isinstance(value, str) and arch in value else value
    if config.get("model_type") == "gemma3":
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config and isinstance(tokens := gguf.field("tokenizer.ggml.tokens"), StringArray):
        config["vocab_size"] = tokens.count
    return config


def gguf_config(gguf: GGUFFile):
    """The file's transformers config, or None for an architecture not read here."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    attributes = config_dict(gguf)
    if attributes is None:
        return None
    if attributes.get("model_type") not in CONFIG_MAPPING:
        return AutoConfig.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    config = CONFIG_MAPPING[attributes["model_type"]].from_dict(attributes)
    config._name_or_path = str(gguf.path.parent)  # as from_pretrained sets it
    return config
