"""The ``hvd-agents`` argument parser: one builder per command (:mod:`.commands` holds what each runs).

:func:`build_parser` adds the global options, then each command's subparser in the order
``hvd-agents --help`` lists them (:data:`BUILDERS`), then ``-q``/``--quiet`` to every command
that has none of its own, so that ``hvd-agents demo -q`` works as well as ``hvd-agents -q demo``.
"""

from __future__ import annotations

import argparse
import contextlib

from hvd_agents.cli import commands
from hvd_agents.distill.catalogs import CATALOGS
from hvd_agents.distill.pipeline import DATA_SOURCES, DataConfig
from hvd_agents.distill.train import TrainConfig
from hvd_agents.drafters import available_methods
from hvd_agents.trace.loko_command import add_fit_arguments, add_loko_parser

CHAT_TEMPLATE_HELP = ("a chat template (Jinja, as in a tokenizer_config.json) to render chats with, instead of "
                      "the model's own (a GGUF file's tokenizer.chat_template); a model without one takes only "
                      "plain completions")
DESCRIPTION = "The ``hvd-agents`` command line."
QUIET_HELP = "no progress lines on stderr (kernel builds, cost-profile measurement, model loading)"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``hvd-agents`` command; a parsed command's ``func`` runs it."""
    parser = argparse.ArgumentParser(prog="hvd-agents", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in BUILDERS:
        add(sub)
    for command in sub.choices.values():  # `hvd-agents demo -q` as well as `hvd-agents -q demo`
        with contextlib.suppress(argparse.ArgumentError):  # analyze has its own
            command.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)
    return parser


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



def _add_generate_parser(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="generate one reply and print text + decoding stats")
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--system", default=None, help="system prompt")
    gen.add_argument("--tools", default=None, help="JSON file with a list of OpenAI-style tool schemas")
    gen.add_argument("--raw", action="store_true", help="feed --prompt as raw text, no chat template")
    gen.add_argument("--chat-template", default=None, metavar="FILE", help=CHAT_TEMPLATE_HELP)
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    _add_generation_args(gen)
    gen.set_defaults(func=commands.cmd_generate)


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="an agent turn with a tool call on the embedded model, then by plain decoding")
    demo.add_argument("--model", default=None)
    demo.add_argument("--device", default=None)
    demo.add_argument("--method", default="hvd", choices=available_methods())
    demo.add_argument("--no-compare", dest="compare", action="store_false",
                      help="skip the plain-decoding run and the side-by-side")
    demo.set_defaults(func=commands.cmd_demo)


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
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
    bench.set_defaults(func=commands.cmd_bench)


def _add_bench_drafter_parser(sub: argparse._SubParsersAction) -> None:
    micro = sub.add_parser("bench-drafter", help="cache drafter propose/update cost at scale (no model)")
    micro.add_argument("--store-tokens", type=int, default=1_000_000)
    micro.add_argument("--context-tokens", type=int, default=32_000)
    micro.add_argument("--steps", type=int, default=2_000)
    micro.set_defaults(func=commands.cmd_bench_drafter)


def _add_bench_prefix_parser(sub: argparse._SubParsersAction) -> None:
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
    prefix.set_defaults(func=commands.cmd_bench_prefix)


def _add_bench_agents_parser(sub: argparse._SubParsersAction) -> None:
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
    agents.set_defaults(func=commands.cmd_bench_agents)


def _add_bench_structured_parser(sub: argparse._SubParsersAction) -> None:
    structured = sub.add_parser("bench-structured", help="structured output through the server (JSON schemas, strict "
                                "forced calls) and constrained decoding's speed, one run")
    structured.add_argument("--model", default=None)
    structured.add_argument("--schemas", default=None, metavar="DIR", help="JSON schema files, sent as response_format")
    structured.add_argument("--bfcl", default=None, metavar="FILE", help="BFCL questions (JSON lines), strict tools")
    structured.add_argument("--answers", default=None, metavar="FILE", help="BFCL's possible answers for --bfcl")
    structured.add_argument("--limit", type=int, default=100, help="the first N schema files")
    structured.add_argument("--questions", type=int, default=40, help="the first N BFCL questions")
    structured.add_argument("--tool-calls", type=int, default=8,
                            help="--speed: the first N recorded model calls with tools of the examples")
    structured.add_argument("--max-tokens", type=int, default=256)
    structured.add_argument("--speed", action="store_true", help="ar, ar under the grammar, hvd under it")
    structured.add_argument("--rounds", type=int, default=2)
    structured.set_defaults(func=commands.cmd_bench_structured)


def _add_bench_model_parser(sub: argparse._SubParsersAction) -> None:
    model_bench = sub.add_parser("bench-model", help="the model drafter vs ar, hvd-cache and hvd, side by side")
    model_bench.add_argument("--model", default=None)
    model_bench.add_argument("--device", default=None)
    model_bench.add_argument("--draft-model", default=None, help="a draft LM instead of the shipped draft head")
    model_bench.add_argument("--max-new-tokens", type=int, default=128)
    model_bench.add_argument("--k", type=int, default=6, help="most tokens per model draft in the model arm")
    model_bench.add_argument("--rounds", type=int, default=2)
    model_bench.add_argument("--head", action="append", default=[], metavar="FILE",
                             help="a head file to draft with in an arm of its own beside the model arm (repeatable)")
    model_bench.add_argument("--temperature", type=float, default=0.0,
                             help="sample every arm at this temperature (0, the default: greedy)")
    model_bench.add_argument("--top-p", type=float, default=1.0, help="nucleus mass when sampling")
    model_bench.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens when sampling")
    model_bench.add_argument("--seed", type=int, default=0, help="every request's seed when sampling")
    model_bench.set_defaults(func=commands.cmd_bench_model)


def _add_bench_kernels_parser(sub: argparse._SubParsersAction) -> None:
    kernels = sub.add_parser("bench-kernels", help="the CPU linear-layer kernels (dense, packed, row), side by side")
    kernels.add_argument("--model", default=None)
    kernels.add_argument("--max-new-tokens", type=int, default=96)
    kernels.add_argument("--rounds", type=int, default=2)
    kernels.set_defaults(func=commands.cmd_bench_kernels)


def _add_bench_paths_parser(sub: argparse._SubParsersAction) -> None:
    paths = sub.add_parser("bench-paths", help="the native forward on every CPU path this machine runs: step, "
                           "verify(d), prefill, same bits")
    paths.add_argument("--model", default=None)
    paths.add_argument("--rounds", type=int, default=2)
    paths.set_defaults(func=commands.cmd_bench_paths)


def _add_bench_batch_parser(sub: argparse._SubParsersAction) -> None:
    batch = sub.add_parser("bench-batch", help="concurrent ChatHVD.ainvoke calls: serial vs batching engine, one run")
    batch.add_argument("--model", default=None)
    batch.add_argument("--device", default=None)
    batch.add_argument("--requests", type=int, default=16, help="concurrent requests (distinct agent and chat prompts)")
    batch.add_argument("--max-tokens", type=int, default=64)
    batch.add_argument("--method", default="hvd", choices=available_methods())
    batch.add_argument("--json", default=None, help="write the figures to this file")
    batch.add_argument("--reuse-prefix", action="store_true",
                       help="both engines keep and reuse prefix KV (the default engine's setting); see the module doc")
    batch.set_defaults(func=commands.cmd_bench_batch)


def _add_bench_gpu_parser(sub: argparse._SubParsersAction) -> None:
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
    gpu.set_defaults(func=commands.cmd_bench_gpu)


def _add_train_payoff_parser(sub: argparse._SubParsersAction) -> None:
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
    train.set_defaults(func=commands.cmd_train_payoff)


def _add_bench_head_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench-head", help="draft-head acceptance per prompt kind on held-out prompts (heads side by side)")
    bench.add_argument("--model", default=None)
    bench.add_argument("--head", action="append", default=[], metavar="FILE",
                       help="a head file to measure beside the shipped one (repeatable)")
    bench.add_argument("--no-shipped", action="store_true", help="measure only the --head files")
    bench.add_argument("--k", type=int, default=4, help="tokens per draft (every step drafts k, ungated)")
    bench.add_argument("--max-new-tokens", type=int, default=96)
    bench.set_defaults(func=commands.cmd_bench_head)


def _add_train_drafter_parser(sub: argparse._SubParsersAction) -> None:
    data_defaults, train_defaults = DataConfig(), TrainConfig()
    drafter = sub.add_parser("train-drafter", help="distil a draft head from the target (the model drafter)")
    drafter.add_argument("-o", "--output", required=True, help="where to write the head (.safetensors)")
    drafter.add_argument("--model", default=None, help="the target (default: embedded SmolLM2)")
    drafter.add_argument("--device", default=None)
    drafter.add_argument("--prompts", type=int, default=data_defaults.prompts,
                         help="how many prompts of the catalog the target answers")
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
    drafter.add_argument("--data-source", choices=DATA_SOURCES, default=data_defaults.source,
                         help="who writes the answers: the engine's own forward (the hidden states the head drafts "
                              "from, batched decoding) or the float model's generate")
    drafter.add_argument("--concurrency", type=int, default=data_defaults.concurrency,
                         help="with --data-source engine: requests decoded together")
    drafter.add_argument("--catalog", choices=tuple(CATALOGS), default=data_defaults.catalog,
                         help="the prompts the target answers: the templates, or broader ones made procedurally "
                              "(more tools, programming tasks, topics and phrasings)")
    drafter.add_argument("--init", default=None,
                         help="a head file for this target to start training from (its draft vocabulary is kept)")
    drafter.add_argument("--more-data", action="append", default=[], metavar="FILE",
                         help="a data file an earlier run wrote (--data) to train on as well, never held out "
                              "(repeatable)")
    drafter.add_argument("--taps", default="", metavar="L1,L2,...",
                         help="target layers whose inputs the head fuses with the last layer's state (EAGLE-3's "
                              "fusion; the data are made with them, an --init head gains them)")
    drafter.add_argument("--fusion-only", action="store_true",
                         help="with --taps and --init: train the fusion alone, the --init head's other weights kept")
    drafter.set_defaults(func=commands.cmd_train_drafter)


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
    srv.set_defaults(func=commands.cmd_serve)

    load = sub.add_parser("load-test", help="a bounded load test of a running server (loopback): p50/p95 latency")
    load.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}", help="the server's base URL")
    load.add_argument("--requests", type=int, default=200)
    load.add_argument("--clients", type=int, default=16, help="concurrent clients")
    load.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each request")
    load.add_argument("--time-cap", type=float, default=60.0, help="seconds after which the run stops")
    load.add_argument("--model", default=None, help="the model id to send (default: the server's first)")
    load.add_argument("--api-key", default=None, help="the server's key (default: $HVD_API_KEY)")
    load.set_defaults(func=commands.cmd_load_test)


def _add_analyze_parser(sub: argparse._SubParsersAction) -> None:
    from hvd_agents.trace.strategies import ALIASES, POLICIES

    ana = sub.add_parser("analyze", help="replay an agent trace through the drafters: estimated speedup (no model)")
    ana.add_argument("file", help="trace: JSONL (one {id, messages, tools} per line) or a JSON array; or API-Bank "
                                  "data, a BFCL directory or a tau-bench results file")
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
    ana.set_defaults(func=commands.cmd_analyze)



BUILDERS = (_add_generate_parser,
              _add_demo_parser,
              _add_bench_parser,
              _add_bench_drafter_parser,
              _add_bench_prefix_parser,
              _add_bench_agents_parser,
              _add_bench_structured_parser,
              _add_bench_model_parser,
              _add_bench_kernels_parser,
              _add_bench_paths_parser,
              _add_bench_batch_parser,
              _add_bench_gpu_parser,
              _add_analyze_parser,
              _add_server_parsers,
              _add_train_payoff_parser,
              add_loko_parser,
              _add_train_drafter_parser, _add_bench_head_parser)
"""Each command's builder, in the order ``--help`` lists the commands."""
