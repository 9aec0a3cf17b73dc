"""Through the HTTP API: a greedy answer does not depend on the load or on speculation.

Two ``edgeqa origin serve`` processes with the online cache off: one answers 8 questions sent all
at once (one batch), the other, with ``EDGEQA_SPECULATIVE=suffix``, answers them one at a time,
twice (the second time the suffix index proposes its own earlier answers). Every text is the same.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx

from base.store import FileStore
from tests.origin.engine.invariance_probe import QUESTIONS  # 8 greedy questions
from tests.serving import free_port, wait_healthy


@contextlib.contextmanager
def _origin(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    child = subprocess.Popen(
        ["edgeqa", "origin", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", child
    finally:
        child.terminate()
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(30)


def _answer(url: str, question: str) -> str:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_eight_concurrent_answers_equal_eight_sequential_speculative_ones(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    base = {
        **cli_env,
        "EDGEQA_STORE": FileStore(tmp_path / "store").uri,
        "EDGEQA_USER_SALT": "test-salt-0123456789",
        "EDGEQA_MAX_NUM_SEQS": "8",
        "EDGEQA_MAX_MODEL_LEN": "512",
        "EDGEQA_ORIGIN_TIERS": "false",  # no online cache: every answer is generated
        "EDGEQA_LOG_REQUESTS": "false",
        "EDGEQA_MAX_IN_FLIGHT_PER_USER": "0",  # one client stands for eight users
        "EDGEQA_MAX_IN_FLIGHT_PER_NETWORK": "0",  # on eight networks
    }
    with (
        _origin(base) as (plain, plain_child),
        _origin({**base, "EDGEQA_SPECULATIVE": "suffix"}) as (spec, spec_child),
    ):
        wait_healthy(plain, plain_child)
        wait_healthy(spec, spec_child)
        with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
            concurrent_texts = list(pool.map(lambda q: _answer(plain, q), QUESTIONS))
        for _ in range(2):
            assert [_answer(spec, q) for q in QUESTIONS] == concurrent_texts
        metrics = httpx.get(f"{spec}/metrics").text
        accepted = re.search(r"^vllm:spec_decode_num_accepted_tokens(?:_total)?\S* (\S+)", metrics,
                             re.M)  # fmt: skip
        assert accepted and float(accepted.group(1)) > 0, "speculation never ran"
    assert len(set(concurrent_texts)) == len(QUESTIONS) and all(concurrent_texts)
