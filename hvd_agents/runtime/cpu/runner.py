"""The CPU runner: a decoder's forward over quantized weights, in one native call per step.

:class:`QuantRunner` implements :class:`~hvd_agents.runtime.runner.Runner` over a
:class:`NativeModel`, a model's weights in the native forward (the loader makes one for GGUF
files, and for ``load_model(..., cpu_weights="int8" | "int4")``, and its
:class:`~hvd_agents.runtime.loading.LoadedModel` carries it as ``native``):

Every forward, of any number of new tokens (a decode step, a draft, a tree, a prefill
or a chunk of one, several requests batched), runs in ``native/quant_forward.cpp``:
the whole forward in one call and one parallel region (its own thread team,
``native/team.h``), linear layers on the weights' own blocks with per-block int8
activations, attention over a float16 KV cache, on the instruction-set path this
CPU runs (:mod:`~hvd_agents.runtime.cpu.native_forward`), for each family of
:mod:`~hvd_agents.runtime.cpu.arch`. Every output element is computed
in one order whatever the number of rows and whatever the path, so a position's
logits and KV are bitwise the same decoded alone, verified in a draft or a tree,
prefilled whole or in chunks, resumed from the prefix cache or batched, on any
x86-64 CPU. A chain longer than :data:`PREFILL_ROWS` runs as several calls.

The KV cache (:class:`QuantKV`) is one float16 buffer per request,
``[layers, kv_heads, capacity, head_dim]``, grown geometrically; rollback moves
its length, a tree's accepted path is compacted in place, and prefixes are
exported and imported as per-layer views for the prefix cache. Every layer keeps all its
positions: a sliding-window layer reads the last ``W`` of them (by position), so rollback, compaction, chunking
and reuse leave each window exactly what a plain decode sees.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu.arch import architecture
from hvd_agents.runtime.cpu.greedy_rows import NativeGreedyRows
from hvd_agents.runtime.cpu.threads import team_threads
from hvd_agents.runtime.cpu.weights import MATRICES, WeightInfo, WeightSet
from hvd_agents.runtime.kv import LayerKV
from hvd_agents.runtime.profile import cached_cost_model, machine_key_parts, measure_runner_cost
from hvd_agents.runtime.runner import BatchCall, add_hidden

MAX_NATIVE_ROWS = 64  # rows a request may verify in one step (a draft, a tree) and rows of a batched step's calls
PREFILL_ROWS = 256  # rows per native call of a longer chain (a prefill): any split gives the same bits
MIN_CPU_SHARE = 0.8  # of the threads' cores the native forward keeps busy while its cost profile is measured
MIN_ROOM = 256  # positions of room a KV buffer gets at least


class NativeModel:
    """A model's weights in the native forward (built once per model, shared by its runners).

    The weights live in the native model's tiles only: the :class:`WeightSet` it was built from is not kept
    (its arrays are freed with the caller's last reference). ``info`` describes them; ``matrices[i][name]`` are
    layer ``i``'s native matrices; :meth:`reload` reads the weights again (to build them on another path).

    Args:
        model: the model (its config, rope and, for engines, its tokenizer-facing parts).
        weights: the weights the native forward reads (packed into its tiles; not kept).
        context_window: most positions a request may hold.
        path: the instruction-set path to run (``native_forward.PATHS``, or the test build
            ``native_forward.EMULATED_AMX``); the one chosen for this machine when None.
        source: reads ``weights`` again (:meth:`reload`); None: :meth:`reload` raises.
        module: the compiled forward to run (:func:`native_forward.build`'s); None: the build of ``path``.

    Raises:
        RuntimeError: the native kernel is unavailable here.
    """

    def __init__(self, model: torch.nn.Module, weights: WeightSet, context_window: int, path: str | None = None,
                 source: Callable[[], WeightSet] | None = None, module: ModuleType | None = None) -> None:
        native = module or (native_forward.build(path) if path else native_forward.module())
        self.path = path or native_forward.path()
        arch = architecture(model)
        self.arch = arch
        self.source = source
        self.layers = len(weights.norms)
        self.heads, self.kv_heads, self.head_dim, self.hidden = arch.heads, arch.kv_heads, arch.head_dim, arch.hidden
        self.eps = arch.eps
        self.context_window = int(context_window)
        tables = [native.rope_table(rope.inv_freq, self.context_window, rope.scaling) for rope in arch.ropes]
        self.cos, self.sin = [t[0] for t in tables], [t[1] for t in tables]  # [P, rotary dims / 2] each

        def matrix(w):
            data = torch.from_numpy(w.data.reshape(-1).view("uint8") if w.fmt != native_forward.F32 else w.data.reshape(-1))
            bias = torch.from_numpy(w.bias) if w.bias is not None else None
            return native.Matrix(w.fmt, w.rows, w.cols, data, bias)

        def norm(values):
            return torch.from_numpy(values) if values is not None else torch.empty(0)

        self._embed = matrix(weights.embed)
        output = self._embed if weights.output is weights.embed else matrix(weights.output)
        nbytes = weights.embed.nbytes + (0 if weights.output is weights.embed else weights.output.nbytes)
        self.native = native.QuantModel(self.hidden, self.heads, self.kv_heads, self.head_dim, arch.intermediate,
                                        self.eps, arch.activation, arch.embed_scale, arch.attn_scale, self.cos,
                                        self.sin, self._embed, torch.from_numpy(weights.final_norm), output)
        self.matrices: list[dict] = []
        for i, n in enumerate(weights.norms):
            mats = weights.layers[i]  # (made now when the layers are lazy: one layer's arrays at a time)
            nbytes += sum(w.nbytes for w in mats.values())
            self.matrices.append({name: matrix(mats[name]) for name in MATRICES})
            del mats
            self.native.add_layer(norm(n.attn), norm(n.ffn), norm(n.q), norm(n.k), norm(n.post_attn),
                                  norm(n.post_ffn), *self.matrices[-1].values(), arch.windows[i], arch.layer_ropes[i])
        self.model = model
        self.greedy_rows = NativeGreedyRows(native)  # a greedy step's argmax and signal on the same build's kernels
        self.info = WeightInfo(weights.scheme, dict(weights.formats), nbytes)  # formats: complete once all are read
        summary = {"scheme": self.info.scheme, "formats": self.info.formats, "bytes": self.info.nbytes}
        self.key = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def summary(self) -> str:
        formats = ", ".join(f"{n} {k}" for k, n in sorted(self.info.formats.items()))
        return f"{self.info.scheme} weights ({formats}; {self.info.nbytes / 2**20:.0f} MiB)"

    def reload(self) -> WeightSet:
        """The weights read again from where they came from (the GGUF file, the float model).

        Raises:
            ValueError: they were attached without a source.
        """
        if self.source is None:
            raise ValueError("these native weights were attached without a source to read them again from")
        return self.source()


class QuantKV:
    """A request's float16 KV cache for :class:`QuantRunner` (implements ``RunnerKV``)."""

    supports_trees = True
    supports_reuse = True

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = MIN_ROOM) -> None:
        self.k = torch.empty(layers, kv_heads, capacity, head_dim, dtype=torch.float16)
        self.v = torch.empty_like(self.k)
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, n: int) -> None:
        """Make room for ``n`` positions (copying into a larger buffer when needed)."""
        if n <= self.capacity:
            return
        room = n + max(MIN_ROOM, n // 8)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], room, old.shape[3])
            new[:, :, : self._length] = old[:, :, : self._length]
            setattr(self, name, new)

    def rollback(self, length: int) -> None:
        if length < 0 or length > self._length:
            raise ValueError(f"cannot truncate a KV cache of {self._length} positions to {length}")
        self._length = length

    def compact(self, start: int, offsets: Sequence[int]) -> None:
        offsets = list(offsets)
        increasing = all(a < b for a, b in itertools.pairwise(offsets))
        if not increasing or (offsets and (offsets[0] < 0 or start + offsets[-1] >= self._length)) or start < 0:
            raise ValueError(f"cannot keep offsets {offsets[:8]} after {start} of a cache of {self._length} positions")
        if offsets != list(range(len(offsets))):
            index = torch.tensor([start + o for o in offsets], dtype=torch.long)
            for buffer in (self.k, self.v):
                buffer[:, :, start : start + len(offsets)] = buffer.index_select(2, index)
        self._length = start + len(offsets)

    def export_prefix(self, n: int) -> tuple[LayerKV, ...]:
        if self._length < n:
            raise ValueError(f"the cache holds {self._length} positions, fewer than {n} token ids")
        return tuple((self.k[i, None, :, :n], self.v[i, None, :, :n]) for i in range(self.k.shape[0]))

    def import_prefix(self, layers: Sequence[LayerKV], n: int) -> None:
        if self._length != 0:
            raise ValueError("importing a prefix needs an empty cache")
        if len(layers) != self.k.shape[0]:
            raise ValueError(f"the prefix has {len(layers)} layers, this cache {self.k.shape[0]}")
        self.reserve(n)
        for i, (keys, values) in enumerate(layers):
            self.k[i, :, :n] = keys[0, :, :n]
            self.v[i, :, :n] = values[0, :, :n]
        self._length = n

    def release(self) -> None:
        """Nothing to give back: the buffers are freed with the cache's last reference."""


def tree_rows(parents: Sequence[int]) -> tuple[list[int], torch.Tensor]:
    """Depths and the visibility ``[n, n]`` among a tree forward's rows (root first; see ``tree_inputs``)."""
    n = len(parents) + 1
    visible = torch.zeros(n, n, dtype=torch.bool)
    visible[:, 0] = True
    depth = [0] * n
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"tree parent {parent} of token {i} must be -1 or an earlier token")
        visible[i + 1] = visible[parent + 1]
        visible[i + 1, i + 1] = True
        depth[i + 1] = depth[parent + 1] + 1
    return depth, visible


class QuantRunner:
    """A :class:`~hvd_agents.runtime.runner.Runner` over a model's native forward (module docstring).

    Args:
        native: the model's weights in the native forward (``LoadedModel.native`` for a loaded model).
        context_window: most positions a request may hold (default and maximum:
            the window ``native`` was built with).
        cost_model: the verification cost curve, when known; measured on this
            runner at first use (and cached per weights and machine) otherwise.
    """

    runs_own_threads = True  # its forward runs on the native team (the engine keeps torch's ops off its cores)
    max_tree_tokens = MAX_NATIVE_ROWS - 1  # draft tokens of a tree one forward verifies (after the last token)

    def __init__(self, native: NativeModel, *, context_window: int | None = None,
                 cost_model: CostModel | None = None) -> None:
        self.model = native.model
        self.native = native
        self.device = torch.device("cpu")
        self.vocab_size = int(native.native.vocab)
        self.greedy_rows = native.greedy_rows
        self.context_window = min(int(context_window or native.context_window), native.context_window)
        self._cost_model = cost_model
        self._no_tree = torch.empty(0, dtype=torch.bool)

    def new_kv(self) -> QuantKV:
        return QuantKV(self.native.layers, self.native.kv_heads, self.native.head_dim)

    def profile(self) -> CostModel:
        if self._cost_model is None:
            key = hashlib.sha256("\n".join(
                ["quant-runner", self.native.key, native_forward.path_key(self.native.path), *machine_key_parts()]).encode()).hexdigest()[:24]
            self._cost_model = cached_cost_model(self.model, key=key, measure=lambda: measure_runner_cost(self),
                                                 min_cpu_share=MIN_CPU_SHARE)
        return self._cost_model

    def forward_batch(self, calls: Sequence[BatchCall]) -> list[torch.Tensor]:
        """Several requests' decode steps in native forwards of up to :data:`MAX_NATIVE_ROWS` rows: the weights
        are read once for all their rows, and each row's arithmetic is the one it has alone (bitwise)."""
        out: list[torch.Tensor] = []
        group: list[BatchCall] = []
        rows = 0
        for call in calls:
            n = len(call.token_ids)
            if not 1 <= n <= MAX_NATIVE_ROWS:
                raise ValueError(f"a batched step takes 1 to {MAX_NATIVE_ROWS} tokens per request, not {n}")
            if call.parents is not None and len(call.parents) != n - 1:
                raise ValueError(f"a tree forward of {n} tokens needs {n - 1} parents, not {len(call.parents)}")
            if call.kv.length + n > self.native.context_window:
                raise ValueError(f"{call.kv.length + n} positions exceed the context window of "
                                 f"{self.native.context_window}")
            if rows + n > MAX_NATIVE_ROWS:
                out += self._native_batch(group)
                group, rows = [], 0
            group.append(call)
            rows += n
        return out + (self._native_batch(group) if group else [])

    def _native_batch(self, calls: Sequence[BatchCall]) -> list[torch.Tensor]:
        """One native forward over ``calls`` (at most :data:`MAX_NATIVE_ROWS` rows in all)."""
        sizes = [len(call.token_ids) for call in calls]
        starts = [0, *itertools.accumulate(sizes)]
        m = starts[-1]
        tokens = torch.tensor([t for call in calls for t in call.token_ids], dtype=torch.long)
        positions = torch.empty(m, dtype=torch.long)
        any_tree = any(call.parents is not None for call in calls)
        visible = torch.zeros(m, m, dtype=torch.bool) if any_tree else self._no_tree
        for call, s0, n in zip(calls, starts, sizes):
            past = call.kv.length
            if call.parents is not None:
                depth, block = tree_rows(call.parents)
                positions[s0 : s0 + n] = torch.tensor(depth, dtype=torch.long) + past
            else:
                positions[s0 : s0 + n] = torch.arange(past, past + n)
                block = torch.ones(n, n, dtype=torch.bool).tril()
            if any_tree:
                visible[s0 : s0 + n, s0 : s0 + n] = block
            call.kv.reserve(past + n)
        want_hidden = any(call.hidden is not None for call in calls)
        logits, rows = self.native.native.forward_batch(tokens, positions, visible, starts, [c.kv.k for c in calls],
                                                        [c.kv.v for c in calls], [c.kv.length for c in calls], m,
                                                        want_hidden, team_threads())
        for call, s0, n in zip(calls, starts, sizes):
            call.kv._length += n
            if call.hidden is not None:
                call.hidden.append(rows[s0 : s0 + n])
        return [logits[s0 : s0 + n] for s0, n in zip(starts, sizes)]

    @property
    def hidden_taps(self) -> tuple[int, ...]:
        """The layers whose inputs ``hidden`` rows carry beside the last-layer state (:meth:`set_hidden_taps`)."""
        return tuple(self.native.native.taps)

    def set_hidden_taps(self, layers: Sequence[int]) -> None:
        """``hidden`` rows carry the input of each of ``layers`` beside the last-layer state
        (:mod:`hvd_agents.runtime.runner`; the native forward copies each row's residual stream as it enters them).

        Raises:
            ValueError: a layer the model does not have.
        """
        try:
            self.native.native.set_taps([int(layer) for layer in layers])
        except RuntimeError as exc:
            raise ValueError(str(exc).splitlines()[0]) from exc

    def forward(
        self,
        kv: QuantKV,
        token_ids: Sequence[int],
        *,
        logits_to_keep: int = 0,
        hidden: list | None = None,
        parents: Sequence[int] | None = None,
    ) -> torch.Tensor:
        n = len(token_ids)
        if n == 0:
            return torch.empty(0, self.vocab_size)
        past = kv.length
        if past + n > self.native.context_window:
            raise ValueError(f"{past + n} positions exceed the context window of {self.native.context_window}")
        keep = n if logits_to_keep <= 0 else min(logits_to_keep, n)
        if parents is not None:
            if len(parents) != n - 1:
                raise ValueError(f"a tree forward of {n} tokens needs {n - 1} parents, not {len(parents)}")
            if n > MAX_NATIVE_ROWS:
                raise ValueError(f"a tree forward takes at most {MAX_NATIVE_ROWS} tokens, not {n}")
            depth, visible = tree_rows(parents)
            positions = torch.tensor([past + d for d in depth], dtype=torch.long)
        else:
            positions, visible = torch.arange(past, past + n, dtype=torch.long), self._no_tree
        kv.reserve(past + n)
        tokens = torch.tensor(list(token_ids), dtype=torch.long)
        if parents is not None or n <= PREFILL_ROWS:
            logits, rows = self.native.native.forward(tokens, positions, visible, kv.k, kv.v, past, keep,
                                                      hidden is not None, team_threads())
        else:
            logits, rows = self._chunked(kv, tokens, positions, keep, hidden is not None)
        kv._length = past + n
        add_hidden(hidden, rows)
        return logits

    def _chunked(self, kv: QuantKV, tokens: torch.Tensor, positions: torch.Tensor, keep: int,
                 want_hidden: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A chain of many tokens (a prefill) as native forwards of :data:`PREFILL_ROWS` rows: each position is
        computed as it is in one call (the kernel's results do not depend on the rows beside a row)."""
        n, past = len(tokens), kv.length
        logits, rows = [], []
        for s0 in range(0, n, PREFILL_ROWS):
            s1 = min(n, s0 + PREFILL_ROWS)
            wanted = max(1, s1 - max(s0, n - keep))  # this chunk's rows among the last `keep`
            out, hidden = self.native.native.forward(tokens[s0:s1], positions[s0:s1], self._no_tree, kv.k, kv.v,
                                                     past + s0, wanted, want_hidden, team_threads())
            if s1 > n - keep:
                logits.append(out)
            rows.append(hidden)
        return torch.cat(logits), (torch.cat(rows) if want_hidden else torch.empty(0))
