"""The CPU workers, where the drivers of mine, build and validate run (the DAG's tasks are given
``EDGEQA_RAY_CPU_RESOURCE``, and those jobs ask Ray for one ``cpu_worker``): their role may write
what those stages write — the caches across nights, the releases, the answer objects (created,
never replaced) — and never what only publish may (``current.json``, the revocation list, a
signature); their pods carry the settings the drivers read. The role is checked by evaluating it
against the object names the code itself makes (``base/release.py``, ``base/answer_objects.py``,
``precompute/nightcache.py``, ``precompute/workarea.py``, ``precompute/revocations.py``,
``precompute/prune.py``), so a renamed prefix on either side fails here."""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

from tests.infra.test_iam_patterns import BUCKET, role_statements
from tests.infra.test_terraform import _blocks, _flat, _one, parsed  # noqa: F401 (the fixture)

RAY = "modules/ray/main.tf"
SIGNING_KEY = "${var.signing_key_arn}"
PROFILE, RUN, VERSION = "en", "r0123456789abcdef", "20261205T000000Z-0123abcd"
IF_NONE_MATCH = "if-none-match"


def _statements(parsed: dict[str, Any], document: str) -> list[dict[str, Any]]:  # noqa: F811
    """The role's statements, its per-profile ones expanded (``var.profiles`` bound to en, zh)."""
    return role_statements(parsed, RAY, document)


def _matches(pattern: str, resource: str) -> bool:
    """IAM's resource wildcards: ``*`` any run of characters (``/`` included), ``?`` one."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, resource) is not None


def _conditions_hold(conditions: list[tuple[str, str, list[str]]], headers: set[str]) -> bool:
    for test, variable, values in conditions:
        if test == "Null" and variable == f"s3:{IF_NONE_MATCH}":
            present = IF_NONE_MATCH in headers
            if values != ["true" if not present else "false"]:
                return False
            continue
        if test == "StringLike" and variable == "s3:prefix":
            continue  # listing: not what these cases ask
        raise AssertionError(f"a condition this evaluator does not know: {test} {variable}")
    return True


def allowed(
    statements: list[dict[str, Any]],
    action: str,
    resource: str,
    headers: frozenset[str] = frozenset(),
) -> bool:
    """IAM's answer for one request: an explicit deny wins, then any allow whose conditions hold."""
    relevant = [
        st
        for st in statements
        if action in st["actions"] and any(_matches(r, resource) for r in st["resources"])
    ]
    if any(st["effect"] == "Deny" for st in relevant):
        return False
    return any(
        st["effect"] == "Allow" and _conditions_hold(st["conditions"], set(headers))
        for st in relevant
    )


def _keys() -> dict[str, str]:
    """Object names as the code makes them."""
    from base.answer_objects import object_path
    from base.release import pointer_path, release_prefix
    from precompute.clusterstate import ClusterState
    from precompute.nightcache import NightCache
    from precompute.prune import CHECKED, REFUSED
    from precompute.revocations import revocations_path
    from precompute.workarea import WorkArea

    cache = NightCache(None, PROFILE, "vectors", "f" * 16, date(2026, 12, 1), date(2026, 12, 7))  # type: ignore[arg-type]
    clusters = ClusterState(None, PROFILE, "f" * 16, date(2026, 12, 1), date(2026, 12, 7))  # type: ignore[arg-type]
    release = release_prefix(PROFILE, VERSION)
    work = WorkArea(None, PROFILE, RUN)  # type: ignore[arg-type]
    return {
        "log": "logs/dt=2026-12-05/00000.parquet",
        "model": "models/Meta-Llama-3.1-8B-Instruct-quantized.w8a8/config.json",
        "partition": work.partition(0),
        "built": f"{work.prefix}/built.json",
        "cache_part": f"{cache.prefix}/2026-12-01/00000-0a1b2c3d.parquet",
        # the carried clusters' state: its heads' index, written and, a night later, deleted
        "cluster_state": f"{clusters._stem()}.faiss",
        "release_file": f"{release}/manifest.json",
        "checked": f"{release}/{CHECKED}",
        "refused": f"{release}/{REFUSED}",
        "answer": f"{PROFILE}/{object_path('ab' * 32)}",
        "pointer": pointer_path(PROFILE),
        "revocations": revocations_path(PROFILE),
    }


def _arn(key: str) -> str:
    return f"{BUCKET}/{key}"


def test_the_cpu_workers_role_writes_what_mine_build_and_validate_write_and_never_publishes(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    cpu = _statements(parsed, "ray_cpu")
    keys = _keys()
    new = frozenset({IF_NONE_MATCH})

    def can(action: str, key: str, headers: frozenset[str] = frozenset()) -> bool:
        return allowed(cpu, f"s3:{action}", _arn(key), headers)

    # read: the logs, the models, the work areas, the parent release, the pointer, what is revoked
    for name in keys:
        assert can("GetObject", keys[name]), name
    # mine: the work area and the caches across nights, whose old parts it deletes
    for name in ("partition", "built", "cache_part", "cluster_state"):
        assert can("PutObject", keys[name]), name
    assert can("DeleteObject", keys["cache_part"]) and can("DeleteObject", keys["cluster_state"])
    # build: the release's files where they are served (conditional writes; a stopped upload's
    # leftovers cleared); validate: checked.json (replaced) and refused.json (lifted)
    for name in ("release_file", "checked", "refused"):
        assert can("PutObject", keys[name]) and can("PutObject", keys[name], new), name
        assert can("DeleteObject", keys[name]), name
    # the answer objects: created only, never replaced nor deleted (prune's, on the head)
    assert can("PutObject", keys["answer"], new)
    assert not can("PutObject", keys["answer"])
    assert not can("DeleteObject", keys["answer"])
    # what only publish and prune do: the pointer, the revocation list, a run's work area deleted
    for name in ("pointer", "revocations"):
        for headers in (frozenset(), new):
            assert not can("PutObject", keys[name], headers), name
        assert not can("DeleteObject", keys[name]), name
    for name in ("partition", "built", "log", "model"):
        assert not can("DeleteObject", keys[name]), name
    for name in ("log", "model"):
        assert not can("PutObject", keys[name], new), name
    # no signature, whatever else is granted: an explicit deny on the release key
    assert not allowed(cpu, "kms:Sign", SIGNING_KEY)
    assert not allowed(cpu, "kms:GetPublicKey", SIGNING_KEY)
    deny = {st["sid"]: st for st in cpu if st["effect"] == "Deny"}
    assert deny["NeverSigns"]["actions"] == {"kms:Sign"}
    assert deny["NeverPointersOrRevocations"]["resources"] == {
        f"{BUCKET}/*/current.json",
        f"{BUCKET}/*/revocations.json",
    }
    # nothing broad: every allow names its actions and resources
    for st in cpu:
        if st["effect"] == "Allow":
            assert "*" not in st["resources"] and not any("*" == a[-1:] for a in st["actions"])
            # (dynamodb:GetItem: the high-water mark, read only)
            assert all(
                a.startswith(("s3:", "kms:")) or a == "dynamodb:GetItem" for a in st["actions"]
            ), st["sid"]
    kms = {a for st in cpu if st["effect"] == "Allow" for a in st["actions"] if a.startswith("kms")}
    assert kms == {"kms:Decrypt", "kms:GenerateDataKey"}


def test_the_cpu_workers_role_holds_the_gpu_workers_and_the_head_alone_publishes(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    cpu, gpu, head = (_statements(parsed, d) for d in ("ray_cpu", "ray", "ray_head"))
    keys = _keys()
    cases = [
        (f"s3:{action}", _arn(key), headers)
        for key in keys.values()
        for action in ("GetObject", "PutObject", "DeleteObject")
        for headers in (frozenset(), frozenset({IF_NONE_MATCH}))
    ]
    # what the GPU workers may do, the CPU workers may (the caches' writes besides)
    for action, resource, headers in cases:
        if allowed(gpu, action, resource, headers):
            assert allowed(cpu, action, resource, headers), (action, resource)
    assert not allowed(gpu, "s3:PutObject", _arn(keys["cache_part"]))
    # the head keeps the pointer's flip and the signature; neither worker role has them
    pointer = _arn(keys["pointer"])
    assert allowed(head, "s3:PutObject", pointer)
    assert allowed(head, "kms:Sign", SIGNING_KEY)
    for role in (cpu, gpu):
        assert not allowed(role, "s3:PutObject", pointer)
        assert not allowed(role, "kms:Sign", SIGNING_KEY)


def test_the_cpu_workers_pods_carry_their_drivers_settings_and_their_own_identity(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    releases = _blocks(parsed, RAY, "resource", "helm_release")
    values = json.dumps(releases["ray_cluster"]["values"])
    group = re.search(r"'additionalWorkerGroups': \{'cpu': (\{.*?'containerEnv': \[.*?\])", values)
    assert group, "the CPU worker group and its containerEnv"
    cpu_group = group.group(1)
    assert "'serviceAccountName': '${local.cpu_service_account}'" in cpu_group
    for name, value in (
        # mine's embedding pool on the GPU workers
        ("EDGEQA_RAY_WORKERS", "${tostring(local.max_gpu_workers)}"),
        # DuckDB's budget at the plan's size
        ("EDGEQA_MINING_MEMORY_MB", "${tostring(var.cpu_mining_memory_mb)}"),
        # the pointer, the parent and the revocation list verified without KMS
        ("EDGEQA_RELEASE_PUBLIC_KEYS", "${var.release_public_keys}"),
        # a Ray Job's driver would otherwise inherit OMP_NUM_THREADS=1 (FAISS, torch)
        ("OMP_NUM_THREADS", "${tostring(var.cpu_worker_cpu)}"),
    ):
        assert f"{{'name': '{name}', 'value': '{value}'}}" in cpu_group, name
    assert "EDGEQA_SIGNING_KMS_KEY" not in cpu_group
    # the root hands the signing key's public half to them
    root = {k: v for b in parsed["main.tf"]["module"] for k, v in b.items()}
    assert _one(root["ray"]["release_public_keys"]) == "${module.signing.public_key}"
    # its service account assumes the CPU role alone
    locals_ = _one(parsed[RAY]["locals"])
    assert _one(locals_["cpu_service_account"]) == "edgeqa-ray-cpu"
    accounts = _one(locals_["service_accounts"])
    assert accounts["ray_cpu"] == "${local.namespace}:${local.cpu_service_account}"
    # every EDGEQA_* the Ray pods and MWAA's tasks are given is a setting the project reads
    from precompute.config import PrecomputeSettings

    known = set(PrecomputeSettings.variables())
    airflow = json.dumps(parsed["modules/airflow/main.tf"])
    given = set(re.findall(r"EDGEQA_[A-Z0-9_]+", values + airflow))
    assert given and given <= known, sorted(given - known)


def test_the_cpu_worker_pod_fits_every_listed_type_and_duckdb_fits_the_pod(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    variables = {k: v for b in parsed["modules/ray/variables.tf"]["variable"] for k, v in b.items()}

    def default(name: str) -> Any:
        return _one(variables[name]["default"])

    shapes = _one(_one(parsed[RAY]["locals"])["cpu_shapes"])
    cpus, memory = default("cpu_worker_cpu"), default("cpu_worker_memory")
    gib = int(memory.removesuffix("Gi"))
    for t in _flat(variables["cpu_instance_types"]["default"]):
        shape = shapes[t]
        assert shape["vcpu"] >= cpus + 4 and shape["gib"] * 15 / 16 >= gib, (t, shape)
    assert default("cpu_mining_memory_mb") * 10**6 <= gib * 2**30 * 3 / 4
    # and both node groups refuse a plan where it would not hold
    groups = _blocks(parsed, RAY, "resource", "aws_eks_node_group")
    for name in ("cpu_spot", "cpu_on_demand"):
        lifecycle = _one(groups[name]["lifecycle"])
        conditions = {_one(p["condition"]) for p in lifecycle["precondition"]}
        assert conditions == {"${local.cpu_pod_fits}", "${local.cpu_budget_fits}"}, name
