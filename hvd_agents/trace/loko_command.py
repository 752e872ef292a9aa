"""The ``hvd-agents loko`` subcommand's options, and the payoff fit's options it shares with ``train-payoff``.

:func:`add_loko_parser` registers the subcommand (its options map onto
:class:`~hvd_agents.trace.loko.LokoOptions`); :func:`add_fit_arguments` adds the fit settings beyond ``--l2``,
``--hidden``, ``--epochs`` and ``--held-out`` to a parser, and :func:`fit_settings` reads all of them back as a
:class:`~hvd_agents.policy.train.FitSettings`.
"""

from __future__ import annotations

import argparse

from hvd_agents.errors import HVDError
from hvd_agents.policy.train import BALANCES, FitSettings


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The payoff predictor's fit settings beyond --l2, --hidden, --epochs and --held-out."""
    parser.add_argument("--seed", type=int, default=0, help="the hazard network's seed")
    parser.add_argument("--drop", default="", help="comma-separated inputs left out, names or patterns "
                                                   "(log_distance,kind=*,text-3:*)")
    parser.add_argument("--online-rate", type=float, default=None,
                        help="learning rate of each session's online step, shipped in the weights (default 0.05)")
    parser.add_argument("--online", default=None,
                        help="comma-separated draft-level weights the online step moves (default bias,kind=*)")
    parser.add_argument("--shared-rate", type=float, default=0.0,
                        help="learning rate of the online offset every session shares, shipped in the weights")
    parser.add_argument("--online-weighting", choices=("draft", "position"), default="draft",
                        help="how a verified draft's positions weigh in the online step: draft (their mean) or "
                             "position (their sum, the likelihood's gradient), shipped in the weights")
    parser.add_argument("--online-next-label", action="store_true",
                        help="the online step also labels the proposal's token after a cut draft accepted whole, "
                             "by the target's next token; shipped in the weights")
    parser.add_argument("--balance", choices=BALANCES, default="none",
                        help="how the logistic fit weighs labelled positions: none (each the same) or conversation "
                             "(each conversation as much as any other); needs --hidden 0")
    parser.add_argument("--text-l2", type=float, default=None,
                        help="the logistic hazard reads the draft's text classes too, their weights under this "
                             "ridge (default: it reads none); needs --hidden 0")


def fit_settings(args: argparse.Namespace) -> FitSettings:
    """The :class:`FitSettings` of parsed ``train-payoff`` / ``loko`` options.

    Raises:
        InvalidRequestError: a setting out of range, or a ``--drop`` / ``--online`` name that names no input.
    """
    defaults = FitSettings()
    split = lambda text: tuple(item.strip() for item in text.split(",") if item.strip())
    return FitSettings(l2=args.l2, hidden=args.hidden, epochs=args.epochs, seed=args.seed, held_out=args.held_out,
                       drop=split(args.drop),
                       online_rate=defaults.online_rate if args.online_rate is None else args.online_rate,
                       online=defaults.online if args.online is None else split(args.online),
                       shared_rate=args.shared_rate, online_weighting=args.online_weighting,
                       online_next_label=args.online_next_label, balance=args.balance, text_l2=args.text_l2)


def cmd_loko(args: argparse.Namespace) -> int:
    """Run ``hvd-agents loko``: print the table, write ``--json``.

    Raises:
        HVDError: bad options, unreadable data or weights.
    """
    from hvd_agents.policy.payoff import PayoffWeights
    from hvd_agents.runtime.loading import load_tokenizer
    from hvd_agents.trace.loko import KindSource, LokoOptions, fit_all, format_loko, run_loko
    from hvd_agents.trace.report import write_json

    try:
        costs = tuple(float(c) for c in args.costs.split(","))
    except ValueError:
        raise HVDError(f"--costs must be comma-separated numbers, got {args.costs!r}") from None
    options = LokoOptions(tuple(KindSource.parse(spec) for spec in args.kinds), fit_settings(args),
                          rounds=args.rounds, k=args.k, costs=costs, train_k=args.train_k, train_cost=args.train_cost,
                          max_conversations=args.max_conversations or None, payoff_threshold=args.payoff_threshold,
                          weights=PayoffWeights.load(args.weights) if args.weights else None)
    if args.fit_all:
        if options.weights is not None:
            raise HVDError("--fit-all fits weights; --weights judges given ones: choose one")
        weights = fit_all(options, load_tokenizer(args.tokenizer))
        weights.save(args.fit_all)
        held_out = weights.meta["held_out"]
        print(f"fitted on {', '.join(weights.meta['sources'])}: {weights.meta['train_drafts']} drafts, held-out "
              f"MAE {held_out['mae']:.3f}, Spearman {held_out['spearman']:.3f}; weights written to {args.fit_all}")
        return 0
    document = run_loko(options, load_tokenizer(args.tokenizer))
    print(format_loko(document))
    if args.json:
        write_json(args.json, document)
    return 0


def add_loko_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``loko`` on the command line's subparsers."""
    loko = sub.add_parser("loko", help="leave one kind out: hvd's predictor fitted on all kinds of agent traces but "
                                       "one, judged on that one, each in turn (no model)")
    loko.add_argument("kinds", nargs="+", metavar="NAME=PATH",
                      help="a kind of agent trace: a trace file (JSONL), API-Bank data (a directory or file), a BFCL "
                           "directory (its single-turn results) or a tau-bench results file")
    loko.add_argument("--rounds", type=int, default=2, help="rounds fitted on hvd's own proposals after suffix's")
    loko.add_argument("--k", type=int, default=16, help="most draft tokens verified per step when judging")
    loko.add_argument("--costs", default="0.02,0.005", help="verify costs c judged at, comma-separated")
    loko.add_argument("--train-k", type=int, default=32, help="k of the fitting rounds' replays")
    loko.add_argument("--train-cost", type=float, default=0.02, help="c of the fitting rounds' replays")
    loko.add_argument("--max-conversations", type=int, default=100,
                      help="at most this many conversations per kind, evenly spaced in file order (0: all)")
    loko.add_argument("--payoff-threshold", type=float, default=6.0, help="high-payoff: keeps at least this many")
    loko.add_argument("--weights", default=None, metavar="FILE",
                      help="judge these weights on every kind instead of fitting (nothing left out)")
    loko.add_argument("--fit-all", default=None, metavar="FILE",
                      help="fit the recipe on every kind given (none left out, nothing judged), write the weights")
    loko.add_argument("--tokenizer", default=None, help="model name/path or tiktoken:<encoding> (default: embedded)")
    loko.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    loko.add_argument("--held-out", type=float, default=0.2, help="share of conversations each fit holds out")
    loko.add_argument("--l2", type=float, default=1.0, help="ridge penalty of the logistic fit")
    loko.add_argument("--hidden", type=int, default=64, help="hidden units of the hazard network (0: none)")
    loko.add_argument("--epochs", type=int, default=30, help="training epochs of the hazard network")
    add_fit_arguments(loko)
    loko.set_defaults(func=cmd_loko)
