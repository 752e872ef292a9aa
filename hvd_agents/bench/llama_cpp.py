"""The llama.cpp peer arm of the benchmarks, through ``llama-cpp-python`` (an optional dependency).

The peer decodes the SAME prompt token ids as the engine's arms (rendered and tokenized
by our HF tokenizer, never by llama.cpp's), greedily, stopping on the engine's stop ids
or after ``max_new_tokens``, on the CPU with as many threads as torch uses. Its time is
split like the engine's stats split it: prefill is every prompt token but the last (the
engine feeds the last prompt token in its first decoding step), decode is every forward
that yields a new token, so decode tok/s = new tokens / decode seconds, as in
:attr:`hvd_agents.engine.stats.RequestStats.decode_tokens_per_s`.

Two ways to decode, on one loaded model:

* :meth:`LlamaCppPeer.generate`: from a fresh state (the whole prompt is prefilled);
* :meth:`LlamaCppPeer.generate_reusing`: keeps llama.cpp's KV cache from the previous
  call and prefills only what follows the longest common prefix with what it holds, the
  prefix matching of ``llama_cpp.Llama.generate``.

``llama_cpp`` is imported only by :meth:`LlamaCppPeer.load` (``pip install 'hvd-agents[peers]'``);
everything else works on any object with ``reset``, ``eval``, ``n_tokens``, ``eval_tokens``
and ``generate`` like ``llama_cpp.Llama`` (the tests pass a fake one).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvd_agents.drafters.base import common_prefix
from hvd_agents.errors import HVDError
from hvd_agents.runtime.loading import embedded_gguf_path

PEER_NAME = "llama.cpp"
PEERS = (PEER_NAME,)
INSTALL_HINT = "pip install 'hvd-agents[peers]'"


def available() -> bool:
    """Whether ``llama_cpp`` (llama-cpp-python) can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def missing_message() -> str:
    """The error shown when the llama.cpp arm is asked for and ``llama_cpp`` is not installed."""
    return (f"the {PEER_NAME} arm needs llama-cpp-python: install it with `{INSTALL_HINT}` "
            "(it builds llama.cpp from source, about 8 minutes)")


def check_peers(peers: Sequence[str], model: str | None = None) -> None:
    """Check a benchmark's peers before it loads anything.

    Raises:
        HVDError: an unknown peer; or llama.cpp asked for and ``llama_cpp`` not
            installed, or ``model`` not a GGUF file.
    """
    unknown = [name for name in peers if name not in PEERS]
    if unknown:
        raise HVDError(f"unknown peer {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    if PEER_NAME in peers:
        if not available():
            raise HVDError(missing_message())
        gguf_path(model)


def gguf_path(model: str | None) -> Path:
    """The GGUF file llama.cpp loads for ``model``: the embedded model's when None, else ``model`` itself.

    Raises:
        HVDError: ``model`` is not a ``.gguf`` file (llama.cpp reads GGUF only).
    """
    if model is None:
        return embedded_gguf_path()
    path = Path(model)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise HVDError(f"the {PEER_NAME} arm needs the model as a .gguf file (got {model!r}): "
                       "pass --model path/to/model.gguf, or no --model for the embedded one")
    return path


@dataclass(frozen=True)
class PeerResult:
    """One greedy decode: the new tokens (a final stop id included, as the engine's) and its clock."""

    token_ids: tuple[int, ...]
    prefill_s: float
    decode_s: float
    reused_tokens: int = 0  # prompt tokens whose KV the previous call left in place
    prefilled_tokens: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        return len(self.token_ids) / self.decode_s if self.decode_s > 0 else 0.0


class LlamaCppPeer:
    """One llama.cpp model, decoding our prompt token ids greedily.

    Args:
        llm: a ``llama_cpp.Llama`` (or an object with its ``reset`` / ``eval`` /
            ``n_tokens`` / ``eval_tokens`` / ``generate``); see :meth:`load`.
        path: the GGUF file it was loaded from (for the reports).
        threads: the threads it decodes with.
    """

    def __init__(self, llm: Any, path: Path | str | None = None, threads: int | None = None) -> None:
        self.llm = llm
        self.path = path
        self.threads = threads

    @classmethod
    def load(cls, model: str | None, *, n_ctx: int, threads: int) -> LlamaCppPeer:
        """Load ``model``'s GGUF file (the embedded one when None) into llama.cpp, on the CPU.

        Raises:
            HVDError: ``llama_cpp`` is not installed, or ``model`` is not a GGUF file.
        """
        path = gguf_path(model)
        try:
            import llama_cpp
        except ImportError as exc:
            raise HVDError(missing_message()) from exc
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                              n_gpu_layers=0, logits_all=False, verbose=False)
        return cls(llm, path, threads)

    def describe(self) -> str:
        """One line for the reports: the file, llama-cpp-python's version, the threads."""
        try:
            version = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        name = Path(self.path).name if self.path is not None else "?"
        return f"{name}, llama-cpp-python {version}, CPU, {self.threads} threads"

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Collection[int],
                 until: Callable[[Sequence[int]], bool] | None = None) -> PeerResult:
        """Greedy decode from a fresh state: the whole prompt is prefilled.

        ``until``, when given, ends the decode after the first token for which
        ``until(tokens so far)`` is true (stop strings: :class:`hvd_agents.bench.agent_arms.StopRule`).
        """
        self.llm.reset()
        return self._decode(list(prompt_ids), max_new_tokens, stop_ids, reused=0, until=until)

    def generate_reusing(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Collection[int],
                         until: Callable[[Sequence[int]], bool] | None = None) -> PeerResult:
        """Greedy decode keeping the KV of the previous call's longest common prefix with this prompt."""
        prompt = list(prompt_ids)
        reused = common_prefix(list(self.llm.eval_tokens), prompt[:-1])
        self.llm.n_tokens = reused  # the next eval drops the cache past it (kv_cache_seq_rm)
        return self._decode(prompt, max_new_tokens, stop_ids, reused=reused, until=until)

    def _decode(self, prompt: list[int], max_new_tokens: int, stop_ids: Collection[int], reused: int,
                until: Callable[[Sequence[int]], bool] | None = None) -> PeerResult:
        if not prompt:
            raise HVDError("the prompt is empty")
        if max_new_tokens < 1:
            raise HVDError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
        llm = self.llm
        start = time.perf_counter()
        llm.eval(prompt[reused:-1])  # prefill: the prompt but its last token, past the reused prefix
        prefilled = time.perf_counter()
        # the cache now holds prompt[:-1]: Llama.generate's prefix match keeps it and feeds the last token
        tokens: list[int] = []
        stream = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for token in stream:
                tokens.append(int(token))
                if tokens[-1] in stop_ids or len(tokens) >= max_new_tokens or (until is not None and until(tokens)):
                    break
        finally:
            stream.close()
        end = time.perf_counter()
        return PeerResult(tuple(tokens), prefilled - start, end - prefilled, reused, len(prompt) - 1 - reused)


def reply_text(tokenizer: Any, token_ids: Sequence[int], stop_ids: Collection[int]) -> str:
    """The text of a reply as the engine reports it: a final stop id left out, special tokens skipped,
    no tokenization-space clean-up (see :mod:`hvd_agents.engine.detok`)."""
    ids = list(token_ids)
    if ids and ids[-1] in stop_ids:
        ids.pop()
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def same_count(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> int:
    """How many outputs are token-identical to the reference's output at the same position.

    Example:
        >>> same_count([(1, 2), (3,), (4,)], [(1, 2), (3, 5), (4,)])
        2
    """
    return sum(tuple(a) == tuple(b) for a, b in zip(outputs, reference))
