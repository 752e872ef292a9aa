"""Saving, loading and finding draft-head weights.

A head is one ``.safetensors`` file: the head's parameters in fp16 plus its
draft vocabulary, with the :class:`~hvd_agents.draft_head.model.DraftHeadConfig`
and the training recipe in the file's metadata. Heads for the embedded model
ship in the package (``hvd_agents/draft_head/weights/``); :func:`shipped_head_for`
finds the one whose target signature matches a loaded target.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from hvd_agents.draft_head.model import DraftHead, DraftHeadConfig, target_signature
from hvd_agents.errors import HVDError
from hvd_agents.runtime.cpu.kernels import match_linear_kernel

logger = logging.getLogger(__name__)
SHIPPED_DIR = "weights"


class DraftHeadError(HVDError, ValueError):
    """A draft-head file is missing, unreadable, or does not fit the target."""


def save_head(head: DraftHead, path: str | Path, recipe: dict | None = None) -> Path:
    """Write ``head`` (fp16) and its config (plus ``recipe``) to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in head.state_dict().items():
        value = value.detach().cpu()
        tensors[name] = value.contiguous() if name == "draft_vocab" else value.to(torch.float16).contiguous()
    metadata = {"config": json.dumps(head.config.to_dict()), "recipe": json.dumps(recipe or {})}
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)
    return path


def load_head(path: str | Path, target: nn.Module | None = None) -> DraftHead:
    """Read a head saved by :func:`save_head`; attached to ``target`` when given.

    Raises:
        DraftHeadError: the file is missing or not a draft-head file, or the head
            does not fit ``target`` (hidden size / vocabulary).
    """
    path = Path(path)
    if not path.is_file():
        raise DraftHeadError(f"no draft-head file at {path}")
    try:
        metadata = _metadata(path)
        tensors = load_file(str(path))
        config = DraftHeadConfig(**json.loads(metadata["config"]))
    except (SafetensorError, KeyError, TypeError, ValueError, OSError) as exc:
        raise DraftHeadError(f"{path} is not a readable draft-head file: {exc}") from exc
    head = DraftHead(config)
    try:
        head.load_state_dict({name: value.float() if value.is_floating_point() else value for name, value in tensors.items()})
    except RuntimeError as exc:
        raise DraftHeadError(f"{path} does not match its own config: {exc}") from exc
    head.eval()
    head.recipe = json.loads(metadata.get("recipe", "{}") or "{}")
    if target is not None:
        try:
            head.attach(target)
        except ValueError as exc:
            raise DraftHeadError(f"{path}: {exc}") from exc
        match_linear_kernel(head, target)
    return head


def _metadata(path: str | Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as handle:
        return handle.metadata() or {}


def read_recipe(path: str | Path) -> dict:
    """The training recipe stored in a head file's metadata."""
    return json.loads(_metadata(path).get("recipe", "{}"))


def shipped_heads() -> list[Path]:
    """The head files shipped in the package."""
    folder = resources.files("hvd_agents.draft_head") / SHIPPED_DIR
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".safetensors"))


def shipped_head_for(target: nn.Module) -> DraftHead | None:
    """The shipped head trained for a target of this signature, attached to it; None when there is none."""
    signature = target_signature(target)
    for path in shipped_heads():
        if json.loads(_metadata(path).get("config", "{}")).get("target") == signature:
            logger.info("draft head %s matches the target (%s)", path.name, signature)
            return load_head(path, target)
    return None
