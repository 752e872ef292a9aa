"""A GGUF file loaded for the native forward alone: the file's blocks, and no float32 copy of its weights.

:func:`load_native_only` reads the config and the tokenizer from the file, builds the transformers model as a
skeleton on PyTorch's ``meta`` device (its modules, config and shapes; no weight memory), and attaches the
native forward (:mod:`~hvd_agents.runtime.quant_runner`) over the file's own blocks. Only the input and
output embeddings are real float32 tensors (dequantized exactly from the file), for what reads their rows
(a draft head). Resident memory is then about the file's size, the embeddings and the KV cache, where the
transformers load dequantizes every weight to float32 (about eight times a Q4 file).

The model's own forward stays available: the first call of it (a test comparing against it, a tool that
runs it) loads the float32 weights once through ``full_load`` and puts them into the skeleton.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hvd_agents.runtime import quant_native, quant_runner, quant_weights
from hvd_agents.runtime.quant_arch import unsupported_reason
from hvd_agents.runtime.quant_native import F32

logger = logging.getLogger(__name__)


def skeleton(gguf: Path) -> torch.nn.Module:
    """The file's transformers model on the ``meta`` device (config and shapes, no weights), in eval mode.

    The head size is the file's (``<arch>.attention.key_length``) where transformers' GGUF reader leaves the
    config's default (it does for qwen3).
    """
    from gguf import GGUFReader

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    fields = GGUFReader(str(gguf)).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    key_length = fields.get(f"{arch}.attention.key_length")
    if key_length is not None and hasattr(config, "head_dim"):
        config.head_dim = int(key_length.parts[-1][0])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def _dense(w: quant_weights.Weight) -> torch.Tensor:
    """A native weight's values as float32 ``[rows, cols]`` (exact)."""
    native = quant_native.module()
    if w.fmt == F32:
        return torch.from_numpy(np.ascontiguousarray(w.data, dtype=np.float32).reshape(w.rows, w.cols)).clone()
    return native.dequantize(native.Matrix(w.fmt, w.rows, w.cols, torch.from_numpy(w.data.reshape(-1))))


def _set_embeddings(model: torch.nn.Module, weights: quant_weights.WeightSet) -> None:
    embed = torch.nn.Parameter(_dense(weights.embed), requires_grad=False)
    model.get_input_embeddings().weight = embed
    output = model.get_output_embeddings()
    output.weight = embed if weights.output is weights.embed else torch.nn.Parameter(
        _dense(weights.output), requires_grad=False)


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
                     full_load: Callable[[], torch.nn.Module]) -> tuple[quant_runner.NativeModel | None, str]:
    """``(native, "")``: the file's native forward, ``native.model`` its model; ``(None, why)`` when the file
    needs transformers' forward (``why`` is "" when transformers cannot read its config: its own load then says
    why).

    Args:
        gguf: the file.
        context_window: the context window of a model (the loader's rule).
        full_load: the file's float32 transformers model, for a later call of the model's own forward.
    """
    try:
        model = skeleton(gguf)
    except Exception:  # noqa: BLE001 (an architecture or a file transformers does not read: its own load says why)
        return None, ""
    why = unsupported_reason(model)
    if why:
        return None, why
    try:
        weights = quant_weights.from_gguf(gguf, model)
    except ValueError as exc:
        return None, str(exc)
    native = quant_runner.NativeModel(model, weights, context_window(model))
    _set_embeddings(model, weights)
    _full_weights_on_first_forward(model, full_load)
    return native, ""


def float32_bytes(gguf: Path) -> int:
    """What the file's tensors take as float32 (what the transformers load holds in memory)."""
    from gguf import GGUFReader

    return 4 * sum(int(t.n_elements) for t in GGUFReader(str(gguf)).tensors)
