"""MWAA's side of the DAG: its requirements file is in the repository where the airflow module
uploads it from (with its object version, so a change reaches the environment), names every
third-party distribution the DAG file and its tasks import that Airflow does not bring, and pins
each at the Ray image's version (``infra/image/constraints.txt``, what the Dockerfile's gpu target
installs under); the project's packages the DAG imports are uploaded beside it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.infra.test_terraform import _blocks, _one, parsed  # noqa: F401 (the fixture)

ROOT = Path(__file__).parents[2]
AIRFLOW = ROOT / "infra" / "terraform" / "modules" / "airflow"
REQUIREMENTS = AIRFLOW / "requirements.txt"
CONSTRAINTS = ROOT / "infra" / "image" / "constraints.txt"
DOCKERFILE = ROOT / "Dockerfile"

# what the DAG file imports when MWAA parses it, and what its tasks import when they run
# (dags/nightly_edge_release.py: precompute.config; _night and _stage: precompute.fleet.jobs,
# which imports precompute.workarea and base.store inside its calls)
DAG_IMPORTS = ("precompute.config", "precompute.fleet.jobs", "precompute.workarea", "base.store")
PROJECT = {"base", "policy", "origin", "precompute", "edge_index", "semantic", "edgeqa"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{path.name}: {line} is not pinned (==)"
        pins[_norm(req.name)] = spec.version
    return pins


def test_each_mwaa_pin_is_the_ray_images_and_within_the_projects_ranges() -> None:
    mwaa, image = _pins(REQUIREMENTS), _pins(CONSTRAINTS)
    assert mwaa, "MWAA's requirements pin what the DAG imports beyond Airflow"
    assert mwaa == image, f"MWAA pins {mwaa}, the Ray image {image}"
    # the image installs under those constraints (the gpu target: the Ray cluster's image)
    text = DOCKERFILE.read_text()
    assert "COPY infra/image/constraints.txt" in text
    assert re.search(r"pip install -c \S*constraints\.txt [^\n]*vllm==", text)
    with (ROOT / "pyproject.toml").open("rb") as f:
        declared = [Requirement(d) for d in tomllib.load(f)["project"]["dependencies"]]
    for req in declared:
        if _norm(req.name) in mwaa:
            assert req.specifier.contains(mwaa[_norm(req.name)]), f"{req} vs {mwaa}"


def _closure(names: set[str]) -> set[str]:
    """The installed distributions ``names`` need, theirs included (extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_what_the_dag_imports_is_airflows_the_requirements_or_uploaded_beside_it(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    probe = (
        "import importlib, json, sys; before = set(sys.modules); "
        f"[importlib.import_module(m) for m in {list(DAG_IMPORTS)!r}]; "
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    third_party = imported - set(sys.stdlib_module_names) - PROJECT - {"_distutils_hack"}
    third_party = {m for m in third_party if not m.startswith("_")}
    owners = metadata.packages_distributions()
    distributions = {_norm(d) for m in third_party for d in owners.get(m, [m])}
    try:
        airflow = _closure({"apache-airflow-core", "apache-airflow-task-sdk"})
    except Exception as error:  # pragma: no cover - only without Airflow's metadata
        pytest.skip(f"Airflow's metadata is not readable here: {error}")
    if "apache-airflow-core" not in airflow or len(airflow) < 10:
        pytest.skip("Airflow is not installed here: its own dependencies are read from it")
    missing = distributions - airflow - set(_pins(REQUIREMENTS))
    assert not missing, f"the DAG imports {sorted(missing)}: neither Airflow's nor pinned for MWAA"
    # the project's packages it imports are uploaded beside the DAG, and kept out of DAG parsing
    airflow_tf = parsed["modules/airflow/main.tf"]
    files = json.dumps(_one(airflow_tf["locals"]))
    shipped = set(re.search(r"\{([a-z_,]+)\}/\*\*/\*\.py", files).group(1).split(","))
    assert imported & PROJECT <= shipped, f"the DAG imports {imported & PROJECT}, {shipped} ship"
    ignore = _blocks(parsed, "modules/airflow/main.tf", "resource", "aws_s3_object")
    listed = {line.strip() for line in _one(ignore["airflowignore"]["content"]).splitlines()}
    assert {f"{p}/" for p in shipped} <= listed


def test_the_airflow_module_uploads_the_requirements_with_their_version(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    path = "modules/airflow/main.tf"
    objects = _blocks(parsed, path, "resource", "aws_s3_object")
    requirements = objects["requirements"]
    assert _one(requirements["source"]) == "${path.module}/requirements.txt"
    assert _one(requirements["key"]) == "requirements.txt"
    assert "filemd5" in _one(requirements["source_hash"])
    (env,) = _blocks(parsed, path, "resource", "aws_mwaa_environment").values()
    assert _one(env["requirements_s3_path"]) == "${aws_s3_object.requirements.key}"
    assert _one(env["requirements_s3_object_version"]) == "${aws_s3_object.requirements.version_id}"
    assert _one(env["startup_script_s3_object_version"]) == "${aws_s3_object.startup.version_id}"
    # the DAG and the packages: uploaded by the same apply, before the environment reads them
    code = objects["code"]
    assert "dags/*.py" in json.dumps(parsed[path]["locals"])
    assert _one(code["kms_key_id"]) == "${var.kms_key_arn}"
    root = {k: v for b in parsed["main.tf"]["module"] for k, v in b.items()}
    assert _one(root["airflow"]["source_root"]) == "${path.root}/../.."


def test_the_dags_tasks_send_mine_build_and_validate_to_the_cpu_workers(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    """MWAA's startup script gives the tasks EDGEQA_RAY_CPU_RESOURCE, the ray module's CPU worker
    resource; with it the DAG's jobs of mine, build and validate ask for one of it (their drivers
    on a CPU worker), generate, publish and prune for none (the head)."""
    from precompute.config import PrecomputeSettings
    from precompute.fleet.jobs import stage_resources

    startup = _blocks(parsed, "modules/airflow/main.tf", "resource", "aws_s3_object")["startup"]
    script = _one(startup["content"])
    assert "export EDGEQA_RAY_CPU_RESOURCE='${var.ray_cpu_resource}'" in script
    assert "EDGEQA_RAY_CPU_RESOURCE" in set(PrecomputeSettings.variables())
    root = {k: v for b in parsed["main.tf"]["module"] for k, v in b.items()}
    assert _one(root["airflow"]["ray_cpu_resource"]) == "${module.ray.cpu_worker_resource}"
    outputs = {k: v for b in parsed["modules/ray/outputs.tf"]["output"] for k, v in b.items()}
    value = _one(outputs["cpu_worker_resource"]["value"])
    assert value == "${one(keys(local.cpu_worker_resource))}"
    ray_locals = _one(parsed["modules/ray/main.tf"]["locals"])
    (resource,) = _one(ray_locals["cpu_worker_resource"])  # the one key the output names
    assert _one(ray_locals["cpu_worker_resource"]) == {resource: 1}
    assert re.fullmatch(r"[A-Za-z0-9_]{1,64}", resource)
    for stage in ("mine", "build", "validate"):
        assert stage_resources(stage, resource) == {resource: 1.0}, stage
    for stage in ("generate", "publish", "prune"):
        assert stage_resources(stage, resource) == {}, stage
