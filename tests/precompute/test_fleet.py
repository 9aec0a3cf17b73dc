"""The nightly job's model stages on Ray (``precompute/fleet/``): the same release as in-process,
and a Ray worker killed in the middle of generating loses only its partition."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from base.store import FileStore
from precompute.config import PipelineConfig
from precompute.samplelogs import generate_rows, write_logs
from precompute.workarea import WorkArea
from tests.conftest import fast_weights

UNTIL = date(2026, 11, 28)


class _Killer(threading.Thread):
    """Kills (SIGKILL) the Ray worker that starts the first partition of the run under
    ``root``, as soon as it records its attempt: it is then building its engine or answering,
    and the partition is lost with it."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.killed, self.partition = root, "", -1
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            for path in sorted(self.root.glob("*/work/*/attempts/*.json")):
                try:
                    record = json.loads(path.read_text())
                    host, pid = record["worker"].rsplit(":", 1)
                    if host != socket.gethostname():
                        raise RuntimeError(f"the worker {record['worker']} is not on this host")
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError, RuntimeError) as error:  # the test says why
                    self.killed = f"not killed: {error!r}"
                    return
                self.killed, self.partition = record["worker"], int(record["partition"])
                return


def test_what_an_actor_is_handed_holds_no_secret() -> None:
    import pickle

    from base.signing import generate_keypair
    from precompute.config import PrecomputeSettings
    from precompute.fleet import shipped

    secrets = {
        "EDGEQA_USER_SALT": "salt-" + "s" * 20,
        "EDGEQA_IDENTITY_SECRET": "identity-" + "i" * 40,
        "EDGEQA_SIGNING_KEY": generate_keypair()[0],
        "EDGEQA_SIGNING_KMS_KEY": "alias/edgeqa-release-signing",
        "EDGEQA_METRICS_TOKEN": "metrics-" + "m" * 20,
    }
    settings = PrecomputeSettings.from_env({**secrets, "EDGEQA_MAX_TOKENS": "77"})
    handed = shipped(settings)
    shipped_bytes = pickle.dumps(handed)
    for name, value in secrets.items():
        assert value.encode() not in shipped_bytes, name
    # what the engine is built from is all there
    assert handed.max_tokens == 77 and handed.model == settings.model
    assert handed.system_prompt == settings.system_prompt and handed.cache_dir == settings.cache_dir


@pytest.mark.parametrize(
    "address", ["http://head:8265", "head", "ray://head:1;rm -rf /", "x y:1", "head:99999"]
)
def test_a_ray_address_that_is_not_one_is_refused_naming_the_variable(address: str) -> None:
    from base.config import ConfigError
    from precompute.config import PrecomputeSettings

    with pytest.raises(ConfigError, match="EDGEQA_RAY_ADDRESS"):
        PrecomputeSettings.from_env({"EDGEQA_RAY_ADDRESS": address})


def test_a_ray_address_nobody_answers_fails_the_run_at_once_with_one_clear_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    import subprocess

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logs = FileStore(tmp_path / "logs")
    write_logs(logs, generate_rows(UNTIL, intents=2, users=40, asks=120, tail_questions=0))
    env = {**cli_env, "EDGEQA_RAY_ADDRESS": f"127.0.0.1:{port}"}
    done = subprocess.run(
        [
            "edgeqa",
            "precompute",
            "run",
            "--language",
            "en",
            "--logs",
            logs.uri,
            "--out",
            str(tmp_path / "out"),
            "--since",
            "2026-11-22",
            "--until",
            UNTIL.isoformat(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"Ray at 127.0.0.1:{port} could not be reached (EDGEQA_RAY_ADDRESS)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("current.json"))


def test_a_ray_run_builds_the_in_process_release_and_a_lost_worker_redoes_only_its_partition(
    embedded_model: Any, tmp_path: Path, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from precompute.pipeline import RunParams, run_pipeline

    monkeypatch.delenv("EDGEQA_RAY_ADDRESS", raising=False)
    logs = FileStore(tmp_path / "logs")
    write_logs(logs, generate_rows(UNTIL, intents=4, users=120, asks=400, tail_questions=4))
    # greedy: the tokens do not depend on where they are made (the quickest weights here; the
    # nightly default, int8, is compared answer for answer by benchmarks/ray_generation.py)
    config = PipelineConfig.from_env(
        {}, max_tokens=32, partition_size=3, quantization=fast_weights()
    )
    started = datetime(2026, 11, 29, 2, tzinfo=UTC)

    def params(out: FileStore) -> RunParams:
        return RunParams(
            logs.uri, out.uri, UNTIL - timedelta(days=6), UNTIL, config, started=started
        )

    # the reference: every stage in this process, with the model loaded here
    here = run_pipeline(params(FileStore(tmp_path / "here")), model=embedded_model)
    assert here["ran_on"]["generate"] == "this process" and here["status"] == "published"
    assert here["generation"]["partitions"] >= 3

    # on the session's local Ray, one worker killed while it starts its first partition
    on_ray = FileStore(tmp_path / "ray")
    killer = _Killer(on_ray.root)
    killer.start()
    try:
        report = run_pipeline(params(on_ray))
    finally:
        killer.done.set()
    assert killer.killed, "no worker was killed: the run recorded no attempt"
    assert killer.partition >= 0, killer.killed

    # the same release, byte for byte in its content: the same version
    assert report["version"] == here["version"] and report["status"] == "published"
    generation = report["generation"]
    assert generation["generated"] == here["generation"]["generated"]
    assert generation["tokens"] == here["generation"]["tokens"]
    assert generation["ran_on"] == "ray (local, 2 workers)"
    assert report["ran_on"]["mine"] == "this process; embedding: ray (local, 1 worker)"
    # only the lost partition was answered twice
    attempts = WorkArea(on_ray, report["profile"], report["run_id"]).attempts()
    assert sorted(attempts) == list(range(generation["partitions"]))
    twice = {index: len(tried) for index, tried in attempts.items() if len(tried) > 1}
    assert twice == {killer.partition: 2}, attempts
    assert generation["redone"] == [killer.partition]
    assert killer.killed in {a["worker"] for a in attempts[killer.partition]}
