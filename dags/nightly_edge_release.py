"""Nightly edge release: mine the request logs, answer the hot questions, publish to the edge.

One DAG per language profile in ``EDGEQA_LANGUAGES`` (``nightly_edge_release_en``,
``nightly_edge_release_zh``): each mines its language's questions only (``languages.py``: CJK
questions are ``zh``) and publishes that profile's release with that language's embedder.

mine -> generate -> build -> validate -> publish -> prune: the stages of ``precompute.pipeline``
(``STAGES``), in its order. No stage runs on Airflow's workers: each task submits its stage as a
Ray Job (``precompute/fleet/jobs.py``) to the cluster's Jobs API, ``EDGEQA_RAY_JOBS_ADDRESS``
(the fleet's head: ``infra/terraform/modules/ray``; a local ``ray start --head`` on a laptop),
as the command a person would type (``edgeqa precompute stage <stage> ...``), follows its log
and takes its result; the task process imports none of torch, faiss, duckdb or transformers. A
job outlives its task: a task started again (its worker restarted, an Airflow retry) follows the
job of its stage still running instead of submitting another. The stages keep their state in the
output store (the run's work area); the model stages inside them are Ray Data jobs on the same
cluster. A partition is checkpointed in the store as soon as it is answered, so
a retry, a lost Ray worker or a rerun redoes only the partitions not written yet. The
validate task is the quality gate: empty answers, a calibrated precision below target, or a
release shrinking by more than ``max_shrink`` against its parent fails the run and the previous
release stays live. Re-running a data interval reuses the finished generation partitions and
builds the same release (built as of the end of its last log day); publishing it again is a no-op.

The params are ``precompute.config.RUN_OPTIONS`` (the same as ``edgeqa precompute run``'s
options; those with an ``EDGEQA_*`` setting default to the Ray cluster's, where the stage runs)
plus the expected profile and the window. A run config cannot lower the bar: the stores are the
deployment's ``EDGEQA_STORE`` (the Airflow workers'), the curated answers file and its pin the
cluster's settings (no param), k no lower than ``EDGEQA_MIN_USERS`` (the param's minimum where the
DAG is parsed; the stage refuses below the cluster's); a config naming a store, the answers or
their pin, or any key that is not a param, is refused before a stage is submitted. The logs
window ends with the last full UTC day before the data interval's end (the 02:00 run of Dec 2
mines up to Dec 1) and spans ``window_days``. Parsing this file
imports Airflow and the settings only; a task adds Ray's job client.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from precompute.config import RUN_OPTIONS, PrecomputeSettings, check_run_config

_JSON_TYPES = {int: "integer", float: "number", str: "string"}


def _param(option: Any, settings: PrecomputeSettings) -> Param:
    """The option as a DAG param. One that has an ``EDGEQA_*`` setting defaults to null: the
    setting of the Ray cluster the stage runs on (else its default) applies unless the run sets
    it. One whose setting is a floor (k) may not go below ``settings``' (where the DAG is
    parsed): Airflow refuses the run as it is triggered; the stage refuses below its own."""
    minimum = getattr(settings, option.field) if option.floor else option.minimum
    bounds = {"minimum": minimum, "maximum": option.maximum}
    schema: dict[str, Any] = {k: v for k, v in bounds.items() if v is not None}
    if option.choices:
        schema["enum"] = [*option.choices] + ([None] if option.section == "settings" else [])
    if option.section == "settings":
        variable = f"EDGEQA_{option.field.upper()}"
        text = f"{option.help} (null: the cluster's {variable}, else {option.default})"
        return Param(None, type=[_JSON_TYPES[option.kind], "null"], description=text, **schema)
    return Param(option.default, type=_JSON_TYPES[option.kind], description=option.help, **schema)


def _night() -> Any:
    """The run's params and data interval: the night its stages run (``jobs.RunSpec``)."""
    from airflow.sdk.exceptions import AirflowFailException

    from base.errors import EdgeQAError
    from precompute.fleet.jobs import RunSpec

    context = get_current_context()
    p = context["params"]
    settings = PrecomputeSettings.from_env()
    try:  # refused for good: a retry would be refused the same
        check_run_config(getattr(context["dag_run"], "conf", None) or {}, [*_PARAMS, "language"])
        store = _store(settings.store)
    except EdgeQAError as error:
        raise AirflowFailException(str(error)) from None
    # a manual or API run may have no data interval: it ends when the run was asked for
    interval_end = context.get("data_interval_end") or context.get("logical_date")
    end: datetime = interval_end or context["dag_run"].run_after
    until = (end - timedelta(days=1)).date()  # the last full (UTC) day before the interval's end
    since = until - timedelta(days=p["window_days"] - 1)
    # every task of the run builds as of the same instant: a rerun builds the same release
    options = {o.name: p[o.name] for o in RUN_OPTIONS if o.dag}
    language = p["language"]
    return RunSpec(store, store, since, until, language, end, "airflow", options)


def _store(store: str) -> str:
    """The night's store (its logs and its releases): the deployment's ``EDGEQA_STORE``, which
    must name a place the cluster's jobs reach the same (a bucket, an absolute path)."""
    from base.config import ConfigError

    if not store.startswith(("s3://", "file:///", "/")):
        raise ConfigError(
            f"EDGEQA_STORE is {store!r} where the DAG runs: set it on the Airflow workers to the "
            "deployment's store (s3://bucket/prefix; file:///absolute/path for one machine)"
        )
    return store


# the hours a stage's job may run before its task stops it (the night's budget is 2 h at the
# planned scale, docs/capacity.md: these stop what is stuck, not what is slow); the task's own
# execution_timeout is 10 minutes more (``_timeout``)
STAGE_HOURS = {"mine": 6, "generate": 8, "build": 6, "validate": 2, "publish": 6, "prune": 2}


def _stage(stage: str, mined: Any = None) -> dict[str, Any]:
    """Run ``stage`` of this night as a Ray Job on the cluster (``precompute/fleet/jobs.py``) and
    wait for it: its result (``precompute/results.py``: the stage's model, read from the job's
    last line) as XCom's JSON, with what the task saw of the job (``ray_job``). A job still
    running from an earlier try of this task is followed, not submitted again. The job is
    stopped once it has run ``STAGE_HOURS`` since it was submitted."""
    from precompute.fleet.jobs import (
        StageJob,
        job_key,
        stage_command,
        stage_resources,
        task_process,
    )
    from precompute.results import RESULTS, Mined

    context = get_current_context()
    run = Mined.of(mined).ref if mined else None
    settings = PrecomputeSettings.from_env()
    night = _night()  # refused (a run config, the store) before anything is submitted
    job = StageJob(
        settings.ray_jobs_address,
        stage,
        job_key(context["dag"].dag_id, context["run_id"], stage),
        stage_command(stage, night, run),
        token=settings.ray_jobs_token,
        resources=stage_resources(stage, settings.ray_cpu_resource),
    )
    result, ran = job.run(timeout_s=STAGE_HOURS[stage] * 3600)
    found = RESULTS[stage].of(result)
    return {**found.as_json(), "ray_job": {**ran, "task_process": task_process()}}


def _timeout(stage: str) -> timedelta:
    return timedelta(hours=STAGE_HOURS[stage], minutes=10)


def _params(settings: PrecomputeSettings) -> dict[str, Param]:
    """The DAG's params but ``language`` (each DAG's own): no store, no answers file, no pin."""
    return {
        "profile": Param("", type="string", description="expected profile ('' = any)"),
        "window_days": Param(7, type="integer", minimum=1, description="days of logs mined"),
        **{o.name: _param(o, settings) for o in RUN_OPTIONS if o.dag},
    }


_SETTINGS = PrecomputeSettings.from_env()
_PARAMS = _params(_SETTINGS)


def nightly_edge_release(language: str) -> Any:
    """The DAG of ``language``'s profile."""
    return dag(
        dag_id=f"nightly_edge_release_{language}",
        schedule="0 2 * * *",  # 02:00 UTC, after the day's logs are flushed
        start_date=datetime(2026, 11, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        tags=["edgeqa", "precompute", "edge"],
        default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
        params={**_PARAMS, "language": Param(language, type="string", enum=[language])},
        doc_md=__doc__,
    )(_pipeline)()


def _pipeline() -> None:
    # task arguments are XComArgs when wired below and plain values when the task runs: Any.
    # Each task submits its stage as a Ray Job and waits: a night stuck waiting for GPUs fails
    # (its job stopped) and is retried
    @task(execution_timeout=_timeout("mine"))
    def mine() -> dict[str, Any]:
        from precompute.results import Mined

        mined = _stage("mine")
        profile = Mined.of(mined).profile
        expected = get_current_context()["params"]["profile"]
        if expected and expected != profile:
            raise ValueError(f"profile {profile} is not the expected {expected}")
        return mined

    @task(retries=3, retry_exponential_backoff=True, execution_timeout=_timeout("generate"))
    def generate(mined: Any) -> dict[str, Any]:
        return _stage("generate", mined)

    @task(execution_timeout=_timeout("build"))
    def build(mined: Any, generated: Any) -> dict[str, Any]:
        return _stage("build", mined)

    @task(retries=0, execution_timeout=_timeout("validate"))  # a refused release stays refused
    def validate(mined: Any, built: Any) -> dict[str, Any]:
        return _stage("validate", mined)

    @task(execution_timeout=_timeout("publish"))
    def publish(mined: Any, validated: Any) -> dict[str, Any]:
        return _stage("publish", mined)

    @task(execution_timeout=_timeout("prune"))
    def prune(mined: Any, published: Any) -> dict[str, Any]:
        return _stage("prune", mined)

    mined = mine()
    built = build(mined, generate(mined))
    prune(mined, publish(mined, validate(mined, built)))


for _language in _SETTINGS.language_list:
    globals()[f"nightly_edge_release_{_language}"] = nightly_edge_release(_language)
