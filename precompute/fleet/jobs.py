"""A nightly stage as a Ray Job: what each task of the Airflow DAG submits, waits for and reports.

The DAG's tasks do no stage work themselves: each one submits its stage to the Ray cluster's Jobs
API (``EDGEQA_RAY_JOBS_ADDRESS``, the head's ``http://<head>:8265``) as the command a person would
type, ``edgeqa precompute stage <stage> ...`` (``stage_command``), then follows the job's log into
the task's log until it ends and takes the stage's result from its last line (``STAGE_RESULT``).
The stage runs in the job's driver on the cluster (its model stages as Ray Data jobs on the same
cluster: ``precompute/fleet/``), reads what the stage before it left in the run's work area and
leaves its own there, so the task process holds a command line and a small result, never the
night's data. This module imports httpx and the settings only (no Ray, torch, faiss, duckdb or
transformers): the task process stays small (a test measures it).

A job outlives the task that submitted it: its submission id is the task's key (DAG, run, stage)
and a try number, so a task started again after its Airflow worker died (or an Airflow retry while
the job still runs) finds the job of its key still running and follows it instead of starting a
second (``StageJob.run``). A job that failed, or was stopped, is not reattached: the next try
submits a new one, which redoes only what the stage had not checkpointed (generation's
partitions).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from base.config import peak_rss_mb
from base.errors import EdgeQAError

log = logging.getLogger(__name__)

# the stage command's one line of result on stdout, the last one the job prints that starts so
STAGE_RESULT = "edgeqa-stage-result: "
# modules the task process must never import (the stage's work is the job's)
HEAVY_MODULES = ("torch", "faiss", "duckdb", "transformers", "sentence_transformers", "ray")
# the stages whose drivers do the work themselves (DuckDB, FAISS, the text rules and the k step
# on processes, the release's files): on a cluster, a CPU worker's (``EDGEQA_RAY_CPU_RESOURCE``).
# generate's driver only hands partitions to its actors; publish signs and flips the pointer
# (the head's role alone may); prune lists and deletes
CPU_STAGES = ("mine", "build", "validate")


class StageJobError(EdgeQAError, RuntimeError):
    """A stage's Ray Job failed, was stopped, ran past its time, or could not be submitted."""


class JobsApiUnreachable(StageJobError):
    """The Jobs API did not answer (a connection error or a 5xx, after retries)."""


@dataclass(frozen=True)
class RunSpec:
    """What a stage command needs of the night: the stores, the window, the language, the instant
    the release is built as of, who runs it, and the run options set (``RUN_OPTIONS`` names:
    None or absent = the cluster's ``EDGEQA_*`` setting, else the option's default)."""

    logs_uri: str
    out_uri: str
    since: date
    until: date
    language: str
    started: datetime
    runner: str = "airflow"
    options: Mapping[str, Any] = field(default_factory=dict)


def stage_command(stage: str, spec: RunSpec, run: str | None = None) -> list[str]:
    """``edgeqa precompute stage <stage> ...``: the stage of ``spec``'s night; ``run`` is the
    ``<profile>/<run>`` mine decided, for every stage after it."""
    from precompute.config import RUN_OPTIONS, STAGES
    from precompute.workarea import parse_run

    if stage not in STAGES:
        raise StageJobError(f"unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    known = {o.name for o in RUN_OPTIONS}
    unknown = sorted(set(spec.options) - known)
    if unknown:
        raise StageJobError(f"unknown run options {unknown} (known: {sorted(known)})")
    argv = ["edgeqa", "precompute", "stage", stage]
    argv += ["--logs", spec.logs_uri, "--out", spec.out_uri]
    argv += ["--since", spec.since.isoformat(), "--until", spec.until.isoformat()]
    argv += ["--language", spec.language, "--started", spec.started.isoformat()]
    argv += ["--runner", spec.runner]
    for name, value in sorted(spec.options.items()):
        if value is not None and value != "":  # unset: the cluster's setting or the default
            argv += [f"--{name.replace('_', '-')}", str(value)]
    if stage != "mine":
        parse_run(run or "")  # a profile and a run id, nothing a shell or a path could misread
        argv += ["--run", run or ""]
    return argv


def stage_resources(stage: str, cpu_resource: str) -> dict[str, float]:
    """The Ray resources a stage's job asks for its driver (``entrypoint_resources``): one of
    the CPU workers' ``cpu_resource`` (Terraform's ``cpu_worker``) for the CPU stages, none
    (the head) for the others and wherever ``cpu_resource`` is unset (a laptop's Ray)."""
    return {cpu_resource: 1.0} if cpu_resource and stage in CPU_STAGES else {}


def result_line(stage: str, result: Mapping[str, Any]) -> str:
    """The line a stage command prints last: ``STAGE_RESULT`` and its result as JSON."""
    return STAGE_RESULT + json.dumps({"stage": stage, "result": result}, default=str)


def parse_result(stage: str, logs: str) -> dict[str, Any] | None:
    """The result of ``stage`` from a job's log: its last ``STAGE_RESULT`` line (None if none)."""
    for line in reversed(logs.splitlines()):
        if line.startswith(STAGE_RESULT):
            try:
                found = json.loads(line[len(STAGE_RESULT) :])
            except json.JSONDecodeError:
                continue
            if isinstance(found, dict) and found.get("stage") == stage:
                result = found.get("result")
                return result if isinstance(result, dict) else None
    return None


def job_key(*parts: str) -> str:
    """A Ray submission id's stem from the task's key (``dag``, ``run``, ``stage``): readable, in
    the characters Ray takes, unique by a digest of the whole."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", "-".join(parts))[:80].strip("_-")
    return f"edgeqa-{readable}-{digest}"


def task_process() -> dict[str, Any]:
    """This process's peak resident memory (MB) and the heavy modules it imported (none, for a
    task that submits its stage)."""
    import sys

    heavy = [m for m in HEAVY_MODULES if m in sys.modules]
    return {"peak_rss_mb": peak_rss_mb(), "heavy_imports": heavy}


@dataclass
class StageJob:
    """One stage as a Ray Job on the cluster whose Jobs API is at ``address`` (``http://head:8265``).

    Spoken to over the Jobs API's REST endpoints (``/api/jobs/``: Ray's documented interface,
    the one its own ``JobSubmissionClient`` calls) with httpx: the task process imports no Ray
    and the Airflow workers need none installed."""

    address: str
    stage: str
    key: str  # the task's key: ``job_key(dag, run, stage)``
    argv: Sequence[str]
    token: str = field(default="", repr=False)  # Ray's auth token, when the cluster has one
    poll_s: float = 5.0
    retry_s: float = 2.0  # about the first wait before a request is tried again (then 2x, 4x)
    on_line: Callable[[str], None] = field(default=lambda line: log.info("%s", line))
    # the Ray resources the job's driver needs (``stage_resources``): none = the head
    resources: Mapping[str, float] = field(default_factory=dict)
    _http: Any = field(default=None, repr=False)  # one connection pool while ``run`` runs

    def run(self, timeout_s: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Submit the stage (or follow its job already running), wait for it, and return its
        result and what the task reports of the job (id, status, seconds, attached, its
        entrypoint). Raises ``StageJobError`` when it fails or has run ``timeout_s`` since it
        was submitted (a job followed again keeps its first start): it is then stopped."""
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        with httpx.Client(headers=headers, timeout=30) as http:
            self._http = http
            try:
                return self._run(timeout_s)
            finally:
                self._http = None

    def _run(self, timeout_s: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
        started = time.monotonic()
        found = self._running()
        if found is None:
            submission, entrypoint, age_s = self._submit(), shlex.join(self.argv), 0.0
        else:
            submission, entrypoint = str(found["submission_id"]), str(found.get("entrypoint"))
            began_ms = found.get("start_time")  # Ray's, in ms since the epoch (none: unknown)
            age_s = max(0.0, time.time() - began_ms / 1000) if began_ms else 0.0
        deadline = None if timeout_s is None else started + timeout_s - age_s
        status, logs, message = self._follow(submission, deadline)
        job = {
            "submission_id": submission,
            "status": status,
            "attached": found is not None,
            "seconds": round(time.monotonic() - started, 2),
            "entrypoint": entrypoint,
        }
        if status != "SUCCEEDED":
            why = message.strip().splitlines()
            raise StageJobError(
                f"stage {self.stage} (Ray job {submission}) ended {status}: "
                f"{_last_error(logs) or (why[-1] if why else 'no message')}"
            )
        result = parse_result(self.stage, logs)
        if result is None:
            raise StageJobError(
                f"stage {self.stage} (Ray job {submission}) succeeded without a result line "
                f"({STAGE_RESULT.strip()}): does the cluster run the DAG's edgeqa?"
            )
        return result, job

    def _call(self, method: str, path: str, retries: int = 3, **kwargs: Any) -> Any:
        """One request to the Jobs API; its JSON. Connection errors and 5xx are tried again
        ``retries`` times with backoff (a head restarting); then, or on any other refusal, or an
        answer that is not JSON, ``StageJobError`` (``JobsApiUnreachable`` for the former)."""
        import httpx

        from base.store import backoff_s

        url = f"{self.address}/api/jobs/{path}"
        attempt = 0
        while True:
            try:
                response = self._http.request(method, url, **kwargs)
                if response.status_code < 500:
                    break
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as error:
                problem = f"{type(error).__name__}: {error}"
            if attempt >= retries:
                raise JobsApiUnreachable(
                    f"the Ray Jobs API at {self.address} could not be reached "
                    f"(EDGEQA_RAY_JOBS_ADDRESS; a local one: `ray start --head`): {problem}"
                )
            time.sleep(backoff_s(attempt, self.retry_s))
            attempt += 1
        if response.status_code in (401, 403):
            what = "the token" if self.token else "a request without a token"
            raise StageJobError(
                f"the Ray Jobs API at {self.address} refused {what} (EDGEQA_RAY_JOBS_TOKEN, "
                f"the cluster's Ray auth token): HTTP {response.status_code}"
            )
        if response.status_code >= 400:
            text = response.text.strip().splitlines()
            raise StageJobError(
                f"the Ray Jobs API refused {method} {url}: HTTP {response.status_code} "
                f"{text[-1] if text else ''}"
            )
        try:
            return response.json()
        except ValueError:
            raise StageJobError(
                f"the Ray Jobs API at {self.address} answered {method} {url} with no JSON: "
                f"is EDGEQA_RAY_JOBS_ADDRESS the head's dashboard port?"
            ) from None

    def _ours(self) -> list[dict[str, Any]]:
        """Every job of this task's key, oldest first."""
        jobs = [j for j in self._call("GET", "") if _try_of(j.get("submission_id"), self.key)]
        return sorted(jobs, key=lambda j: j.get("start_time") or 0)

    def _running(self) -> dict[str, Any] | None:
        """The job of this task's key still pending or running (a task started again), if any."""
        live = [j for j in self._ours() if j.get("status") in ("PENDING", "RUNNING")]
        if not live:
            return None
        job = live[-1]
        self.on_line(
            f"following Ray job {job['submission_id']} ({job['status']}), submitted before"
        )
        return job

    def _submit(self) -> str:
        """Submit a new try (one past the highest of this key's). A submission whose answer was
        lost, or a try another process submitted under the same id at the same moment, is found
        by its id and followed, if it is this task's."""
        tries = [_try_of(j.get("submission_id"), self.key) or 0 for j in self._ours()]
        submission = f"{self.key}-{max(tries, default=0) + 1}"
        request = {
            "entrypoint": shlex.join(self.argv),
            "submission_id": submission,
            "metadata": {"edgeqa_stage": self.stage, "edgeqa_task": self.key},
        }
        if self.resources:  # the driver waits for a CPU worker (the autoscaler brings one)
            request["entrypoint_resources"] = dict(self.resources)
        try:
            self._call("POST", "", retries=0, json=request)
        except StageJobError as refused:
            try:
                there = self._call("GET", submission)
            except StageJobError:
                raise refused from None
            if (there.get("metadata") or {}).get("edgeqa_task") != self.key:
                raise refused from None
        self.on_line(f"submitted Ray job {submission}: {request['entrypoint']}")
        return submission

    def _follow(self, submission: str, deadline: float | None) -> tuple[str, str, str]:
        """Pass the job's new log lines to ``on_line`` until it ends: its status, whole log and
        Ray's message. The Jobs API out of reach is waited for (the job runs on without us),
        up to ``deadline``; past it the job is stopped and ``StageJobError`` raised."""
        shown, delay = 0, 0.25
        while True:
            try:
                info = self._call("GET", submission)
                logs = str(self._call("GET", f"{submission}/logs").get("logs", ""))
            except JobsApiUnreachable as error:
                if deadline is not None and time.monotonic() > deadline:
                    raise
                log.warning("%s; the job runs on, asking again", error)
                time.sleep(self.poll_s)
                continue
            status = str(info.get("status"))
            done = status in ("SUCCEEDED", "FAILED", "STOPPED")
            # whole lines only, until it ends: a line half written now is shown once, whole
            upto = len(logs) if done else logs.rfind("\n", shown) + 1
            for line in logs[shown:upto].splitlines():
                if line.strip():
                    self.on_line(line)
            shown = max(shown, upto)
            if done:
                return status, logs, str(info.get("message") or "")
            if deadline is not None and time.monotonic() > deadline:
                self._call("POST", f"{submission}/stop")
                raise StageJobError(
                    f"stage {self.stage} (Ray job {submission}) ran past its time: stopped"
                )
            # a short stage is seen ending soon, a long one asked every poll_s
            delay = min(self.poll_s, delay * 2)
            time.sleep(delay)


def _try_of(submission_id: str | None, key: str) -> int | None:
    """The try number of a submission id of ``key`` (``<key>-<n>``); None for another's."""
    found = re.fullmatch(re.escape(key) + r"-(\d+)", submission_id or "")
    return int(found.group(1)) if found else None


def _last_error(logs: str) -> str:
    """A failed stage command's own last line (``edgeqa: error: ...``), if it printed one."""
    for line in reversed(logs.splitlines()):
        if line.startswith("edgeqa: "):
            return line
    return ""
