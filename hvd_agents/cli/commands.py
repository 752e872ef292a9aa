"""What each ``hvd-agents`` command runs: ``cmd_<command>(args)``, given the parsed arguments, returns the exit status.

The parser (:mod:`.parser`) sets each command's function as its ``func``; :func:`hvd_agents.cli.main`
runs it. The heavy imports (a model, a benchmark, the server) are made inside each command, so
that ``hvd-agents --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from hvd_agents.distill.pipeline import DataConfig
from hvd_agents.distill.train import TrainConfig
from hvd_agents.engine import GenerationParams
from hvd_agents.errors import HVDError
from hvd_agents.trace.loko_command import fit_settings

logger = logging.getLogger(__name__)


def _params(args: argparse.Namespace) -> GenerationParams:
    return GenerationParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
        method=args.method,
        num_draft_tokens=args.num_draft_tokens,
        reuse_prefix=not args.no_reuse_prefix,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from hvd_agents.chat.conversation import prepare
    from hvd_agents.engine.shared import shared_engine
    from hvd_agents.runtime.chat_template import has_chat_template, plain_prompt_ids, set_chat_template

    params = _params(args)  # validate before loading the model
    tools = _read_tools(args.tools) if args.tools else None
    template = _read_template(args.chat_template)
    engine = shared_engine(args.model, device=args.device, draft_model=args.draft_model)
    if template is not None:
        set_chat_template(engine.tokenizer, template)
    raw = args.raw or not has_chat_template(engine.tokenizer)
    if raw and not args.raw:
        _say_plain_completion(args)
    if raw:
        result = engine.generate(plain_prompt_ids(engine.tokenizer, args.prompt), params)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        structure = prepare(engine, messages, tools)
        result = engine.generate(structure.prompt_ids, params, structure=structure)
    if args.json:
        out = {
            "text": result.text,
            "token_ids": list(result.token_ids),
            "finish_reason": result.finish_reason,
            "stats": result.stats.to_dict(),
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(result.text)
        print("---")
        print(result.stats.summary())
    return 0


def _read_template(path: str | None) -> str | None:
    from hvd_agents.runtime.chat_template import read_chat_template

    return None if path is None else read_chat_template(path)


def _say_plain_completion(args: argparse.Namespace) -> None:
    """``generate`` on a model without a chat template: say that the prompt is continued as plain text
    (on stderr), or refuse what only a chat can carry."""
    if args.system or args.tools:
        raise HVDError("the model has no chat template, so --system and --tools cannot be given to it: "
                       "pass --chat-template FILE, or only --prompt to continue it as plain text")
    print("note: the model has no chat template: --prompt is continued as plain text, not as a chat "
          "(--chat-template FILE gives it one)", file=sys.stderr)


def _read_tools(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            tools = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise HVDError(f"cannot read tool schemas from {path}: {exc}") from exc
    if not isinstance(tools, list):
        raise HVDError(f"{path} must hold a JSON list of tool schemas")
    return tools


def cmd_demo(args: argparse.Namespace) -> int:
    from hvd_agents.demo import run_demo

    run_demo(model=args.model, device=args.device, method=args.method, compare=args.compare)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from hvd_agents.bench.live import run_live_benchmark

    run_live_benchmark(model=args.model, device=args.device, max_new_tokens=args.max_new_tokens, k=args.k,
                       rounds=args.rounds, hvd_k=args.hvd_k, chat=args.chat, peers=args.peers)
    return 0


def cmd_bench_model(args: argparse.Namespace) -> int:
    from hvd_agents.bench.model_drafter import run_model_benchmark
    from hvd_agents.engine.sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    run_model_benchmark(model=args.model, device=args.device, draft_model=args.draft_model,
                        max_new_tokens=args.max_new_tokens, k=args.k, rounds=args.rounds, heads=args.head,
                        sampling=sampling)
    return 0


def cmd_bench_head(args: argparse.Namespace) -> int:
    from hvd_agents.bench.head_acceptance import run_head_benchmark

    run_head_benchmark(model=args.model, heads=args.head, shipped=not args.no_shipped, k=args.k,
                       max_new_tokens=args.max_new_tokens)
    return 0


def cmd_bench_kernels(args: argparse.Namespace) -> int:
    from hvd_agents.bench.kernels import run_kernel_benchmark

    run_kernel_benchmark(model=args.model, max_new_tokens=args.max_new_tokens, rounds=args.rounds)
    return 0


def cmd_bench_paths(args: argparse.Namespace) -> int:
    from hvd_agents.bench.cpu_paths import run_path_benchmark

    run_path_benchmark(model=args.model, rounds=args.rounds)
    return 0


def cmd_bench_batch(args: argparse.Namespace) -> int:
    from hvd_agents.bench.batch import run_batch_benchmark

    run_batch_benchmark(args.model, device=args.device, requests=args.requests, max_tokens=args.max_tokens,
                        method=args.method, json_path=args.json, reuse_prefix=args.reuse_prefix)
    return 0


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from hvd_agents.bench.gpu import run_gpu_benchmark, write_prompts

    if args.write_prompts:
        print(f"wrote {write_prompts(args.write_prompts)} prompts to {args.write_prompts}")
        return 0

    run_gpu_benchmark(args.model, device=args.device, max_new_tokens=args.max_new_tokens, rounds=args.rounds,
                      json_path=args.json, prompts_path=args.prompts, max_prompts=args.max_prompts, arms=args.arms)
    return 0


def cmd_bench_drafter(args: argparse.Namespace) -> int:
    from hvd_agents.bench.drafter import run_drafter_benchmark

    run_drafter_benchmark(store_tokens=args.store_tokens, context_tokens=args.context_tokens, steps=args.steps)
    return 0


def cmd_bench_prefix(args: argparse.Namespace) -> int:
    from hvd_agents.bench.prefix import run_memory_benchmark, run_prefix_benchmark

    budget_mb = args.budget_mb if args.budget_mb is not None else (128 if args.memory_turns else 1024)
    budget = int(budget_mb * 2**20)
    if args.memory_turns and args.peers:
        raise HVDError("--peers compares the agent conversation; it does not apply to --memory-turns")
    if args.memory_turns:
        run_memory_benchmark(model=args.model, device=args.device, turns=args.memory_turns, budget_bytes=budget)
    else:
        run_prefix_benchmark(model=args.model, device=args.device, turns=args.turns,
                             max_new_tokens=args.max_new_tokens, budget_bytes=budget, peers=args.peers)
    return 0


def cmd_bench_agents(args: argparse.Namespace) -> int:
    from hvd_agents.bench.agents import run_agents_benchmark

    conversations = [name.strip() for name in args.conversations.split(",") if name.strip()] if args.conversations else None
    run_agents_benchmark(model=args.model, device=args.device, arms=args.arms, conversations=conversations,
                         threads=args.threads, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                         json_path=args.json, chart_path=args.chart)
    return 0


def cmd_bench_structured(args: argparse.Namespace) -> int:
    from hvd_agents.bench.structured import run_structured_benchmark

    run_structured_benchmark(model=args.model, schemas=args.schemas, bfcl=args.bfcl, answers=args.answers,
                             limit=args.limit, questions=args.questions, speed=args.speed, rounds=args.rounds,
                             max_tokens=args.max_tokens, tool_calls=args.tool_calls)
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from hvd_agents.trace.analyze import AnalyzeOptions, run_analyze

    run_analyze(AnalyzeOptions(
        file=args.file, policy=args.policy, k=args.k, verify_cost=args.verify_cost, threshold=args.threshold,
        json_path=args.json, steps_path=args.steps, html_path=args.html, skip_bad=args.skip_bad,
        tokenizer=args.tokenizer, limit=args.limit, canonical_tools=args.canonical_tools,
        system_template=args.system_template, html_conversation=args.html_conversation, quiet=args.quiet,
        payoff_threshold=args.payoff_threshold, paper_weights=args.paper_weights,
        payoff_weights=args.payoff_weights, proposals_path=args.proposals,
    ))
    return 0


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from hvd_agents.distill.pipeline import train_drafter

    if (args.prompts < 2 or args.epochs < 1 or args.draft_vocab < 2 or args.batch_tokens < 1
            or args.concurrency < 1):
        raise HVDError("--prompts must be >= 2, --epochs >= 1, --draft-vocab >= 2, --batch-tokens >= 1 "
                       "and --concurrency >= 1")
    if args.init is not None and not Path(args.init).is_file():
        raise HVDError(f"--init {args.init}: no such head file")
    missing = [path for path in args.more_data if not Path(path).is_file()]
    if missing:
        raise HVDError(f"--more-data {', '.join(missing)}: no such data file")
    try:
        taps = tuple(int(layer) for layer in args.taps.split(",") if layer.strip())
    except ValueError:
        raise HVDError(f"--taps {args.taps!r}: give layer indices separated by commas, e.g. 2,15,27") from None
    try:
        data = DataConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                          source=args.data_source, concurrency=args.concurrency, catalog=args.catalog, taps=taps)
    except ValueError as exc:
        raise HVDError(f"--taps: {exc}") from None
    if args.fusion_only and (not taps or args.init is None):
        raise HVDError("--fusion-only trains the fusion of an --init head alone: give --taps and --init")
    train = TrainConfig(draft_vocab=args.draft_vocab, epochs=args.epochs, lr=args.lr,
                        batch_tokens=args.batch_tokens, seed=args.seed, taps=taps, fusion_only=args.fusion_only)
    train_drafter(args.output, model=args.model, device=args.device, data=data, train=train, data_file=args.data,
                  init=args.init, more_data=args.more_data)
    return 0


def cmd_train_payoff(args: argparse.Namespace) -> int:
    from hvd_agents.policy.train import train_payoff

    if args.paper:
        return _train_paper(args)
    weights, evaluation = train_payoff(args.steps, args.output, settings=fit_settings(args))
    meta = weights.meta
    print(f"trained on {meta['train_drafts']} drafts, evaluated on {meta['held_out_drafts']} held-out drafts")
    print(f"{'predictor':<24}{'MAE accepted len':>18}{'Spearman':>10}")
    if weights.mlp is not None:
        print(f"{'payoff (network, text)':<24}{evaluation.mae:>18.3f}{evaluation.spearman:>10.3f}")
    else:
        print(f"hazard network: {meta['network']}")
    logistic = meta["held_out_logistic"]
    print(f"{'payoff (logistic)':<24}{logistic['mae']:>18.3f}{logistic['spearman']:>10.3f}")
    print(f"{'per-position rates':<24}{evaluation.baseline_mae:>18.3f}{evaluation.baseline_spearman:>10.3f}")
    print(f"weights written to {args.output}")
    return 0


def _train_paper(args: argparse.Namespace) -> int:
    from hvd_agents.policy.paper_train import train_paper

    mlp, ev = train_paper(args.steps, args.output, held_out=args.held_out, threshold=args.payoff_threshold,
                          epochs=args.epochs)
    print(f"trained on {mlp.meta['train_drafts']} drafts, evaluated on {ev.drafts} held-out drafts "
          f"({100 * ev.mlp.high / max(ev.drafts, 1):.1f}% high-payoff: accepted >= {args.payoff_threshold:g})")
    print(f"{'predictor':<24}{'MAE accepted len':>18}{'precision':>11}{'recall':>8}")
    for name, mae, quality in (("paper MLP", ev.mlp_mae, ev.mlp), ("hvd hazard", ev.hazard_mae, ev.hazard)):
        print(f"{name:<24}{mae:>18.3f}{100 * quality.precision:>10.1f}%{100 * quality.recall:>7.1f}%")
    print(f"weights written to {args.output}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from hvd_agents.server.app import serve
    except ImportError as exc:
        raise HVDError(f"the server needs its extra: pip install 'hvd-agents[server]' ({exc})") from exc

    from hvd_agents.server.config import ServerConfig

    if args.max_pending < 1 or args.max_body_mb <= 0 or args.max_batch < 1:
        raise HVDError("--max-pending and --max-batch must be >= 1 and --max-body-mb > 0")
    if args.request_timeout is not None and not 0 < args.request_timeout < float("inf"):
        raise HVDError(f"--request-timeout must be a number of seconds > 0, got {args.request_timeout}")
    config = ServerConfig(
        chat_template=_read_template(args.chat_template),
        model=args.model, device=args.device, draft_model=args.draft_model, served_model_name=args.served_model_name,
        method=args.method, host=args.host, port=args.port, api_key=args.api_key or os.environ.get("HVD_API_KEY"),
        max_pending=args.max_pending, max_body_bytes=int(args.max_body_mb * 2**20), max_batch=args.max_batch,
        request_timeout_s=args.request_timeout,
    )
    serve(config, log_level="info" if args.verbose else "warning")
    return 0


def cmd_load_test(args: argparse.Namespace) -> int:
    try:
        from hvd_agents.server.loadtest import run_load_test
    except ImportError as exc:
        raise HVDError(f"the load test needs the server extra: pip install 'hvd-agents[server]' ({exc})") from exc

    if args.requests < 1 or args.clients < 1 or args.time_cap <= 0:
        raise HVDError("--requests and --clients must be >= 1 and --time-cap > 0")
    report = run_load_test(args.url, requests=args.requests, clients=args.clients, max_tokens=args.max_tokens,
                           time_cap_s=args.time_cap, api_key=args.api_key or os.environ.get("HVD_API_KEY"),
                           model=args.model)
    print(report.summary())
    return 0 if report.ok else 1
