"""What a DAG run's config may change (issue 48, item 5): nothing that lowers the bar. The stores
are the deployment's ``EDGEQA_STORE``, the curated answers and their pin the cluster's settings,
and k no lower than ``EDGEQA_MIN_USERS``: a run config that says otherwise is refused, naming
the param, before a stage is submitted. The DAG file is imported in a child (Airflow reads its
configuration at import) and its params and night checked there, no Airflow run needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from base.config import ConfigError

ROOT = Path(__file__).parents[2]
DAGS = ROOT / "dags"
STORE = "s3://edgeqa-deployed/store"

# a run config's checks, each in the child: the Param validation Airflow does as it creates the
# run (the scheduler's ``dag.params.deep_merge(conf).validate()``), then the night the first
# task builds (the stages' stores, its options) or the error it raises before it submits anything
_CHILD = """
import copy, json, sys, types
from datetime import UTC, datetime
sys.path.insert(0, sys.argv[1])
import nightly_edge_release as module
dag = module.nightly_edge_release_en
out = {"params": sorted(dag.params.keys())}
for name, conf in json.loads(sys.argv[2]).items():
    merged = copy.deepcopy(dag.params)  # as the scheduler's deep_merge(conf), then validate
    for key, value in conf.items():
        if key in merged:
            merged.get_param(key).value = value
        else:
            merged[key] = value
    try:
        params = merged.validate()
    except Exception as error:
        out[name] = {"refused_by": "params", "error": str(error)}
        continue
    end = datetime(2026, 11, 29, 2, tzinfo=UTC)
    run = types.SimpleNamespace(conf=conf, run_after=end)
    context = {"params": params, "dag_run": run, "data_interval_end": end}
    module.get_current_context = lambda: context
    try:
        spec = module._night()
    except Exception as error:
        out[name] = {"refused_by": "task", "error": f"{type(error).__name__}: {error}"}
        continue
    out[name] = {"logs": spec.logs_uri, "out": spec.out_uri, "options": dict(spec.options)}
print("RESULT " + json.dumps(out, default=str))
"""

CONFS: dict[str, dict[str, Any]] = {
    "none": {},
    "raised_k": {"k": 9},
    "lowered_k": {"k": 2},
    "logs_elsewhere": {"logs_uri": "s3://attacker/store"},
    "out_elsewhere": {"out_uri": "file:///tmp/elsewhere"},
    "same_store_named": {"out_uri": STORE},
    "own_pin": {"answers_sha256": "cd" * 32},
    "own_answers": {"answers": "s3://attacker/faq.jsonl"},
    "unknown": {"min_user": 1},
}


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EDGEQA_"))},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PYTHONPATH": str(ROOT),
        # the Airflow workers' deployment settings
        "EDGEQA_STORE": STORE,
        "EDGEQA_MIN_USERS": "5",
        "EDGEQA_LANGUAGES": "en",
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(DAGS), json.dumps(CONFS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    result: dict[str, Any] = json.loads(found[-1].removeprefix("RESULT "))
    return result


def test_the_dag_offers_no_store_no_answers_file_and_no_pin(nights: dict[str, Any]) -> None:
    params = set(nights["params"])
    assert not params & {"logs_uri", "out_uri", "answers", "answers_sha256"}
    assert {"k", "top_n", "window_days", "profile", "language", "max_shrink"} <= params


def test_the_stores_are_the_deployment_s(nights: dict[str, Any]) -> None:
    for name in ("none", "raised_k"):
        assert "logs" in nights[name], nights[name]
        assert (nights[name]["logs"], nights[name]["out"]) == (STORE, STORE), nights[name]
    assert nights["raised_k"]["options"]["k"] == 9
    assert nights["none"]["options"]["k"] is None  # the cluster's EDGEQA_MIN_USERS
    assert not {"answers", "answers_sha256"} & set(nights["none"]["options"])


@pytest.mark.parametrize(
    ("conf", "param", "says"),
    [
        ("logs_elsewhere", "logs_uri", "EDGEQA_STORE"),
        ("out_elsewhere", "out_uri", "EDGEQA_STORE"),
        ("same_store_named", "out_uri", "EDGEQA_STORE"),
        ("own_pin", "answers_sha256", "EDGEQA_CURATED_ANSWERS_SHA256"),
        ("own_answers", "answers", "EDGEQA_CURATED_ANSWERS"),
        ("unknown", "min_user", "not a param"),
    ],
)
def test_a_run_config_that_points_elsewhere_or_brings_its_own_pin_is_refused(
    nights: dict[str, Any], conf: str, param: str, says: str
) -> None:
    refused = nights[conf]
    assert "refused_by" in refused, refused
    assert param in refused["error"] and says in refused["error"], refused


def test_a_run_config_may_not_lower_k(nights: dict[str, Any]) -> None:
    refused = nights["lowered_k"]
    assert refused.get("refused_by") == "params", refused  # as Airflow creates the run
    assert "param k" in refused["error"], refused


def test_check_run_config_names_what_a_run_may_not_set() -> None:
    from precompute.config import check_run_config

    params = ("k", "top_n", "window_days")
    check_run_config({"k": 7, "top_n": None}, params)
    check_run_config({}, params)
    with pytest.raises(ConfigError, match=r"logs_uri.*EDGEQA_STORE"):
        check_run_config({"logs_uri": "s3://x/store"}, params)
    with pytest.raises(ConfigError, match=r"answers_sha256.*EDGEQA_CURATED_ANSWERS_SHA256"):
        check_run_config({"k": 7, "answers_sha256": "ab" * 32}, params)
    with pytest.raises(ConfigError, match=r"kk.*not a param"):
        check_run_config({"kk": 3}, params)


def test_a_run_config_may_tighten_the_quality_gate_never_loosen_it() -> None:
    from precompute.config import check_run_config

    params = ("min_rows", "min_precision", "max_shrink")
    check_run_config({"min_precision": 0.99, "max_shrink": 0.1, "min_rows": 50}, params)
    for loose in ({"min_precision": 0.5}, {"max_shrink": 1.0}, {"min_rows": 0}):
        with pytest.raises(ConfigError, match=f"{next(iter(loose))}=.* loosens the gate"):
            check_run_config(loose, params)
