"""Nightly edge release: mine the request logs, answer the hot questions, publish to the edge.

One DAG per language profile in ``EDGEQA_LANGUAGES`` (``nightly_edge_release_en``,
``nightly_edge_release_zh``): each mines its language's questions only (``languages.py``: CJK
questions are ``zh``) and publishes that profile's release with that language's embedder.

mine -> generate -> build -> validate -> publish -> prune: the stages of ``precompute.pipeline``
(``STAGES``), in its order, each task one call. The stages keep their state in the output store,
so tasks may run on different workers. The model stages do not run on Airflow's workers: mining
embeds the night's wordings and generate answers every partition as Ray jobs
(``precompute/fleet/``) on the cluster ``EDGEQA_RAY_ADDRESS`` names (the GPU fleet:
``infra/terraform/modules/ray``), or on a local Ray when it is unset; the task is the job's
driver and waits for it. A partition is checkpointed in the store as soon as it is answered, so
a retry, a lost Ray worker or a rerun redoes only the partitions not written yet. The
validate task is the quality gate: empty answers, a calibrated precision below target, or a
release shrinking by more than ``max_shrink`` against its parent fails the run and the previous
release stays live. Re-running a data interval reuses the finished generation partitions and
builds the same release (built as of the end of its last log day); publishing it again is a no-op.

The params are ``precompute.config.RUN_OPTIONS`` (the same as ``edgeqa precompute run``'s
options; those with an ``EDGEQA_*`` setting default to the worker's) plus the stores, the expected
profile and the window. The logs window ends with the last full UTC day before the data interval's
end (the 02:00 run of Dec 2 mines up to Dec 1) and spans ``window_days``. Heavy imports stay
inside the task bodies: parsing this file imports Airflow and the settings only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from precompute.config import RUN_OPTIONS, PrecomputeSettings

_JSON_TYPES = {int: "integer", float: "number", str: "string"}


def _param(option: Any) -> Param:
    """The option as a DAG param. One that has an ``EDGEQA_*`` setting defaults to null: the
    worker's setting (else its default) applies unless the run sets it."""
    bounds = {"minimum": option.minimum, "maximum": option.maximum}
    schema: dict[str, Any] = {k: v for k, v in bounds.items() if v is not None}
    if option.choices:
        schema["enum"] = [*option.choices] + ([None] if option.section == "settings" else [])
    if option.section == "settings":
        text = f"{option.help} (null: EDGEQA_{option.field.upper()}, else {option.default})"
        return Param(None, type=[_JSON_TYPES[option.kind], "null"], description=text, **schema)
    return Param(option.default, type=_JSON_TYPES[option.kind], description=option.help, **schema)


def _run_params() -> Any:
    """The run's params and data interval as ``precompute.pipeline.RunParams``."""
    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams

    context = get_current_context()
    p = context["params"]
    # a manual or API run may have no data interval: it ends when the run was asked for
    interval_end = context.get("data_interval_end") or context.get("logical_date")
    end: datetime = interval_end or context["dag_run"].run_after
    until = (end - timedelta(days=1)).date()  # the last full (UTC) day before the interval's end
    config = PipelineConfig.from_env(**{o.name: p[o.name] for o in RUN_OPTIONS})
    since = until - timedelta(days=p["window_days"] - 1)
    # every task of the run builds as of the same instant: a rerun builds the same release
    return RunParams(
        p["logs_uri"],
        p["out_uri"],
        since,
        until,
        config,
        "airflow",
        started=end,
        language=p["language"],
    )


_PARAMS = {
    "logs_uri": Param("s3://edgeqa-prod/store", type="string", description="request logs"),
    "out_uri": Param("s3://edgeqa-prod/store", type="string", description="releases"),
    "profile": Param("", type="string", description="expected profile ('' = any)"),
    "window_days": Param(7, type="integer", minimum=1, description="days of logs mined"),
    **{option.name: _param(option) for option in RUN_OPTIONS},
}


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
    # task arguments are XComArgs when wired below and plain values when the task runs: Any
    # the Ray jobs' tasks end in time: a night stuck waiting for GPUs fails, and is retried
    @task(execution_timeout=timedelta(hours=6))
    def mine() -> dict[str, Any]:
        from precompute.pipeline import mine_stage

        mined: dict[str, Any] = mine_stage(_run_params())
        expected = get_current_context()["params"]["profile"]
        if expected and expected != mined["profile"]:
            raise ValueError(f"profile {mined['profile']} is not the expected {expected}")
        return mined

    @task(retries=3, retry_exponential_backoff=True, execution_timeout=timedelta(hours=8))
    def generate(mined: Any) -> dict[str, Any]:
        from precompute.pipeline import generate_stage

        return generate_stage(_run_params(), mined)

    @task
    def build(mined: Any, generated: Any) -> dict[str, Any]:
        from precompute.pipeline import build_stage

        return build_stage(_run_params(), mined)

    @task(retries=0)  # a refused release stays refused
    def validate(mined: Any, built: Any) -> dict[str, Any]:
        from precompute.pipeline import validate_stage

        return validate_stage(_run_params(), mined)

    @task
    def publish(mined: Any, validated: Any) -> dict[str, Any]:
        from precompute.pipeline import publish_stage

        return publish_stage(_run_params(), mined)

    @task
    def prune(mined: Any, published: Any) -> dict[str, Any]:
        from precompute.pipeline import prune_stage

        return prune_stage(_run_params(), mined)

    mined = mine()
    built = build(mined, generate(mined))
    prune(mined, publish(mined, validate(mined, built)))


for _language in PrecomputeSettings.from_env().language_list:
    globals()[f"nightly_edge_release_{_language}"] = nightly_edge_release(_language)
