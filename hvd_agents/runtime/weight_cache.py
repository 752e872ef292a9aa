"""A GGUF file's dequantized float32 copy, cached on disk once and validated at every use.

Contract:

* :func:`cached_copy` dequantizes a GGUF file once (slow: transformers' GGUF reader) and caches the float32
  model and its tokenizer under ``cache_root()/models/<stem>-<sha256[:16]>`` as an HF directory, with a
  ``manifest.json`` (written last) listing every file's size and SHA-256.
* A cache that fails :func:`validate` is logged, deleted and rebuilt, never used.
* A cache is built in a temporary sibling directory and renamed into place (:func:`write`), so concurrent
  processes never see a half-written one; when two build it at once, the first rename wins and the other's copy
  is discarded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from hvd_agents.errors import ModelLoadError
from hvd_agents.runtime.paths import cache_root
from hvd_agents.runtime.progress import end_line

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CACHE_FORMAT = 1
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir(gguf: Path) -> Path:
    """Cache directory for ``gguf``, keyed by its stem and content hash."""
    return cache_root() / "models" / f"{gguf.stem}-{sha256_file(gguf)[:16]}"


def validate(directory: Path) -> str | None:
    """What is wrong with the cache in ``directory``, or None if it is complete and intact."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{MANIFEST} is missing"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{MANIFEST} is unreadable: {exc}"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT or not isinstance(files, dict):
        return f"{MANIFEST} has an unknown format"
    if "config.json" not in files or not any(name.endswith(".safetensors") for name in files):
        return f"{MANIFEST} lists no config.json or no weights"
    on_disk = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
    unexpected = sorted(on_disk - set(files) - {MANIFEST})
    if unexpected:
        return f"unexpected file(s) not in {MANIFEST}: {', '.join(unexpected)}"
    for name, meta in files.items():
        if name not in on_disk:
            return f"{name} is missing"
        size, expected = (directory / name).stat().st_size, meta.get("size") if isinstance(meta, dict) else None
        if size != expected:
            return f"{name} has size {size}, expected {expected}"
        if sha256_file(directory / name) != meta.get("sha256"):
            return f"{name} does not match its SHA-256 checksum"
    return None


def write(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path, source: str) -> bool:
    """Save ``model`` and ``tokenizer`` as an HF directory at ``target``, atomically.

    The files are written to a temporary sibling, ``manifest.json`` last, then the
    directory is renamed onto ``target``. If ``target`` appeared meanwhile (another
    process built it), theirs is kept and ours discarded.

    Returns:
        True if our copy was installed, False if an existing ``target`` was kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        if hasattr(model.config, "quantization_config"):  # GGUF-loaded models refuse to save otherwise
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = {
            p.relative_to(tmp).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        manifest = {"format": CACHE_FORMAT, "source": source, "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():
                raise
            logger.info("cache %s was built concurrently by another process; using it", target)
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        return True
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def dequantize(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize ``gguf`` to a float32 model and build its tokenizer (slow: tens of seconds)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # unsupported architecture (ValueError), corrupt file, missing gguf extras, ...
        raise ModelLoadError(f"cannot load GGUF file {gguf}: {exc}") from exc
    return model, tokenizer


def cached_copy(gguf: Path) -> Path:
    """The directory of ``gguf``'s validated float32 copy, built first (tens of seconds) where it is missing or
    invalid; an invalid one is logged and deleted.

    Raises:
        ModelLoadError: the file cannot be dequantized, or a copy another process wrote meanwhile is invalid.
    """
    target = cache_dir(gguf)
    if target.exists():
        problem = validate(target)
        if problem is None:
            return target
        logger.warning("model cache %s is invalid (%s); deleting and rebuilding it", target, problem)
        shutil.rmtree(target, ignore_errors=True)  # another process may be deleting it too
    start = time.perf_counter()
    logger.info("dequantizing %s (first use; cached afterwards in %s)", gguf, target)
    end_line()  # transformers shows its own progress bar
    model, tokenizer = dequantize(gguf)
    installed = write(model, tokenizer, target, str(gguf))
    del model
    if not installed and (problem := validate(target)) is not None:
        raise ModelLoadError(f"model cache {target} written by another process is invalid: {problem}")
    logger.info("built model cache %s in %.1f s", target, time.perf_counter() - start)
    return target
