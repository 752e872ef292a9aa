"""The ``hvd-agents`` command line.

Subcommands:

* ``generate``: one chat turn (or a raw prompt) on a model, printing text and stats.
* ``demo``: a short agent turn with a tool call on the embedded model.
* ``bench``: the live engine benchmark against HF ``generate`` (same run, same prompts; llama.cpp with ``--peers``).
* ``bench-model``: the model drafter against ``ar``, ``hvd-cache`` and ``hvd`` (chat and agent prompts).
* ``bench-kernels``: the CPU linear-layer kernels (dense, packed, row): forward cost per draft length, tok/s.
* ``bench-paths``: the native forward on each CPU path (avx2, avx512-vnni, amx): step, verify(d), prefill, same bits.
* ``bench-drafter``: propose / update cost of the cache drafter at scale (no model).
* ``bench-prefix``: a multi-turn agent conversation with and without prefix KV reuse (llama.cpp with ``--peers``).
* ``bench-batch``: concurrent ``ChatHVD.ainvoke`` calls on a serial and a batching engine: throughput, p95.
* ``bench-gpu``: HF ``generate``, engine ``ar`` and ``hvd`` on the static GPU runner; bandwidth limit, syncs per step.
* ``bench-agents``: the examples' recorded agent conversations replayed under HF, llama.cpp and engine arms.
* ``analyze``: replay an agent trace through the drafters; estimated speedup per policy (no model).
* ``train-payoff``: fit the payoff predictor on ``analyze --steps`` or ``--proposals`` records (no model).
* ``loko``: the payoff predictor fitted on all kinds of agent traces but one and judged on that one, each in turn.
* ``train-drafter``: distil the draft head (the model drafter) from the target.
* ``serve``: an OpenAI-compatible HTTP server (chat completions, completions, models, health, metrics).
* ``load-test``: a bounded load test of a running server: checked answers, p50/p95 latency.

Errors the user can cause (bad model id, bad parameters) print ``error: ...`` and
exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence

from hvd_agents.distill.pipeline import DataConfig
from hvd_agents.distill.train import TrainConfig
from hvd_agents.drafters import available_methods
from hvd_agents.engine import GenerationParams
from hvd_agents.errors import HVDError
from hvd_agents.runtime.progress import set_quiet
from hvd_agents.trace.loko_command import add_fit_arguments, add_loko_parser, fit_settings

logger = logging.getLogger(__name__)

CHAT_TEMPLATE_HELP = ("a chat template (Jinja, as in a tokenizer_config.json) to render chats with, instead of "
                      "the model's own (a GGUF file's tokenizer.chat_template); a model without one takes only "
                      "plain completions")
QUIET_HELP = "no progress lines on stderr (kernel builds, cost-profile measurement, model loading)"


def _add_generation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="hub id, local path or .gguf file (default: embedded SmolLM2)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--method", default="hvd", choices=available_methods(), help="decoding method")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--num-draft-tokens", type=int, default=None,
                        help="most draft tokens verified per step (default: 32 for hvd, 10 otherwise)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--no-reuse-prefix", action="store_true", help="prefill the whole prompt (no prefix KV reuse)")
    parser.add_argument("--draft-model", default=None,
                        help="a smaller model with the same tokenizer that drafts for methods model/hvd "
                        "(default: the draft head shipped for the model, if any)")


def _add_peers_arg(parser: argparse.ArgumentParser, reuse: bool = False) -> None:
    parser.add_argument("--peers", nargs="+", default=[], choices=["llama.cpp"], metavar="PEER",
                        help="other engines as extra arms on the same prompt token ids: llama.cpp"
                        + (" (one instance over the turns, reusing its cached prefix)" if reuse else "")
                        + "; needs pip install 'hvd-agents[peers]'")


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

    run_model_benchmark(model=args.model, device=args.device, draft_model=args.draft_model,
                        max_new_tokens=args.max_new_tokens, k=args.k, rounds=args.rounds)
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

    if args.prompts < 2 or args.epochs < 1 or args.draft_vocab < 2 or args.batch_tokens < 1:
        raise HVDError("--prompts must be >= 2, --epochs >= 1, --draft-vocab >= 2 and --batch-tokens >= 1")
    data = DataConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, seed=args.seed)
    train = TrainConfig(draft_vocab=args.draft_vocab, epochs=args.epochs, lr=args.lr,
                        batch_tokens=args.batch_tokens, seed=args.seed)
    train_drafter(args.output, model=args.model, device=args.device, data=data, train=train, data_file=args.data)
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


def _add_server_parsers(sub: argparse._SubParsersAction) -> None:
    from hvd_agents.server.config import DEFAULT_HOST, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PENDING, DEFAULT_PORT

    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, ...)")
    srv.add_argument("--model", default=None, help="hub id, local path or .gguf file (default: embedded SmolLM2)")
    srv.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    srv.add_argument("--draft-model", default=None, help="a smaller model with the same tokenizer that drafts")
    srv.add_argument("--chat-template", default=None, metavar="FILE", help=CHAT_TEMPLATE_HELP)
    srv.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model's)")
    srv.add_argument("--method", default="hvd", choices=available_methods(),
                     help="decoding method when a request names none")
    srv.add_argument("--host", default=DEFAULT_HOST,
                     help="address to bind (default loopback; 0.0.0.0 exposes the server to the network)")
    srv.add_argument("--port", type=int, default=DEFAULT_PORT)
    srv.add_argument("--api-key", default=None,
                     help="require 'Authorization: Bearer KEY' on every route but /health (default: $HVD_API_KEY)")
    srv.add_argument("--max-pending", type=int, default=DEFAULT_MAX_PENDING,
                     help="generation requests queued or running before new ones get 503 + Retry-After")
    srv.add_argument("--max-batch", type=int, default=1,
                     help="generations decoded together, one forward per step (default 1: one at a time)")
    srv.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                     help="the most seconds a generation may take, waiting included (504 past it; default: none)")
    srv.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                     help="largest request body in MiB (413 above it)")
    srv.set_defaults(func=cmd_serve)

    load = sub.add_parser("load-test", help="a bounded load test of a running server (loopback): p50/p95 latency")
    load.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}", help="the server's base URL")
    load.add_argument("--requests", type=int, default=200)
    load.add_argument("--clients", type=int, default=16, help="concurrent clients")
    load.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each request")
    load.add_argument("--time-cap", type=float, default=60.0, help="seconds after which the run stops")
    load.add_argument("--model", default=None, help="the model id to send (default: the server's first)")
    load.add_argument("--api-key", default=None, help="the server's key (default: $HVD_API_KEY)")
    load.set_defaults(func=cmd_load_test)


def _add_analyze_parser(sub: argparse._SubParsersAction) -> None:
    from hvd_agents.trace.strategies import ALIASES, POLICIES

    ana = sub.add_parser("analyze", help="replay an agent trace through the drafters: estimated speedup (no model)")
    ana.add_argument("file", help="trace: JSONL (one {id, messages, tools} per line) or a JSON array")
    ana.add_argument("--policy", default=None,
                     help=f"comma-separated, from {', '.join([*POLICIES, *ALIASES])} (default: all available)")
    ana.add_argument("--k", type=int, default=16, help="most draft tokens verified per step")
    ana.add_argument("--verify-cost", type=float, default=None,
                     help="cost of one draft token, in target steps (default: measured for the model on this machine)")
    ana.add_argument("--threshold", type=float, default=None, help="suffix-threshold: min match length (default k)")
    ana.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    ana.add_argument("--steps", default=None, metavar="FILE", help="write one JSON line per step")
    ana.add_argument("--proposals", default=None, metavar="FILE",
                     help="write one train-payoff record per step with a cache proposal (suffix, hvd): the whole "
                          "proposal, verified or not, labelled by the reply")
    ana.add_argument("--payoff-weights", default=None, metavar="FILE",
                     help="hvd's predictor weights (train-payoff's output; default: the packaged ones)")
    ana.add_argument("--html", default=None, metavar="FILE", help="write a self-contained HTML report")
    ana.add_argument("--html-conversation", default=None, metavar="ID", help="conversation shown in --html")
    ana.add_argument("--skip-bad", action="store_true", help="skip malformed conversations instead of failing")
    ana.add_argument("--tokenizer", default=None,
                     help="model name/path, saved tokenizer dir, or tiktoken:<encoding> (default: embedded)")
    ana.add_argument("--limit", type=int, default=None, help="replay only the first N conversations")
    ana.add_argument("--canonical-tools", action="store_true", help="canonicalize tool schemas first")
    ana.add_argument("--system-template", default=None, metavar="NAME", help="prepend a template to system prompts")
    ana.add_argument("--payoff-threshold", type=float, default=6.0,
                     help="high-payoff: a cache draft keeping at least this many tokens; hvd-paper's threshold")
    ana.add_argument("--paper-weights", default=None, metavar="FILE",
                     help="hvd-paper's MLP (train-payoff --paper; default: the packaged one)")
    ana.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                     help="no progress bar, no timing line")
    ana.set_defaults(func=cmd_analyze)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hvd-agents", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate one reply and print text + decoding stats")
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--system", default=None, help="system prompt")
    gen.add_argument("--tools", default=None, help="JSON file with a list of OpenAI-style tool schemas")
    gen.add_argument("--raw", action="store_true", help="feed --prompt as raw text, no chat template")
    gen.add_argument("--chat-template", default=None, metavar="FILE", help=CHAT_TEMPLATE_HELP)
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    _add_generation_args(gen)
    gen.set_defaults(func=cmd_generate)

    demo = sub.add_parser("demo", help="an agent turn with a tool call on the embedded model, then by plain decoding")
    demo.add_argument("--model", default=None)
    demo.add_argument("--device", default=None)
    demo.add_argument("--method", default="hvd", choices=available_methods())
    demo.add_argument("--no-compare", dest="compare", action="store_false",
                      help="skip the plain-decoding run and the side-by-side")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="engine vs HF generate, side by side in one run")
    bench.add_argument("--model", default=None)
    bench.add_argument("--device", default=None)
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--k", type=int, default=10, help="draft tokens per step (prompt_lookup_num_tokens)")
    bench.add_argument("--rounds", type=int, default=2, help="passes over the prompts (order alternates)")
    bench.add_argument("--hvd-k", type=int, default=None, help="most draft tokens hvd may verify (default: hvd's own, 32)")
    bench.add_argument("--chat", action="store_true",
                       help="add the 8 held-out chat prompts to the 4 agent prompts (figures per group too)")
    _add_peers_arg(bench)
    bench.set_defaults(func=cmd_bench)

    micro = sub.add_parser("bench-drafter", help="cache drafter propose/update cost at scale (no model)")
    micro.add_argument("--store-tokens", type=int, default=1_000_000)
    micro.add_argument("--context-tokens", type=int, default=32_000)
    micro.add_argument("--steps", type=int, default=2_000)
    micro.set_defaults(func=cmd_bench_drafter)

    prefix = sub.add_parser("bench-prefix", help="agent conversation with and without prefix KV reuse, one run")
    prefix.add_argument("--model", default=None)
    prefix.add_argument("--device", default=None)
    prefix.add_argument("--turns", type=int, default=6, help="agent turns (first prompt ~3K tokens, +~500 a turn)")
    prefix.add_argument("--max-new-tokens", type=int, default=48)
    prefix.add_argument("--budget-mb", type=float, default=None,
                        help="prefix cache budget in MiB (default: the engine's 1024; 128 with --memory-turns)")
    prefix.add_argument("--memory-turns", type=int, default=0,
                        help="instead: this many short turns over 4 conversations, printing peak bytes vs budget")
    _add_peers_arg(prefix, reuse=True)
    prefix.set_defaults(func=cmd_bench_prefix)

    agents = sub.add_parser("bench-agents", help="the examples' recorded agent conversations replayed under each arm "
                            "(HF generate, llama.cpp, engine methods): end-to-end latency, same tokens")
    agents.add_argument("--model", default=None, help="default: the embedded model, which recorded the conversations")
    agents.add_argument("--device", default=None)
    agents.add_argument("--arms", default=None,
                        help="comma-separated (default: all): hf-generate, hf-prompt-lookup, llama.cpp+reuse, ar, "
                             "ar+reuse, pld+reuse, hvd-cache+reuse, model+reuse, hvd+reuse, hvd-paper+reuse, "
                             "hvd-chain+reuse, hvd-graft+reuse, arctic+reuse")
    agents.add_argument("--conversations", default=None,
                        help="comma-separated shipped conversations (default: all): airline_langchain, "
                             "calculator_llamaindex, coding_loop, own_model")
    agents.add_argument("--threads", type=int, default=None, help="torch and llama.cpp threads (default: torch's)")
    agents.add_argument("--max-turns", type=int, default=None, help="replay only each conversation's first model calls")
    agents.add_argument("--max-new-tokens", type=int, default=None, help="cap each call's recorded token budget")
    agents.add_argument("--json", default=None, metavar="FILE", help="write every figure as JSON")
    agents.add_argument("--chart", default=None, metavar="FILE.png", help="turn latency per arm, accepted lengths")
    agents.set_defaults(func=cmd_bench_agents)

    model_bench = sub.add_parser("bench-model", help="the model drafter vs ar, hvd-cache and hvd, side by side")
    model_bench.add_argument("--model", default=None)
    model_bench.add_argument("--device", default=None)
    model_bench.add_argument("--draft-model", default=None, help="a draft LM instead of the shipped draft head")
    model_bench.add_argument("--max-new-tokens", type=int, default=128)
    model_bench.add_argument("--k", type=int, default=6, help="most tokens per model draft in the model arm")
    model_bench.add_argument("--rounds", type=int, default=2)
    model_bench.set_defaults(func=cmd_bench_model)

    kernels = sub.add_parser("bench-kernels", help="the CPU linear-layer kernels (dense, packed, row), side by side")
    kernels.add_argument("--model", default=None)
    kernels.add_argument("--max-new-tokens", type=int, default=96)
    kernels.add_argument("--rounds", type=int, default=2)
    kernels.set_defaults(func=cmd_bench_kernels)

    paths = sub.add_parser("bench-paths", help="the native forward on every CPU path this machine runs: step, "
                           "verify(d), prefill, same bits")
    paths.add_argument("--model", default=None)
    paths.add_argument("--rounds", type=int, default=2)
    paths.set_defaults(func=cmd_bench_paths)

    batch = sub.add_parser("bench-batch", help="concurrent ChatHVD.ainvoke calls: serial vs batching engine, one run")
    batch.add_argument("--model", default=None)
    batch.add_argument("--device", default=None)
    batch.add_argument("--requests", type=int, default=16, help="concurrent requests (distinct agent and chat prompts)")
    batch.add_argument("--max-tokens", type=int, default=64)
    batch.add_argument("--method", default="hvd", choices=available_methods())
    batch.add_argument("--json", default=None, help="write the figures to this file")
    batch.add_argument("--reuse-prefix", action="store_true",
                       help="both engines keep and reuse prefix KV (the default engine's setting); see the module doc")
    batch.set_defaults(func=cmd_bench_batch)

    gpu = sub.add_parser("bench-gpu", help="HF generate, engine ar and hvd on the static GPU runner, one run")
    gpu.add_argument("--model", default=None,
                     help="a model id or path, or random:NAME (smollm2-135m, llama-3.2-1b, llama-3.1-8b, tiny)")
    gpu.add_argument("--device", default=None, help="default: cuda when present")
    gpu.add_argument("--max-new-tokens", type=int, default=128)
    gpu.add_argument("--rounds", type=int, default=1)
    gpu.add_argument("--json", default=None, help="write the figures to this file")
    gpu.add_argument("--prompts", default=None, help="a JSON list of token-id lists to run instead of the built-in prompts")
    gpu.add_argument("--max-prompts", type=int, default=None, help="run only the first N prompts")
    gpu.add_argument("--arms", default=None, help="comma-separated, from hf, hf-runner, ar, hvd, hvd-cache, ar-buckets, "
                     "hvd-buckets (default: all; ar always runs, and each arm's ar)")
    gpu.add_argument("--write-prompts", default=None, metavar="FILE",
                     help="write the benchmark's prompts as the embedded tokenizer's ids (for --prompts) and exit")
    gpu.set_defaults(func=cmd_bench_gpu)

    _add_analyze_parser(sub)
    _add_server_parsers(sub)

    train = sub.add_parser("train-payoff", help="fit the payoff predictor on analyze --steps or --proposals records (no model)")
    train.add_argument("steps", nargs="+", help="JSONL step records (hvd-agents analyze --policy suffix --steps F, "
                                                "or --policy hvd --proposals F)")
    train.add_argument("-o", "--output", required=True, help="where to write the weights (JSON)")
    train.add_argument("--held-out", type=float, default=0.2, help="share of conversations held out for evaluation")
    train.add_argument("--l2", type=float, default=1.0, help="ridge penalty of the fit")
    train.add_argument("--paper", action="store_true",
                       help="fit the HVD paper's MLP (method hvd-paper) instead of hvd's hazard model")
    train.add_argument("--epochs", type=int, default=30, help="training epochs of the hazard network (or --paper's)")
    train.add_argument("--hidden", type=int, default=64,
                       help="hidden units of the hazard network over the drafts' text (0: the logistic hazard only)")
    train.add_argument("--payoff-threshold", type=float, default=6.0, help="--paper: threshold of the evaluation")
    add_fit_arguments(train)
    train.set_defaults(func=cmd_train_payoff)
    add_loko_parser(sub)

    data_defaults, train_defaults = DataConfig(), TrainConfig()
    drafter = sub.add_parser("train-drafter", help="distil a draft head from the target (the model drafter)")
    drafter.add_argument("-o", "--output", required=True, help="where to write the head (.safetensors)")
    drafter.add_argument("--model", default=None, help="the target (default: embedded SmolLM2)")
    drafter.add_argument("--device", default=None)
    drafter.add_argument("--prompts", type=int, default=data_defaults.prompts,
                         help="templated chat prompts the target answers")
    drafter.add_argument("--max-new-tokens", type=int, default=data_defaults.max_new_tokens, help="longest answer")
    drafter.add_argument("--epochs", type=int, default=train_defaults.epochs)
    drafter.add_argument("--draft-vocab", type=int, default=train_defaults.draft_vocab,
                         help="size of the reduced draft vocabulary")
    drafter.add_argument("--lr", type=float, default=train_defaults.lr)
    drafter.add_argument("--batch-tokens", type=int, default=train_defaults.batch_tokens,
                         help="padded sequence tokens per optimizer step (length-sorted batches)")
    drafter.add_argument("--data", default=None,
                         help="a file for the generated data: reused when it exists, written when it does not "
                              "(batches are kept in <file>.parts/ meanwhile, so an interrupted run resumes)")
    drafter.add_argument("--seed", type=int, default=data_defaults.seed)
    drafter.set_defaults(func=cmd_train_drafter)
    for command in sub.choices.values():  # `hvd-agents demo -q` as well as `hvd-agents -q demo`
        with contextlib.suppress(argparse.ArgumentError):  # analyze has its own
            command.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hvd-agents`` console script."""
    args = build_parser().parse_args(argv)
    set_quiet(args.quiet)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except HVDError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
