"""The nightly DAG: it imports, its structure, one full ``airflow dags test`` run on generated logs
with the embedded model and S3 (moto's server) as the store, the edge service serving the release
it published; then that night again: the command line and the stages the DAG calls build the same
release (nothing generated), and the quality gate refuses what it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import pytest

from base.release import read_pointer
from base.store import open_store
from edge_index.server.app import create_app
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
from precompute.config import PipelineConfig
from precompute.pipeline import (
    STAGES,
    QualityGateError,
    RunParams,
    build_stage,
    generate_stage,
    mine_stage,
    publish_stage,
    validate_stage,
)
from precompute.results import Built, Generated, Mined
from precompute.samplelogs import generate_rows, write_logs
from tests.conftest import fast_weights, new_bucket
from tests.serving import Server
from tests.test_cli import precompute_run

ROOT = Path(__file__).parents[2]
DAGS = ROOT / "dags"
DAG_ID = "nightly_edge_release_en"
UNTIL = date(2026, 11, 28)
SMALL = {
    "window_days": 3,
    "max_tokens": 64,
    "partition_size": 8,
    "quantization": fast_weights(),
    "ttl_days": 3650.0,  # built as of Nov 2026's logs and served whenever the suite runs
}


def _logs(store: Any) -> None:
    write_logs(store, generate_rows(UNTIL, days=3, intents=6, users=60, asks=300, seed=1))


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An Airflow home (SQLite) with the DAG folder, migrated once."""
    home = tmp_path_factory.mktemp("airflow")
    bin_dir = Path(sys.executable).parent
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EDGEQA_"))},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for command in (["airflow", "db", "migrate"],):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    yield env


def _dag(airflow_env: dict[str, str]) -> dict[str, Any]:
    """The DAG as Airflow parses it (in a child: Airflow reads its config at import)."""
    script = f"""
import json, time
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder={str(DAGS)!r})
dag = bag.get_dag({DAG_ID!r})
print(json.dumps({{
    "errors": {{k: str(v) for k, v in bag.import_errors.items()}},
    "seconds": time.perf_counter() - started,
    "tags": sorted(dag.tags),
    "params": sorted(dag.params.keys()),
    "tasks": {{t.task_id: {{"pool": t.pool, "retries": t.retries,
        "upstream": sorted(t.upstream_task_ids),
        "mapped": bool(getattr(t, "is_mapped", False))}} for t in dag.tasks}},
}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=airflow_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_dag_imports_and_has_the_expected_shape(airflow_env: dict[str, str]) -> None:
    dag = _dag(airflow_env)
    assert dag["errors"] == {}
    tasks = dag["tasks"]
    assert set(tasks) == {"mine", "generate", "build", "validate", "publish", "prune"}
    # one task drives the Ray job over every partition: no mapped tasks, no GPU pool on Airflow
    assert not tasks["generate"]["mapped"] and tasks["generate"]["pool"] == "default_pool"
    assert tasks["generate"]["retries"] == 3 and tasks["mine"]["retries"] == 2
    assert tasks["validate"]["retries"] == 0  # a refused release stays refused
    assert tasks["build"]["upstream"] == ["generate", "mine"]
    assert tasks["publish"]["upstream"] == ["mine", "validate"]
    assert tasks["prune"]["upstream"] == ["mine", "publish"]
    assert {"edgeqa", "precompute"} <= set(dag["tags"])
    assert {"profile", "window_days", "k", "top_n"} <= set(dag["params"])
    assert {"min_precision", "max_shrink", "finetune_steps"} <= set(dag["params"])
    # the DAG runs the pipeline's stages, in the pipeline's order
    order: list[str] = []
    while len(order) < len(tasks):
        ready = [t for t, v in tasks.items() if t not in order and set(v["upstream"]) <= set(order)]
        order += sorted(ready)
    assert order == list(STAGES)


@pytest.fixture(scope="module")
def ray_head(
    airflow_env: dict[str, str],
    s3_endpoint: str,
    model_cache_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """A local Ray head with its Jobs API (``ray start --head``), Ray's token authentication
    on, as a deployment runs one for the DAG: its Jobs API URL and token, its GCS address and
    the environment its jobs run with (the store's credentials, the session's model cache, the
    project's ``edgeqa`` on the PATH, the token). Stopped when the module ends."""
    import secrets
    import signal
    import time

    from ray.util import get_node_ip_address

    from tests.serving import free_port

    ports = set()
    while len(ports) < 7:  # seven distinct ports (a port freed may be handed out again)
        ports.add(free_port())
    gcs_port, jobs_port, *others = sorted(ports)
    env = {**airflow_env, "EDGEQA_CACHE_DIR": str(model_cache_dir)}
    env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    env.update(RAY_num_prestart_python_workers="0", RAY_enable_metrics_collection="0")
    env.update(RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    token = secrets.token_hex(32)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)  # its jobs and children too
    flags = ("--port", "--dashboard-port", "--dashboard-agent-listen-port")
    flags += ("--dashboard-agent-grpc-port", "--runtime-env-agent-port")
    flags += ("--metrics-export-port", "--ray-client-server-port")
    chosen = dict(zip(flags, (gcs_port, jobs_port, *others), strict=True))
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block"]
    command += ["--num-cpus", "2", "--include-dashboard=true", "--dashboard-host", "127.0.0.1"]
    command += [f"{flag}={port}" for flag, port in chosen.items()]
    said = tmp_path_factory.mktemp("ray-head") / "ray-start.log"
    head = subprocess.Popen(
        command,
        env=env,
        stdout=said.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its raylet, GCS, dashboard and workers: one process group
    )
    jobs = f"http://127.0.0.1:{jobs_port}"
    deadline = time.monotonic() + 180
    authorized = {"Authorization": f"Bearer {token}"}
    try:
        while True:
            try:
                answer = httpx.get(f"{jobs}/api/version", headers=authorized, timeout=5)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert head.poll() is None, said.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no Jobs API in 180 s: {said.read_text()[-2000:]}"
            time.sleep(1)
        yield {
            "jobs": jobs,
            "token": token,
            "gcs": f"{get_node_ip_address()}:{gcs_port}",
            "env": env,
        }
    finally:  # its raylet, GCS, dashboard and workers; ended hard, quickly, after a grace
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=3)  # `ray start --block` takes longer than this to leave anyway
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)


# ``airflow dags test`` in a process that says, as it exits, its peak memory and which heavy
# modules it imported: the whole Airflow process, every task of the night run in it (``dags test``
# runs the tasks in process)
_MEASURED_AIRFLOW = """
import atexit, json, sys
from precompute.fleet.jobs import task_process
def report():
    print("AIRFLOW-PROCESS " + json.dumps(task_process()))
atexit.register(report)
from airflow.__main__ import main
sys.argv = ["airflow", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def dag_night(ray_head: dict[str, Any]) -> dict[str, Any]:
    """One ``airflow dags test`` run over generated logs in S3 (moto's server), every stage a
    Ray Job on the module's Ray head: the store's URI, the profile, the pointer it published,
    the environment, the run's output, the Airflow process's measure and the head's jobs. The
    tests below read, rerun and refuse from it."""
    uri = f"s3://{new_bucket()}/store"
    store = open_store(uri)
    _logs(store)
    conf = SMALL
    # the Airflow worker's settings: the store, where the fleet's Jobs API is, and Ray's token
    env = {**ray_head["env"], "EDGEQA_STORE": uri, "EDGEQA_RAY_JOBS_ADDRESS": ray_head["jobs"]}
    env["EDGEQA_RAY_JOBS_TOKEN"] = ray_head["token"]
    night = ["dags", "test", DAG_ID, "2026-11-29T02:00:00+00:00", "-c", json.dumps(conf)]
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED_AIRFLOW, *night],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "state=success" in output, output[-5000:]
    measured = [line for line in done.stdout.splitlines() if line.startswith("AIRFLOW-PROCESS ")]
    assert measured, output[-3000:]
    profiles = sorted({p.split("/", 1)[0] for p in store.list() if p.endswith("/current.json")})
    assert len(profiles) == 1
    pointer, _ = read_pointer(store, profiles[0])
    assert pointer is not None
    manifest = json.loads(store.get(f"{profiles[0]}/releases/{pointer.version}/manifest.json"))
    return {
        "uri": uri,
        "profile": profiles[0],
        "pointer": pointer,
        # a child joining the head (the command line's model stages)
        "env": {**env, "EDGEQA_RAY_ADDRESS": ray_head["gcs"]},
        "manifest": manifest,
        "airflow_process": json.loads(measured[-1].split(" ", 1)[1]),
        "jobs": httpx.get(
            f"{ray_head['jobs']}/api/jobs/",
            headers={"Authorization": f"Bearer {ray_head['token']}"},
            timeout=30,
        ).json(),
        "output": output,
    }


def test_every_stage_ran_as_a_ray_job_and_the_airflow_process_stayed_small(
    dag_night: dict[str, Any],
) -> None:
    """The DAG's tasks only submit and follow: each stage of the night ran as a Ray Job (the
    command a person would type), and the Airflow process, which ran every task, never imported
    torch, faiss, duckdb, transformers or Ray, and stayed small."""
    jobs = [j for j in dag_night["jobs"] if str(j.get("submission_id", "")).startswith("edgeqa-")]
    ran = {j["entrypoint"].split()[3]: j for j in jobs if j["status"] == "SUCCEEDED"}
    assert set(ran) == set(STAGES), [(j["submission_id"], j["status"]) for j in jobs]
    for stage, job in ran.items():
        assert job["entrypoint"].startswith(f"edgeqa precompute stage {stage} --logs s3://")
        assert job["metadata"]["edgeqa_stage"] == stage
        assert ("--run" in job["entrypoint"].split()) == (stage != "mine")
    process = dag_night["airflow_process"]
    assert process["heavy_imports"] == []
    assert process["peak_rss_mb"] <= 300, process
    # each task followed its job's log into its own
    assert "edgeqa-stage-result: " in dag_night["output"]


def test_the_dag_runs_end_to_end_on_s3_and_the_edge_serves_it(
    dag_night: dict[str, Any], embedder: Any
) -> None:
    store, pointer = open_store(dag_night["uri"]), dag_night["pointer"]
    assert dag_night["manifest"]["runner"] == "airflow"
    state = ReleaseWatcher(store, None, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    assert state.refresh()
    assert state.index is not None and state.index.version == pointer.version
    question = state.index.questions[0]
    with Server(create_app(state)) as server:
        hit = httpx.get(f"{server.url}/v1/lookup", params={"q": question})
    assert hit.status_code == 200 and hit.json()["tier"] == "exact" and hit.json()["answer"]


def test_the_command_line_builds_the_dag_s_release_and_its_refusal_publishes_nothing(
    dag_night: dict[str, Any],
) -> None:
    """The command line runs the same pipeline: the same logs and window over the same store
    build the same release (its answers reused from the DAG's, the same content and instant: the
    same version, found written and gone on with); its quality gate, refused, says why, exits
    non-zero and publishes nothing (nor marks the live release refused)."""
    uri, profile, pointer = dag_night["uri"], dag_night["profile"], dag_night["pointer"]
    store, from_dag = open_store(uri), dag_night["manifest"]
    window = from_dag["log_range"]  # the DAG's: the data interval's last days
    refused = precompute_run(
        dag_night["env"],
        uri,
        uri,
        window["since"],
        window["until"],
        *("--max-tokens", str(SMALL["max_tokens"])),
        *("--partition-size", str(SMALL["partition_size"])),
        *("--quantization", str(SMALL["quantization"])),
        *("--ttl-days", str(SMALL["ttl_days"]), "--min-rows", "100000"),
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "refused: the release has" in refused.stderr and "Traceback" not in refused.stderr
    report = json.loads(refused.stdout)["en"]
    assert report["status"] == "refused" and "at least 100000 required" in report["refused"]
    assert report["runner"] == "cli" and report["generation"]["generated"] == 0
    # every answer is the DAG's: this process wrote the partitions, no actor started for them
    assert report["generation"]["ran_on"] == "this process (every answer reused)"
    assert read_pointer(store, profile)[0] == pointer  # untouched
    # the release it built is the DAG's: the same version (its rows and instant), found written
    # (releases are written once) and gone on with; the gate's refusal leaves it served
    built = json.loads(store.get(f"{profile}/work/{report['run_id']}/built.json"))
    assert (built["version"], built["manifest_sha256"]) == (
        pointer.version,
        pointer.manifest_sha256,
    )
    assert not store.exists(f"{profile}/releases/{pointer.version}/refused.json")


# -- the stages the DAG calls ---------------------------------------------------------------------


def _params(dag_night: dict[str, Any]) -> RunParams:
    """The DAG's night as the stages' parameters: its store, window and settings (the model
    stages on this process's Ray: ``ray_address``)."""
    window = dag_night["manifest"]["log_range"]
    config = PipelineConfig.from_env(
        {"EDGEQA_CACHE_DIR": dag_night["env"]["EDGEQA_CACHE_DIR"]},
        max_tokens=SMALL["max_tokens"],
        partition_size=SMALL["partition_size"],
        quantization=SMALL["quantization"],
        ttl_days=SMALL["ttl_days"],
    )
    since, until = date.fromisoformat(window["since"]), date.fromisoformat(window["until"])
    uri = dag_night["uri"]
    return RunParams(uri, uri, since, until, config, runner="test")


def _run(params: RunParams) -> tuple[Mined, Generated, Built]:
    mined = mine_stage(params)
    generated = generate_stage(params, mined)
    built = build_stage(params, mined)
    return mined, generated, built


def test_rerunning_the_interval_reuses_every_answer_then_the_quality_gate_refuses(
    dag_night: dict[str, Any],
    model_cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    ray_address: str,
) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("EDGEQA_CACHE_DIR", str(model_cache_dir))
    params = _params(dag_night)
    store = open_store(params.out_uri)
    live = dag_night["pointer"]
    # the stages rerun over the DAG's night: a new run (its parent the DAG's release; the
    # command line's, resumed, when that test ran first) that generates nothing (every answer is
    # the published one) and builds the same content as of the same instant: the same version,
    # which is already current
    mined, regenerated, rebuilt = _run(params)
    assert mined.run != dag_night["manifest"]["run_id"]
    assert regenerated.generated == 0 and regenerated.answers > 0
    reused_here = {"nothing to generate", "this process (every answer reused)"}
    assert regenerated.ran_on in reused_here
    assert rebuilt.version == live.version
    assert rebuilt.rows == dag_night["manifest"]["counts"]["rows"]
    validate_stage(params, mined)
    published = publish_stage(params, mined)
    assert published.as_json() == {"version": live.version, "status": "already_current"}
    profile = mined.profile

    def refused(p: RunParams, night: Mined, match: str) -> None:
        with pytest.raises(QualityGateError, match=match):
            validate_stage(p, night)

    def gate(p: RunParams, **values: Any) -> RunParams:
        return replace(p, config=p.config.replace(gate=values))

    # too few rows (this small release cannot calibrate its semantic tier, so the precision target
    # does not apply to it: it serves exact hits only)
    refused(gate(params, min_rows=10**6), mined, "rows")
    # the same night keeping its top question only: the release would shrink (its answer is the
    # live release's: nothing is generated)
    later = replace(
        params, config=params.config.replace(mining={"top_n": 1}, gate={"max_shrink": 0.1})
    )
    shrunk, regenerated, _ = _run(later)
    assert regenerated.generated == 0 and regenerated.ran_on in reused_here
    refused(later, shrunk, "shrinks")
    # the shrunk release is marked refused: never published, pruned
    version = json.loads(store.get(f"{profile}/work/{shrunk.run}/built.json"))["version"]
    staged = f"{profile}/releases/{version}"
    assert store.exists(f"{staged}/refused.json")
    # an empty answer in its rows
    manifest = json.loads(store.get(f"{staged}/manifest.json"))
    rows_path = f"{staged}/{manifest['shards'][0]['rows']['path']}"
    table = pq.read_table(io.BytesIO(store.get(rows_path)))
    answers = table.column("answer").to_pylist()
    answers[0] = "  "
    table = table.set_column(table.schema.get_field_index("answer"), "answer", pa.array(answers))
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    store.put(rows_path, buffer.getvalue())
    refused(later, shrunk, "empty")
    assert read_pointer(store, profile)[0] == live  # nothing was published


# -- a stage's Ray Job outlives its task ----------------------------------------------------------


def test_a_task_started_again_follows_its_job_a_failed_one_is_submitted_anew_a_late_one_stopped(
    ray_head: dict[str, Any],
) -> None:
    """On the module's Ray head, with small shell jobs standing in for stages: a task whose
    stage's job is still running (its worker died after submitting it) follows that job; a job
    that failed is not followed but submitted again, its error line in the task's; a job past
    the task's time is stopped."""
    import shlex
    import time

    from precompute.fleet.jobs import StageJob, StageJobError, job_key, result_line

    jobs, token = ray_head["jobs"], ray_head["token"]
    # without Ray's token the Jobs API refuses, and the task says which setting to look at
    with pytest.raises(StageJobError, match=r"refused a request without a token \(EDGEQA_RAY_JOBS"):
        StageJob(jobs, "mine", job_key("dag", "no-token", "mine"), ["true"]).run()
    with pytest.raises(StageJobError, match="refused the token"):
        StageJob(jobs, "mine", job_key("dag", "bad-token", "mine"), ["true"], "0" * 64).run()

    key = job_key("dag", "run-reattach", "prune")
    script = f"sleep 3; echo {shlex.quote(result_line('prune', {'removed': []}))}"
    submitted = {"entrypoint": script, "submission_id": f"{key}-1"}
    authorized = {"Authorization": f"Bearer {token}"}
    answer = httpx.post(f"{jobs}/api/jobs/", json=submitted, headers=authorized, timeout=30)
    assert answer.status_code == 200, answer.text
    lines: list[str] = []
    again = StageJob(jobs, "prune", key, ["sh", "-c", script], token, 0.5, on_line=lines.append)
    result, ran = again.run()
    assert result == {"removed": []}
    assert ran["attached"] and ran["submission_id"] == f"{key}-1" and ran["status"] == "SUCCEEDED"
    assert any("following Ray job" in line for line in lines)

    failing = ["sh", "-c", "echo 'edgeqa: error: the release has 3 rows'; exit 2"]
    key = job_key("dag", "run-fails", "validate")
    for attempt in (1, 2):
        with pytest.raises(StageJobError, match=f"{key}-{attempt}.*edgeqa: error: the release"):
            StageJob(jobs, "validate", key, failing, token, poll_s=0.5).run()

    key = job_key("dag", "run-late", "mine")
    with pytest.raises(StageJobError, match="ran past its time: stopped"):
        StageJob(jobs, "mine", key, ["sleep", "300"], token, poll_s=0.5).run(timeout_s=2)
    deadline, stopped = time.monotonic() + 60, f"{jobs}/api/jobs/{key}-1"
    while (status := httpx.get(stopped, headers=authorized).json()["status"]) != "STOPPED":
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
