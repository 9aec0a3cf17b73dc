"""Shared fixtures: the real embedded model and embedder, loaded once per test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.s3proxy import FaultyS3, faulty_s3

if TYPE_CHECKING:
    from base.store import Store

# nothing may come from a hub: every model is local
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a local Ray of the tests (``ray_address``) starts no idle workers ahead of its jobs and keeps no
# metrics: idle, they took half of its CPU (3.7 -> 1.9 s a minute, measured)
os.environ.setdefault("RAY_num_prestart_python_workers", "0")
os.environ.setdefault("RAY_enable_metrics_collection", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # the suite runs as two workers (pyproject's addopts: a test file per worker at a time): one
    # math thread each, and their children's, so two workers share the cores instead of four
    # threads spinning on two
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]


def fast_weights() -> str:
    """The quickest weights on this CPU for tests that only need some answers: bf16 where the
    CPU has native bf16, else the model as loaded (emulated bf16 is many times slower)."""
    from origin.engine import default_quantization

    return default_quantization("cpu")


VENV_BIN = Path(sys.executable).parent


def pytest_configure(config: pytest.Config) -> None:
    """Before the workers start (in the controller, once): the token a local Ray authenticates
    with (``~/.ray/auth_token``), made if missing, so that two workers starting their Rays at
    once do not each write their own."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", 0):
        return
    try:  # Ray's own token file and format (ray 2.60; a later Ray that moves them: no token)
        from ray._private.authentication.authentication_token_setup import (
            _get_default_token_path,
            generate_and_save_token,
        )
    except ImportError:
        return
    if not _get_default_token_path().is_file():
        generate_and_save_token()


# The files that take longest (seconds on 2 idle cores, `--durations=0` summed by file), run
# first: a worker takes one file at a time (pyproject's `--dist loadfile`, in collection order:
# `--no-loadscope-reorder`), so a long file started last would end the suite alone on one core
LONGEST_FIRST = (
    "tests/dags/test_nightly_dag.py",  # ~180 s
    "tests/test_cli.py",  # ~160 s (the demo)
    "tests/precompute/test_pipeline.py",  # ~130 s (with the lost Ray worker)
    "tests/origin/server/test_server.py",  # ~130 s
    "tests/origin/engine/test_invariance.py",  # ~90 s
    "tests/origin/engine/test_speculative.py",  # ~65 s
    "tests/origin/test_model.py",  # ~50 s
    "tests/edge_index/test_service.py",  # ~40 s
    "tests/origin/engine/test_engine.py",  # ~40 s
    "tests/web/test_rollback.py",  # ~15 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # stable: the tests of a file keep their order, the other files theirs
    items.sort(key=lambda item: rank.get(item.path.relative_to(ROOT).as_posix(), len(rank)))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the converted embedded model, converted once per test run: the
    workers of a parallel run share it (the conversion is locked, ``origin.conversion``), and
    with it what is kept beside the conversion (the INT8 calibration, the packed GGUF blocks)."""
    from origin.conversion import ensure_converted
    from origin.model import embedded_gguf_path

    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base temp is in the run's
        cache = tmp_path_factory.getbasetemp().parent / "edgeqa-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("edgeqa-cache")
    ensure_converted(embedded_gguf_path(), cache)
    return cache


@pytest.fixture(scope="session")
def embedded_model(model_cache_dir: Path):  # type: ignore[no-untyped-def]
    from origin.model import load_model

    return load_model("embedded", cache_dir=model_cache_dir)


@pytest.fixture(scope="session")
def embedder():  # type: ignore[no-untyped-def]
    from semantic.loading import load_embedder

    return load_embedder("embedded")


@pytest.fixture(scope="session")
def multilingual_embedder(model_cache_dir: Path):  # type: ignore[no-untyped-def]
    """multilingual-e5-small, converted once into the session's cache dir (the CLI's too)."""
    from semantic.loading import load_embedder

    return load_embedder("multilingual", device="cpu", cache_dir=model_cache_dir)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """One local Ray for the tests of a module (the nightly job's model stages run on Ray:
    ``precompute/fleet/``): this process's stages use it as it is, a child (the CLI, Airflow)
    joins it through ``EDGEQA_RAY_ADDRESS``; its address. Shut down when the module ends: an
    idle local Ray still takes ~4 s of CPU a minute (its idle workers, raylet, GCS and log
    monitor), which the rest of the suite would pay for the whole run; starting one costs
    about as much as a minute of it, and four modules use one."""
    import logging

    import ray

    from precompute.fleet import LOCAL_OBJECT_STORE_BYTES

    if not ray.is_initialized():  # else a stage of an earlier test started it
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    yield str(ray.get_runtime_context().gcs_address)
    ray.shutdown()


@pytest.fixture()
def cli_env(model_cache_dir: Path) -> dict[str, str]:
    """Environment for running the ``edgeqa`` console script against the session's cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEQA_")}
    env["EDGEQA_CACHE_DIR"] = str(model_cache_dir)
    # a local Ray has token authentication on (its token in ~/.ray/auth_token): a child joining
    # the session's must say so before it imports Ray
    env["RAY_AUTH_MODE"] = "token"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 endpoint on loopback (moto in server mode), shared by the session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    previous = {name: os.environ.get(name) for name in _S3_ENV}
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    yield endpoint
    server.stop()
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_S3_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


@pytest.fixture()
def s3_proxy(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FaultyS3]]:
    """A fault-injecting proxy in front of the loopback S3 server (``tests/s3proxy.py``): every
    boto3 client made while it runs goes through it."""
    with faulty_s3(s3_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        yield proxy


@pytest.fixture()
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh, empty bucket on the loopback S3 server."""
    return new_bucket()


def new_bucket() -> str:
    """Make a fresh, empty bucket on the loopback S3 server (``s3_endpoint`` running); its name."""
    import uuid

    import boto3

    name = f"edgeqa-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh store: a folder, then a bucket on the loopback S3 server."""
    from base.store import FileStore, open_store

    if request.param == "file":
        return FileStore(tmp_path / "store")
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/root")
