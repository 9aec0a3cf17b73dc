"""The nightly job's model stages on Ray (``precompute/fleet/``): what an actor is handed, and the
Ray addresses refused. A Ray run that loses a worker and builds the in-process release:
``test_pipeline.py``."""

from __future__ import annotations

import socket
from datetime import date
from pathlib import Path

import pytest

from base.store import FileStore
from precompute.samplelogs import generate_rows, write_logs
from tests.test_cli import precompute_run

UNTIL = date(2026, 11, 28)


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

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logs = FileStore(tmp_path / "logs")
    write_logs(logs, generate_rows(UNTIL, intents=2, users=40, asks=120, tail_questions=0))
    env = {**cli_env, "EDGEQA_RAY_ADDRESS": f"127.0.0.1:{port}"}
    done = precompute_run(env, logs.uri, str(tmp_path / "out"), "2026-11-22", UNTIL.isoformat())
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"Ray at 127.0.0.1:{port} could not be reached (EDGEQA_RAY_ADDRESS)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("current.json"))


def test_a_fleet_s_pools_are_asked_for_ahead_and_handed_back_when_a_stage_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a fleet the GPUs of the next GPU step are asked for at once (Ray's autoscaler
    ``request_resources``), generation's with the build's CPU worker kept beside them; a
    stage that fails hands back what it asked for; a laptop's Ray, and a run that names no
    Ray, ask for nothing."""
    import ray.autoscaler.sdk

    import precompute.fleet as fleet_module
    from precompute.config import PrecomputeSettings
    from precompute.fleet import Fleet, ask_ahead, handed_back, reserve_gpus

    asked: list[list[dict[str, float]]] = []

    def request_resources(bundles: list[dict[str, float]]) -> None:
        asked.append(bundles)

    monkeypatch.setattr(ray.autoscaler.sdk, "request_resources", request_resources)
    cluster = Fleet("10.0.0.1:6379", False, 3, 1.0, "cpu_worker")
    reserve_gpus(cluster, 2, cpu_worker=True)
    reserve_gpus(cluster, 2)
    reserve_gpus(cluster, 0, cpu_worker=True)
    reserve_gpus(Fleet("", True, 2, 1.0, "cpu_worker"), 2, cpu_worker=True)  # local: nothing
    reserve_gpus(Fleet("10.0.0.1:6379", False, 3, 0.0), 2)  # no GPUs: nothing
    gpu = {"GPU": 1.0}
    assert asked == [[gpu, gpu, {"cpu_worker": 1.0}], [gpu, gpu], []]

    asked.clear()
    settings = PrecomputeSettings.from_env({"EDGEQA_RAY_ADDRESS": "10.0.0.1:10001"})
    monkeypatch.setattr(fleet_module, "connect", lambda settings: cluster)
    ask_ahead(settings, "embedding")
    with pytest.raises(RuntimeError, match="the build failed"), handed_back(settings):
        raise RuntimeError("the build failed")
    with handed_back(settings):  # a stage that ends well leaves the request to its steps
        pass
    assert asked == [[gpu, gpu, gpu], []]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ask_ahead(PrecomputeSettings.from_env({}), "embedding")  # no Ray named: not even joined
    assert asked == [[gpu, gpu, gpu], []]


def test_mining_says_its_next_gpu_step_a_pool_s_start_before_it(embedder) -> None:  # type: ignore[no-untyped-def]
    """Mining tells the night's GPU steps ahead: the embedding as the text rules start, the
    generation once the wordings are clustered (the k step, the ranking and the writing of
    ``hot/`` run while its pool starts)."""
    from datetime import UTC, datetime

    from precompute.config import MiningConfig
    from precompute.mining import mine_to

    told: list[str] = []
    found, _ = mine_to(
        None,
        generate_rows(UNTIL, intents=2, users=40, asks=120, tail_questions=0),
        embedder,
        MiningConfig(k=5),
        datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC),
        ahead=told.append,
    )
    assert list(found) and told == ["embedding", "generation"]
