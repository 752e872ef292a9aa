"""``hvd-agents loko``: the payoff predictor judged on a kind of agent it was not fitted on.

A user's agent is always a new kind, so the predictor's figures on the traces it was fitted on say little about
it. The protocol: for each kind of agent trace given (BFCL multi-turn, SWE-agent, API-Bank, ...) in turn, fit the
predictor on all the other kinds with the shipped recipe (:func:`fit_recipe`), then replay the left-out kind
with those weights and report, at each verify cost ``c``: the estimated speedup of ``hvd``, of the single-draft
``oracle`` and of ``oracle-tree`` (and ``suffix``'s), and the paper's measures of ``hvd``'s predictor:
precision and recall of "predicted to keep more than the threshold" on high-payoff proposals, and verification
cycles per 1,000 output tokens (:class:`~hvd_agents.trace.stats.PolicyStats`, as ``analyze`` reports them).

The recipe (that of ``docs/hvd-policy.md``, "The shipped weights"): round 0 fits
(:func:`~hvd_agents.policy.train.fit_payoff`) on ``suffix``'s whole drafts at ``train_k`` tokens; each round
``r >= 1`` replays ``hvd`` with round ``r - 1``'s weights at ``train_k`` tokens and ``c = train_cost`` and fits on
the proposals of rounds ``1..r``. The weights of round ``rounds`` are judged. How it fits and adapts online is
:class:`~hvd_agents.policy.train.FitSettings`.

Inputs: ``NAME=PATH`` per kind, PATH a trace file (:func:`~hvd_agents.trace.loader.load_trace`, bad lines
skipped), API-Bank data (:mod:`hvd_agents.trace.api_bank`), a BFCL directory's single-turn results
(:mod:`hvd_agents.trace.bfcl`) or a tau-bench results file (:mod:`hvd_agents.trace.tau_bench`), as
:func:`~hvd_agents.trace.sources.load_source` reads them. ``max_conversations`` keeps at most that many
conversations of each kind, evenly spaced in file order (deterministic; fewer conversations also means a smaller
cross-request store, so a subsampled kind's speedups are lower than its whole file's): on two cores a full BFCL
replay takes minutes, and the protocol replays each kind once with ``suffix``, ``rounds`` times with ``hvd`` for
every other kind left out, once with the baselines and once with ``hvd`` per cost.

Every replay is deterministic (the network's seed is a setting), so the table is too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvd_agents.errors import HVDError, InvalidRequestError
from hvd_agents.policy.paper import PAPER_THRESHOLD, TokenClasses
from hvd_agents.policy.payoff import PayoffWeights
from hvd_agents.policy.token_text import TokenText
from hvd_agents.policy.train import DraftSample, FitSettings, fit_payoff, record_sample
from hvd_agents.trace.loader import Conversation
from hvd_agents.trace.replay import Turn, conversation_turns, replay_turn
from hvd_agents.trace.sources import load_source
from hvd_agents.trace.stats import PolicyStats, ReplayStepRecord
from hvd_agents.trace.strategies import make_policy

logger = logging.getLogger(__name__)

BASELINES: tuple[str, ...] = ("suffix", "oracle", "oracle-tree")  # judged once per kind: no weights, same at any c
COSTS: tuple[float, ...] = (0.02, 0.005)


@dataclass(frozen=True)
class KindSource:
    """One kind of agent trace: its name and where its data is."""

    name: str
    path: str

    @classmethod
    def parse(cls, spec: str) -> KindSource:
        """``NAME=PATH``.

        Raises:
            InvalidRequestError: not of that form.
        """
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InvalidRequestError(f"a kind is NAME=PATH (a trace file, API-Bank data or a BFCL directory), "
                                      f"got {spec!r}")
        return cls(name.strip(), path.strip())


@dataclass
class PreparedKind:
    """A kind's conversations as generation requests, tokenized once for every replay."""

    name: str
    path: str
    conversations: list[list[Turn]]
    total_conversations: int

    @property
    def turns(self) -> int:
        return sum(len(turns) for turns in self.conversations)


@dataclass(frozen=True)
class LokoOptions:
    """The protocol's options (see ``hvd-agents loko --help``).

    Attributes:
        kinds: the kinds, at least two.
        settings: how the predictor is fitted and adapts online.
        rounds: rounds of fitting on ``hvd``'s own proposals after round 0 (the shipped recipe: 2).
        k: most draft tokens verified per step in the judged replays.
        costs: the verify costs ``c`` judged at.
        train_k, train_cost: ``k`` and ``c`` of the fitting rounds' replays.
        max_conversations: at most this many conversations per kind, evenly spaced (None: all).
        payoff_threshold: a proposal is high-payoff when it keeps at least this many tokens.
        weights: judge these weights on every kind instead of fitting (nothing is left out).
    """

    kinds: tuple[KindSource, ...]
    settings: FitSettings = field(default_factory=FitSettings)
    rounds: int = 2
    k: int = 16
    costs: tuple[float, ...] = COSTS
    train_k: int = 32
    train_cost: float = 0.02
    max_conversations: int | None = 100
    payoff_threshold: float = PAPER_THRESHOLD
    weights: PayoffWeights | None = None

    def __post_init__(self) -> None:
        names = [kind.name for kind in self.kinds]
        if len(names) < 2 and self.weights is None:
            raise InvalidRequestError(f"leaving one kind out needs at least two kinds, got {names}")
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"kind names must differ, got {names}")
        if self.rounds < 0 or self.k < 1 or self.train_k < 1:
            raise InvalidRequestError("rounds must be >= 0, k and train_k >= 1")
        if not self.costs or min(self.costs) < 0 or self.train_cost < 0:
            raise InvalidRequestError("verify costs must be >= 0 (and at least one given)")
        if self.max_conversations is not None and self.max_conversations < 1:
            raise InvalidRequestError(f"max_conversations must be >= 1, got {self.max_conversations}")


def evenly_spaced(items: Sequence[Conversation], most: int | None) -> list[Conversation]:
    """At most ``most`` of ``items``, evenly spaced, in their order (all of them when None or enough)."""
    if most is None or len(items) <= most:
        return list(items)
    return [items[i * len(items) // most] for i in range(most)]


def prepare_kind(source: KindSource, tokenizer: Any, max_conversations: int | None) -> PreparedKind:
    """Load a kind's data and turn its (subsampled) conversations into generation requests.

    Raises:
        HVDError: the data cannot be read, or holds no assistant turn.
    """
    trace = load_source(source.path, skip_bad=True)
    chosen = evenly_spaced(trace.conversations, max_conversations)
    prepared = PreparedKind(source.name, source.path, [conversation_turns(tokenizer, c) for c in chosen],
                            len(trace.conversations))
    if not prepared.turns:
        raise HVDError(f"kind {source.name}: {source.path} holds no assistant turn to replay")
    return prepared


@dataclass
class Replayer:
    """Replays prepared kinds with fresh policies (one cache store per policy and replay, as ``analyze``)."""

    tokenizer: Any
    payoff_threshold: float = PAPER_THRESHOLD
    text: TokenText = field(init=False)
    classes: TokenClasses = field(init=False)

    def __post_init__(self) -> None:
        self.text = TokenText.from_tokenizer(self.tokenizer)
        self.classes = TokenClasses()

    def replay(self, kind: PreparedKind, names: Sequence[str], k: int, verify_cost: float,
               payoff: PayoffWeights | None = None,
               sink: Callable[[ReplayStepRecord], None] | None = None) -> dict[str, PolicyStats]:
        """Replay ``kind`` with each policy of ``names``; their totals by name."""
        start = time.perf_counter()
        policies = [make_policy(name, threshold=float(k), verify_cost=verify_cost,
                                payoff_threshold=self.payoff_threshold, text=self.text, payoff=payoff)
                    for name in names]
        stats = {p.name: PolicyStats(p.name, payoff_threshold=self.payoff_threshold) for p in policies}

        def add(step: ReplayStepRecord) -> None:
            stats[step.policy].add_step(step)
            if sink is not None:
                sink(step)

        for turns in kind.conversations:
            for turn in turns:
                for policy in policies:
                    stats[policy.name].add_request(len(turn.target))
                    replay_turn(policy, turn, k, add, None, self.classes)
        logger.info("replayed %s with %s (k=%d, c=%g) in %.1f s", kind.name, ",".join(names), k, verify_cost,
                    time.perf_counter() - start)
        return stats

    def samples(self, kind: PreparedKind, policy: str, k: int, verify_cost: float,
                payoff: PayoffWeights | None = None) -> list[DraftSample]:
        """The training samples of one replay: ``suffix``'s verified drafts (``analyze --steps``), or ``hvd``'s
        whole proposals (``analyze --proposals``), as ``train-payoff`` reads them."""
        found: list[DraftSample] = []

        def keep(step: ReplayStepRecord) -> None:
            record = step.to_dict() if policy == "suffix" else step.proposal_dict()
            sample = record_sample(record, f"{kind.name} {step.conversation}") if record is not None else None
            if sample is not None:
                found.append(sample)

        self.replay(kind, [policy], k, verify_cost, payoff, keep)
        return found


def fit_recipe(replayer: Replayer, kinds: Sequence[PreparedKind], options: LokoOptions,
               round0: Callable[[PreparedKind], list[DraftSample]]) -> PayoffWeights:
    """The shipped recipe on ``kinds`` (see the module docstring); ``round0`` gives a kind's ``suffix`` samples
    (cached by the caller: they do not depend on the weights)."""
    sources = [kind.name for kind in kinds]
    weights, _ = fit_payoff([s for kind in kinds for s in round0(kind)], options.settings, sources)
    proposals: list[DraftSample] = []
    for _ in range(options.rounds):
        for kind in kinds:
            proposals += replayer.samples(kind, "hvd", options.train_k, options.train_cost, weights)
        weights, _ = fit_payoff(proposals, options.settings, sources)
    return weights


def fit_all(options: LokoOptions, tokenizer: Any, cache: LokoCache | None = None) -> PayoffWeights:
    """The recipe fitted on every kind of ``options`` (none left out): what ships.

    Raises:
        HVDError: bad options, or a kind's data that cannot be read.
    """
    cache = LokoCache() if cache is None else cache
    kinds = _prepared(options, tokenizer, cache)
    replayer = Replayer(tokenizer, options.payoff_threshold)
    return fit_recipe(replayer, kinds, options, _round0(replayer, options, cache))


def _prepared(options: LokoOptions, tokenizer: Any, cache: LokoCache) -> list[PreparedKind]:
    for source in options.kinds:
        if source.name not in cache.prepared:
            cache.prepared[source.name] = prepare_kind(source, tokenizer, options.max_conversations)
    return [cache.prepared[source.name] for source in options.kinds]


def _round0(replayer: Replayer, options: LokoOptions,
            cache: LokoCache) -> Callable[[PreparedKind], list[DraftSample]]:
    def round0(kind: PreparedKind) -> list[DraftSample]:
        if kind.name not in cache.round0:
            cache.round0[kind.name] = replayer.samples(kind, "suffix", options.train_k, options.train_cost)
        return cache.round0[kind.name]

    return round0


_KEPT = ("est_speedup", "steps", "output_tokens", "drafted_tokens", "accepted_tokens", "wasted_tokens",
         "cycles_per_1k", "cache_drafts", "pct_high_payoff", "precision", "recall", "off_path_tokens")


def _figures(stats: PolicyStats, verify_cost: float) -> dict[str, Any]:
    figures = stats.figures(verify_cost)
    return {key: figures[key] for key in _KEPT}


@dataclass
class LokoCache:
    """What does not depend on the fit settings, kept to judge several settings on the same data: the prepared
    kinds, round 0's samples and the baselines' totals, by kind name (the options' other values must not change
    between the runs that share it)."""

    prepared: dict[str, PreparedKind] = field(default_factory=dict)
    round0: dict[str, list[DraftSample]] = field(default_factory=dict)
    baselines: dict[str, dict[str, PolicyStats]] = field(default_factory=dict)


def run_loko(options: LokoOptions, tokenizer: Any, cache: LokoCache | None = None) -> dict[str, Any]:
    """Run the protocol; the JSON document (``--json``) that :func:`format_loko` prints as a table.

    ``cache``: reused and filled (see :class:`LokoCache`; None: a fresh one).

    Raises:
        HVDError: bad options, or a kind's data that cannot be read.
    """
    cache = LokoCache() if cache is None else cache
    kinds = _prepared(options, tokenizer, cache)
    replayer = Replayer(tokenizer, options.payoff_threshold)
    round0 = _round0(replayer, options, cache)

    document: dict[str, Any] = {"_meta": _meta(options, kinds), "kinds": {}}
    for kind in kinds:
        others = [other for other in kinds if other is not kind]
        weights = options.weights or fit_recipe(replayer, others, options, round0)
        if kind.name not in cache.baselines:
            cache.baselines[kind.name] = replayer.replay(kind, BASELINES, options.k, options.costs[0])
        baselines = cache.baselines[kind.name]
        entry: dict[str, Any] = {"conversations": len(kind.conversations), "of": kind.total_conversations,
                                 "turns": kind.turns, "fitted_on": weights.meta.get("sources", []),
                                 "train_drafts": weights.meta.get("train_drafts"), "costs": {}}
        for cost in options.costs:
            hvd = replayer.replay(kind, ["hvd"], options.k, cost, weights)["hvd"]
            entry["costs"][f"{cost:g}"] = {"hvd": _figures(hvd, cost),
                                           **{name: _figures(stats, cost) for name, stats in baselines.items()}}
        document["kinds"][kind.name] = entry
    return document


def _meta(options: LokoOptions, kinds: Sequence[PreparedKind]) -> dict[str, Any]:
    return {"protocol": "given weights on every kind" if options.weights is not None else "leave one kind out",
            "settings": options.settings.to_dict(), "rounds": options.rounds, "k": options.k,
            "costs": list(options.costs), "train_k": options.train_k, "train_cost": options.train_cost,
            "max_conversations": options.max_conversations, "payoff_threshold": options.payoff_threshold,
            "kinds": {kind.name: kind.path for kind in kinds},
            "weights": dict(options.weights.meta.get("settings", {})) if options.weights is not None else None}


def format_loko(document: dict[str, Any]) -> str:
    """The table of :func:`run_loko`'s document: one row per kind and verify cost."""
    meta = document["_meta"]
    title = (f"{meta['protocol']}: hvd fitted on the other kinds ({meta['rounds']} rounds on its own proposals)"
             if meta["weights"] is None and meta["protocol"] == "leave one kind out"
             else f"{meta['protocol']}")
    header = (f"{'kind':<12}{'convs':>11}{'c':>7}{'hvd':>8}{'oracle':>8}{'o-tree':>8}{'suffix':>8}{'hvd/or':>8}"
              f"{'prec':>7}{'recall':>7}{'cyc/1K':>8}{'%high':>7}")
    lines = [title, header, "-" * len(header)]
    for name, entry in document["kinds"].items():
        convs = f"{entry['conversations']}/{entry['of']}"
        for cost, figures in entry["costs"].items():
            hvd, oracle = figures["hvd"], figures["oracle"]
            ratio = hvd["est_speedup"] / oracle["est_speedup"] if oracle["est_speedup"] else float("nan")
            lines.append(
                f"{name:<12}{convs:>11}{cost:>7}{hvd['est_speedup']:>7.3f}x{oracle['est_speedup']:>7.3f}x"
                f"{figures['oracle-tree']['est_speedup']:>7.3f}x{figures['suffix']['est_speedup']:>7.3f}x"
                f"{ratio:>8.3f}{_percent(hvd['precision']):>7}{_percent(hvd['recall']):>7}"
                f"{hvd['cycles_per_1k']:>8.1f}{hvd['pct_high_payoff']:>7.1f}")
    lines.append(f"prec / recall: hvd's predictor flagging a cache proposal predicted to keep more than "
                 f"{meta['payoff_threshold']:g} tokens, against those that keep at least that many; cyc/1K: hvd's "
                 f"verification cycles per 1,000 output tokens")
    if meta["max_conversations"] is not None:
        lines.append(f"convs: conversations replayed / in the data (at most {meta['max_conversations']} per kind, "
                     f"evenly spaced in file order)")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"
