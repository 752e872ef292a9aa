"""A GGUF file loaded for the native forward alone: the file's blocks, and no float32 copy of its weights.

:func:`load_native_only` reads the config and the tokenizer from the file, builds the transformers model as a
skeleton on PyTorch's ``meta`` device (its modules, config and shapes; no weight memory), and attaches the
native forward (:mod:`~hvd_agents.runtime.cpu.runner`) over the file's own blocks, which then live only in
the native model's tiles. The input and output embeddings are float32 tables memory-mapped from a cache
file (:mod:`~hvd_agents.runtime.cpu.embedding_file`, dequantized exactly from the file), for what reads their
rows (a draft head): only the rows read are resident. Resident memory is then about the file's size and
the KV cache, where the transformers load dequantizes every weight to float32 (about eight times a Q4 file).

The model's own forward stays available: the first call of it (a test comparing against it, a tool that
runs it) loads the float32 weights once through ``full_load`` and puts them into the skeleton.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hvd_agents.runtime.cpu.arch import unsupported_reason
from hvd_agents.runtime.cpu.embedding_file import mapped_table
from hvd_agents.runtime.cpu.runner import NativeModel
from hvd_agents.runtime.cpu.weights import from_gguf
from hvd_agents.runtime.gguf_config import gguf_config
from hvd_agents.runtime.gguf_file import GGUFFile

logger = logging.getLogger(__name__)


def skeleton(gguf: GGUFFile) -> torch.nn.Module:
    """The file's transformers model on the ``meta`` device (config and shapes, no weights), in eval mode.

    The config is read from the file's parsed metadata (:mod:`~hvd_agents.runtime.gguf_config`; transformers
    reads architectures the native forward does not run). The head size is the file's
    (``<arch>.attention.key_length``) where transformers' GGUF reader leaves the config's default (it does for
    qwen3).
    """
    config = gguf_config(gguf) or AutoConfig.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    key_length = gguf.field(f"{gguf.architecture}.attention.key_length")
    if key_length is not None and hasattr(config, "head_dim"):
        config.head_dim = int(key_length)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def _set_embeddings(model: torch.nn.Module, gguf: GGUFFile) -> None:
    """The skeleton's input and output embeddings: the file's tables memory-mapped (:mod:`embedding_file`)."""
    embed = torch.nn.Parameter(mapped_table(gguf, "token_embd.weight"), requires_grad=False)
    model.get_input_embeddings().weight = embed
    output = model.get_output_embeddings()
    output.weight = embed if "output.weight" not in gguf.tensors else torch.nn.Parameter(
        mapped_table(gguf, "output.weight"), requires_grad=False)


def _full_weights_on_first_forward(model: torch.nn.Module, full_load: Callable[[], torch.nn.Module]) -> None:
    """On the first call of ``model``'s own forward, replace its meta tensors with ``full_load()``'s."""

    def load(module, args, kwargs):
        handle.remove()
        logger.info("the model's own forward was called: loading its float32 weights")
        full = full_load()
        persistent = set(full.state_dict())
        for name, param in full.named_parameters(remove_duplicate=False):
            owner_path, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner_path), leaf, param)
        for name, buffer in full.named_buffers(remove_duplicate=False):
            owner_path, _, leaf = name.rpartition(".")
            model.get_submodule(owner_path).register_buffer(leaf, buffer, persistent=name in persistent)

    handle = model.register_forward_pre_hook(load, with_kwargs=True)


def load_native_only(gguf: Path, context_window: Callable[[torch.nn.Module], int],
                     full_load: Callable[[], torch.nn.Module]) -> tuple[NativeModel | None, str]:
    """``(native, "")``: the file's native forward, ``native.model`` its model; ``(None, why)`` when the file
    needs transformers' forward (``why`` is "" when transformers cannot read its config: its own load then says
    why).

    The file is read once (:class:`~hvd_agents.runtime.gguf_file.GGUFFile`): its config, its blocks and its
    embedding tables come from that one parse, and its mapping is closed when this returns.

    Args:
        gguf: the file.
        context_window: the context window of a model (the loader's rule).
        full_load: the file's float32 transformers model, for a later call of the model's own forward.
    """
    try:
        parsed = GGUFFile(gguf)
        model = skeleton(parsed)
    except Exception:  # noqa: BLE001 (an architecture or a file transformers does not read: its own load says why)
        return None, ""
    why = unsupported_reason(model)
    if why:
        return None, why
    window = context_window(model)
    try:  # each layer converted as it is packed: one layer's arrays at a time besides the tiles
        weights = from_gguf(parsed, model, lazy=True)
        native = NativeModel(model, weights, window, source=lambda: from_gguf(gguf, model))
    except ValueError as exc:
        return None, str(exc)
    del weights  # the blocks now live in the native model's tiles only
    _set_embeddings(model, parsed)
    _full_weights_on_first_forward(model, full_load)
    return native, ""


def float32_bytes(gguf: Path) -> int:
    """What the file's tensors take as float32 (what the transformers load holds in memory)."""
    return GGUFFile(gguf).float32_bytes
