"""Nightly edge release: mine the request logs, answer the hot questions, publish to the edge.

mine -> generate (one mapped task per partition, pool ``gpu_a10``) -> build -> validate -> publish
-> prune. Wiring only: each task is one call into ``precompute.stages``, which keeps the state
between tasks in the output store, so tasks may run on different workers. The validate task is a
quality gate: an empty release, empty answers, a calibrated precision below target, or a release
shrinking by more than ``max_shrink`` against its parent fails the run and the previous release
stays live. Re-running a data interval reuses the finished generation partitions and builds the
same release (built as of the interval's end); publishing it again is a no-op.

The logs window ends with the last full day of the data interval and spans ``window_days``.
Heavy imports stay inside the task bodies: parsing this file imports Airflow only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

GPU_POOL = "gpu_a10"


def _stage_params() -> Any:
    """The run's params and data interval as ``precompute.stages.StageParams``."""
    from precompute.pipeline import PrecomputeConfig
    from precompute.stages import GateConfig, StageParams

    context = get_current_context()
    p = context["params"]
    end = context["data_interval_end"] or context["logical_date"]
    until = (end - timedelta(seconds=1)).date()  # the last full day of the interval
    config = PrecomputeConfig.from_env(
        k=p["k"], top_n=p["top_n"], max_tokens=p["max_tokens"],
        partition_size=p["partition_size"], keep=p["keep"], quantization=p["quantization"],
    )  # fmt: skip
    return StageParams(
        logs_uri=p["logs_uri"], out_uri=p["out_uri"],
        since=until - timedelta(days=p["window_days"] - 1), until=until, config=config,
        gate=GateConfig(min_precision=p["min_precision"], max_shrink=p["max_shrink"]),
    )  # fmt: skip


@dag(
    dag_id="nightly_edge_release",
    schedule="0 2 * * *",  # 02:00 UTC, after the day's logs are flushed
    start_date=datetime(2026, 11, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["edgeqa", "precompute", "edge"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    params={
        "logs_uri": Param("s3://edgeqa-prod/store", type="string", description="request logs"),
        "out_uri": Param("s3://edgeqa-prod/store", type="string", description="releases"),
        "profile": Param("", type="string", description="expected profile ('' = any)"),
        "window_days": Param(7, type="integer", minimum=1),
        "k": Param(5, type="integer", minimum=1, description="distinct users per phrasing"),
        "top_n": Param(10000, type="integer", minimum=1),
        "max_tokens": Param(256, type="integer", minimum=1),
        "quantization": Param("int8", enum=["int8", "bf16", "none"], description="weights"),
        "partition_size": Param(64, type="integer", minimum=1),
        "keep": Param(5, type="integer", minimum=2, description="releases kept for rollback"),
        "min_precision": Param(0.95, type="number", minimum=0, maximum=1),
        "max_shrink": Param(0.5, type="number", minimum=0, maximum=1),
    },
    doc_md=__doc__,
)
def nightly_edge_release() -> None:
    # task arguments are XComArgs when wired below and plain values when the task runs: Any
    @task
    def mine() -> dict[str, Any]:
        from precompute.stages import mine_stage

        mined: dict[str, Any] = mine_stage(_stage_params())
        expected = get_current_context()["params"]["profile"]
        if expected and expected != mined["profile"]:
            raise ValueError(f"profile {mined['profile']} is not the expected {expected}")
        return mined

    @task
    def partitions(mined: Any) -> list[int]:
        return list(mined["partitions"])

    @task(pool=GPU_POOL, retries=3, retry_exponential_backoff=True, max_active_tis_per_dag=8)
    def generate(partition: Any, mined: Any) -> dict[str, Any]:
        from precompute.stages import generate_stage

        return generate_stage(_stage_params(), mined["profile"], mined["run"], partition)

    @task
    def build(mined: Any, generated: Any) -> dict[str, Any]:
        from precompute.stages import build_stage

        return build_stage(_stage_params(), mined["profile"], mined["run"])

    @task(retries=0)  # a refused release stays refused
    def validate(mined: Any, built: Any) -> dict[str, Any]:
        from precompute.stages import validate_stage

        return validate_stage(_stage_params(), mined["profile"], mined["run"])

    @task
    def publish(mined: Any, validated: Any) -> dict[str, Any]:
        from precompute.stages import publish_stage

        return publish_stage(_stage_params(), mined["profile"], mined["run"])

    @task
    def prune(mined: Any, published: Any) -> dict[str, Any]:
        from precompute.stages import prune_stage

        return prune_stage(_stage_params(), mined["profile"])

    mined = mine()
    generated = generate.partial(mined=mined).expand(partition=partitions(mined))
    built = build(mined, generated)
    prune(mined, publish(mined, validate(mined, built)))


nightly_edge_release()
