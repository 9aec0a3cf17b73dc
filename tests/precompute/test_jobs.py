"""A stage as a Ray Job (``precompute/fleet/jobs.py``): the command line a task submits, the result
it reads back, the submission ids it follows, and what the stage command refuses. The jobs
themselves run on a real Ray head in ``tests/dags/test_nightly_dag.py``."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from datetime import UTC, date, datetime
from typing import Any

import pytest

from base.errors import EdgeQAError
from precompute.config import RUN_OPTIONS, STAGES
from precompute.fleet.jobs import (
    STAGE_RESULT,
    RunSpec,
    StageJob,
    StageJobError,
    job_key,
    parse_result,
    result_line,
    stage_command,
)
from precompute.workarea import parse_run
from tests.test_cli import edgeqa_here

NIGHT = RunSpec(
    "s3://bucket/store",
    "s3://bucket/store",
    date(2026, 11, 22),
    date(2026, 11, 28),
    "en",
    datetime(2026, 11, 29, 2, tzinfo=UTC),
    options={"k": 5, "top_n": None, "answers": "", "max_shrink": 0.5},
)
RUN = "smollm2-135m-en-b9321e8cfb/3a5e6b511d0adc87"


def _night(**fields: Any) -> RunSpec:
    return dataclasses.replace(NIGHT, **fields)


def test_a_stage_command_is_the_cli_a_person_types_every_option_the_cli_knows() -> None:
    from edgeqa.cli import build_parser

    mine = stage_command("mine", NIGHT)
    assert mine[:4] == ["edgeqa", "precompute", "stage", "mine"] and "--run" not in mine
    # unset options (None, "") are left to the cluster's settings; the others as given
    assert "--top-n" not in mine and "--answers" not in mine
    assert mine[mine.index("--k") + 1] == "5" and mine[mine.index("--max-shrink") + 1] == "0.5"
    assert mine[mine.index("--started") + 1] == "2026-11-29T02:00:00+00:00"
    for stage in STAGES[1:]:
        argv = stage_command(stage, NIGHT, RUN)
        assert argv[argv.index("--run") + 1] == RUN
        # the CLI parses it back to the same night
        args = build_parser().parse_args(argv[1:])
        assert (args.stage, args.mined_run, args.language) == (stage, RUN, "en")
        assert args.started == NIGHT.started and args.since == NIGHT.since
        assert args.k == 5 and args.top_n is None
    # every run option the DAG passes is one the command takes
    every = {o.name: o.default if o.default not in (None, "") else 1 for o in RUN_OPTIONS}
    every = {k: v for k, v in every.items() if k not in ("answers", "answers_sha256")}
    parsed = build_parser().parse_args(stage_command("mine", _night(options=every))[1:])
    assert {k: getattr(parsed, k) for k in every} == every


@pytest.mark.parametrize(
    "run",
    [None, "", "profile", "../../etc/3a5e6b511d0adc87", "p/../3a5e6b511d0adc87", "p/x; rm -rf /"],
)
def test_a_later_stage_needs_a_run_that_is_a_profile_and_a_run_id(run: str | None) -> None:
    with pytest.raises(EdgeQAError, match="run"):
        stage_command("build", NIGHT, run)


def test_a_param_cannot_add_a_shell_command() -> None:
    """Whatever the DAG's params hold reaches the job's shell as one quoted argument each."""
    hostile = _night(logs_uri="s3://b/x; touch /tmp/pwned #")
    argv = stage_command("mine", hostile)
    assert shlex.split(shlex.join(argv)) == argv
    with pytest.raises(StageJobError, match="unknown run options"):
        stage_command("mine", _night(options={"evil": "1"}))
    with pytest.raises(StageJobError, match="unknown stage"):
        stage_command("deploy", NIGHT, RUN)


def test_the_result_is_the_last_result_line_of_the_stage_asked_for() -> None:
    logs = "\n".join(
        [
            "Running entrypoint for job ...",
            result_line("mine", {"profile": "p", "run": "old"}),
            "progress 50%",
            result_line("generate", {"answers": 3}),
            result_line("mine", {"profile": "p", "run": "abc"}),
            STAGE_RESULT + "{not json",
            "2026-12-04 INFO shutting down",
        ]
    )
    assert parse_result("mine", logs) == {"profile": "p", "run": "abc"}
    assert parse_result("generate", logs) == {"answers": 3}
    assert parse_result("build", logs) is None
    assert parse_result("mine", "") is None


def test_a_job_key_is_a_ray_submission_id_unique_to_the_task() -> None:
    key = job_key("nightly_edge_release_en", "manual__2026-11-29T02:00:00+00:00", "mine")
    assert key.startswith("edgeqa-nightly_edge_release_en-manual__2026-11-29T02_00_00_00_00-mine-")
    assert all(c.isalnum() or c in "-_" for c in key)
    assert key != job_key("nightly_edge_release_en", "manual__2026-11-29T02:00:00+00:00", "build")
    # two runs that read alike once sanitized are still two keys
    assert job_key("d", "a:b", "mine") != job_key("d", "a_b", "mine")


def test_a_jobs_api_nobody_answers_fails_with_one_clear_line() -> None:
    from tests.serving import free_port

    job = StageJob(f"http://127.0.0.1:{free_port()}", "mine", "edgeqa-k", ["true"], retry_s=0.01)
    with pytest.raises(StageJobError, match=r"could not be reached \(EDGEQA_RAY_JOBS_ADDRESS"):
        job.run()


def test_the_jobs_address_must_be_a_jobs_api() -> None:
    from base.config import ConfigError
    from precompute.config import PrecomputeSettings

    for bad in ("ray://head:10001", "head:8265", "http://head:99999", "file:///x"):
        with pytest.raises(ConfigError, match="EDGEQA_RAY_JOBS_ADDRESS"):
            PrecomputeSettings.from_env({"EDGEQA_RAY_JOBS_ADDRESS": bad})
    settings = PrecomputeSettings.from_env({"EDGEQA_RAY_JOBS_ADDRESS": "https://head:8265/"})
    assert settings.ray_jobs_address == "https://head:8265"


def test_the_stage_command_refuses_a_run_that_is_not_one_and_a_night_without_a_zone() -> None:
    night = ["--logs", "file:///nowhere", "--out", "file:///nowhere", "--language", "en"]
    night += ["--since", "2026-11-22", "--until", "2026-11-28"]
    done = edgeqa_here({}, "precompute", "stage", "validate", *night, "--run", "../x/0123456789ab")
    assert done.returncode == 2 and "is not a run" in done.stderr, done.stderr
    done = edgeqa_here({}, "precompute", "stage", "validate", *night, "--run", f"p/{'0' * 16}")
    assert done.returncode == 2 and "has not been mined" in done.stderr, done.stderr
    done = edgeqa_here({}, "precompute", "stage", "build", *night)
    assert done.returncode == 2 and "needs the run mine decided" in done.stderr, done.stderr
    # argparse's own refusal: a time without a zone (the release's instant would be the machine's)
    naive = ["--started", "2026-11-29T02:00:00"]
    wrong = subprocess.run(
        [sys.executable, "-m", "edgeqa", "precompute", "stage", "mine", *night, *naive],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2 and "has no time zone" in wrong.stderr


def test_parse_run_takes_a_profile_and_a_run_id_only() -> None:
    assert parse_run(RUN) == ("smollm2-135m-en-b9321e8cfb", "3a5e6b511d0adc87")
    for bad in ("", "p", "p/", "/0123456789ab", "../0123456789ab", "a..b/0123456789ab", "p/XYZ"):
        with pytest.raises(EdgeQAError, match="is not a run"):
            parse_run(bad)


# -- against a stand-in for Ray's Jobs API (its REST shape), for what a real head will not do on
# -- demand: lose an answer, fail for a while, answer in HTML, run for a thousand polls


class _JobsApi:
    """Ray's Jobs REST endpoints over a dict of jobs: ``polls`` status reads before a job ends
    (SUCCEEDED, printing ``result``), and faults to inject."""

    def __init__(self, polls: int, result: dict[str, Any]) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse, Response
        from starlette.routing import Route

        self.jobs: dict[str, dict[str, Any]] = {}
        self.reads: dict[str, int] = {}
        self.lose_submit_answer = False
        self.down_for = 0  # status reads answered 503
        self.html = False

        async def submit(request: Request) -> Response:
            body = await request.json()
            sid = body["submission_id"]
            if sid in self.jobs:
                return PlainTextResponse(f"Job with submission_id {sid} already exists", 500)
            self.jobs[sid] = {**body, "status": "RUNNING", "start_time": 1000 * time.time()}
            if self.lose_submit_answer:  # submitted, but the answer never arrives whole
                self.lose_submit_answer = False
                return PlainTextResponse("gateway timeout", 504)
            return JSONResponse({"submission_id": sid, "job_id": sid})

        async def listing(request: Request) -> Response:
            return JSONResponse(list(self.jobs.values()))

        async def info(request: Request) -> Response:
            if self.html:
                return PlainTextResponse("<html>a login page</html>")
            if self.down_for:
                self.down_for -= 1
                return PlainTextResponse("unavailable", 503)
            sid = request.path_params["sid"]
            job = self.jobs[sid]
            self.reads[sid] = self.reads.get(sid, 0) + 1
            if self.reads[sid] >= polls:
                job["status"] = "SUCCEEDED"
            return JSONResponse(job)

        async def logs(request: Request) -> Response:
            job = self.jobs[request.path_params["sid"]]
            done = job["status"] == "SUCCEEDED"
            tail = "ly done\n" + result_line("mine", result) if done else ""
            return JSONResponse({"logs": "Running entrypoint\npartial" + tail})

        self.app = Starlette(
            routes=[
                Route("/api/jobs/", submit, methods=["POST"]),
                Route("/api/jobs/", listing, methods=["GET"]),
                Route("/api/jobs/{sid}", info, methods=["GET"]),
                Route("/api/jobs/{sid}/logs", logs, methods=["GET"]),
            ]
        )


def _stage_job(url: str, key: str, lines: list[str] | None = None) -> StageJob:
    job = StageJob(url, "mine", key, ["edgeqa", "precompute", "stage", "mine"], poll_s=0.0)
    job.retry_s = 0.001
    if lines is not None:
        job.on_line = lines.append
    return job


def test_a_long_job_a_lost_submit_answer_an_outage_and_a_page_that_is_not_json() -> None:
    from tests.serving import Server

    api = _JobsApi(polls=1100, result={"run": "abc"})
    with Server(api.app) as server:
        # a thousand polls and more: the wait between them stays bounded (it once overflowed)
        lines: list[str] = []
        result, ran = _stage_job(server.url, "edgeqa-long", lines).run()
        assert result == {"run": "abc"} and ran["submission_id"] == "edgeqa-long-1"
        # a line half written when asked is shown once, whole
        assert "partially done" in lines and "partial" not in lines
        # the submission went through but its answer was lost: the task finds its job by id
        api.lose_submit_answer = True
        result, ran = _stage_job(server.url, "edgeqa-lost").run()
        assert ran["submission_id"] == "edgeqa-lost-1" and not ran["attached"]
        assert list(api.jobs).count("edgeqa-lost-1") == 1
        # a try is one past the highest of its key, whatever the count
        api.jobs["edgeqa-lost-7"] = {**api.jobs["edgeqa-lost-1"], "submission_id": "edgeqa-lost-7"}
        api.jobs["edgeqa-lost-7"]["status"] = "FAILED"
        _, ran = _stage_job(server.url, "edgeqa-lost").run()
        assert ran["submission_id"] == "edgeqa-lost-8"
        # the Jobs API away for a while (503s past the retries): the job runs on, it is waited for
        api.down_for = 12
        result, _ = _stage_job(server.url, "edgeqa-outage").run()
        assert result == {"run": "abc"} and api.down_for == 0
        # something else at the address answers, but not JSON: one clear line, no traceback
        api.html = True
        with pytest.raises(StageJobError, match="no JSON: is EDGEQA_RAY_JOBS_ADDRESS"):
            _stage_job(server.url, "edgeqa-html").run()


def test_the_cpu_stages_drivers_ask_for_a_cpu_worker_and_the_rest_stay_on_the_head() -> None:
    """On the cluster (``EDGEQA_RAY_CPU_RESOURCE``, Terraform's ``cpu_worker``) the jobs of mine,
    build and validate ask Ray for a CPU worker for their drivers; generate, publish (it signs)
    and prune stay on the head; a laptop's Ray (the setting unset) asks for nothing it lacks."""
    from precompute.config import PrecomputeSettings
    from precompute.fleet.jobs import CPU_STAGES, stage_resources
    from tests.serving import Server

    assert set(CPU_STAGES) == {"mine", "build", "validate"} and set(CPU_STAGES) < set(STAGES)
    for stage in STAGES:
        wanted = {"cpu_worker": 1.0} if stage in CPU_STAGES else {}
        assert stage_resources(stage, "cpu_worker") == wanted
        assert stage_resources(stage, "") == {}
    with pytest.raises(EdgeQAError, match="EDGEQA_RAY_CPU_RESOURCE"):
        PrecomputeSettings.from_env({"EDGEQA_RAY_CPU_RESOURCE": "cpu worker;x"})

    api = _JobsApi(polls=1, result={"run": "abc"})
    with Server(api.app) as server:
        job = _stage_job(server.url, "edgeqa-cpu")
        job.resources = stage_resources("mine", "cpu_worker")
        job.run()
        assert api.jobs["edgeqa-cpu-1"]["entrypoint_resources"] == {"cpu_worker": 1.0}
        _stage_job(server.url, "edgeqa-head").run()
        assert "entrypoint_resources" not in api.jobs["edgeqa-head-1"]
