"""The Terraform: every file parses (python-hcl2), every variable and output is documented, the
modules are wired as the README says, and checkov reports no failed check (skips carry a reason
in the code). The tools live in their own venv (``make test`` installs ``.tools/infra``)."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
TERRAFORM = ROOT / "infra" / "terraform"
TOOLS = ROOT / ".tools" / "infra" / "bin"

PARSE = """
import json, sys
from pathlib import Path
import hcl2
out = {}
for path in sorted(Path(sys.argv[1]).rglob("*.tf")):
    with path.open() as f:
        out[str(path.relative_to(sys.argv[1]))] = hcl2.load(f)
print(json.dumps(out, default=str))
"""


def _tools() -> Path:
    if not (TOOLS / "checkov").exists():
        pytest.skip("the Terraform check tools are missing: run `make infra-tools`")
    return TOOLS


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    done = subprocess.run(
        [str(_tools() / "python"), "-c", PARSE, str(TERRAFORM)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_every_file_parses_and_every_variable_and_output_is_documented(
    parsed: dict[str, Any],
) -> None:
    files = set(parsed)
    for module in ("storage", "cdn", "alb", "waf", "origin", "edge", "airflow", "ray"):
        for part in ("main.tf", "variables.tf", "outputs.tf"):
            assert f"modules/{module}/{part}" in files
    assert {"main.tf", "variables.tf", "outputs.tf", "versions.tf"} <= files
    undocumented = []
    for path, body in parsed.items():
        for kind in ("variable", "output"):
            for block in body.get(kind, []):
                for name, spec in block.items():
                    if not str(spec.get("description", "")).strip():
                        undocumented.append(f"{path}: {kind} {name}")
    assert undocumented == []


def test_the_modules_are_wired_and_the_bucket_is_private(parsed: dict[str, Any]) -> None:
    root_modules = {name for block in parsed["main.tf"]["module"] for name in block}
    assert root_modules == {"storage", "signing", "origin", "edge", "cdn", "airflow", "ray"}

    def has(text: str, key: str, value: str) -> bool:  # hcl2 may wrap values in lists
        return re.search(rf'"{re.escape(key)}": \[?{re.escape(value)}', text) is not None

    storage = json.dumps(parsed["modules/storage/main.tf"])
    assert has(storage, "block_public_policy", "true")
    assert has(storage, "restrict_public_buckets", "true")
    assert has(storage, "status", '"Enabled"') and has(storage, "sse_algorithm", '"aws:kms"')
    cdn = json.dumps(parsed["modules/cdn/main.tf"])
    assert "AWSManagedRulesKnownBadInputsRuleSet" in json.dumps(parsed["modules/waf/main.tf"])
    for pattern in ("*/current.json", "/v1/lookup*", "/v1/*"):
        assert has(cdn, "path_pattern", f'"{pattern}"'), pattern
    assert "aws_cloudfront_origin_access_control" in cdn
    origin = json.dumps(parsed["modules/origin/main.tf"])
    assert "NumRequestsWaiting" in origin and "TargetTrackingScaling" in origin
    assert has(origin, "http_tokens", '"required"')
    assert "g5.xlarge" in json.dumps(parsed["variables.tf"])
    # only CloudFront reaches the load balancers, and what does not is rate-limited by IP
    assert has(cdn, "name", '"x-edgeqa-origin-verify"')
    alb = json.dumps(parsed["modules/alb/main.tf"])
    assert has(alb, "status_code", '"403"') and has(
        alb, "http_header_name", '"x-edgeqa-origin-verify"'
    )
    assert has(alb, "rate_limit_per_5min", "300") and "rate_limit_exempt_header" in alb
    # the edge gets traffic once it serves a release, not when it is merely alive
    assert has(json.dumps(parsed["modules/edge/main.tf"]), "health_check_path", '"/ready"')
    # the origin never serves its network without API keys (from Secrets Manager)
    user_data = (TERRAFORM / "modules" / "origin" / "user_data.sh").read_text()
    assert "EDGEQA_API_KEYS=" in user_data and "${api_keys_secret_arn}" in user_data
    # what people typed is kept two weeks, and never in the WAF's logs
    variables = parsed["modules/storage/variables.tf"]["variable"]
    log_days = next(v["log_days"]["default"] for v in variables if "log_days" in v)
    assert (log_days[0] if isinstance(log_days, list) else log_days) <= 14
    waf = json.dumps(parsed["modules/waf/main.tf"])
    redacted = ("authorization", "x-api-key", "x-edgeqa-user", "x-edgeqa-tenant")
    for header in (*redacted, "x-edgeqa-origin-verify"):
        assert has(waf, "name", f'"{header}"'), header
    assert "query_string" in waf
    # releases are signed in KMS (Ed25519); the edge and the origin verify with its public half
    signing = json.dumps(parsed["modules/signing/main.tf"])
    assert has(signing, "customer_master_key_spec", '"ECC_NIST_EDWARDS25519"')
    # the stages' drivers sign on the Ray head; MWAA only submits them
    ray = json.dumps(parsed["modules/ray/main.tf"])
    assert "kms:Sign" in ray and "EDGEQA_SIGNING_KMS_KEY" in ray
    airflow = json.dumps(parsed["modules/airflow/main.tf"])
    assert "kms:Sign" not in airflow and "EDGEQA_SIGNING_KMS_KEY" not in airflow
    edge = json.dumps(parsed["modules/edge/main.tf"])
    for name in ("EDGEQA_RELEASE_PUBLIC_KEYS", "EDGEQA_IDENTITY_SECRET"):
        assert name in edge and name + "=" in user_data, name
    # browsers read pointers, key indexes and answer objects; manifests, shards, digests and
    # embedders stay private
    # (per deployed profile: tests/infra/test_iam_patterns.py evaluates each pattern)
    for served in ("/a/*", "/releases/*/k/*", "/current.json"):
        assert f'/${{statement.value}}{served}"' in cdn, served
    assert '/*/a/*"' not in cdn and '/releases/*"' not in cdn


def _blocks(parsed: dict[str, Any], path: str, kind: str, type_: str) -> dict[str, Any]:
    """``{name: body}`` of the ``kind`` blocks of ``type_`` in ``path`` (hcl2 lists everything)."""
    found: dict[str, Any] = {}
    for block in parsed[path].get(kind, []):
        for name, body in block.get(type_, {}).items():
            found[name] = body
    return found


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def test_the_ray_fleet_is_private_scales_its_gpus_from_zero_and_its_head_runs_the_stages(
    parsed: dict[str, Any],
) -> None:
    ray = "modules/ray/main.tf"
    # the EKS API: private endpoint only, secrets encrypted with KMS, every control plane log
    (cluster,) = _blocks(parsed, ray, "resource", "aws_eks_cluster").values()
    vpc = _one(cluster["vpc_config"])
    assert _one(vpc["endpoint_public_access"]) is False
    assert _one(vpc["endpoint_private_access"]) is True
    assert _one(_one(cluster["encryption_config"])["resources"]) == ["secrets"]
    assert set(_one(cluster["enabled_cluster_log_types"])) == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    # GPU and CPU worker pools from zero, each a spot group and its on-demand fallback with the
    # same labels and taints (docs/capacity.md's machine table: tests/infra/test_capacity.py);
    # a small system group for the rest
    groups = _blocks(parsed, ray, "resource", "aws_eks_node_group")
    assert set(groups) == {"system", "gpu_spot", "gpu_on_demand", "cpu_spot", "cpu_on_demand"}
    for pool, taint in (("gpu", "nvidia.com/gpu"), ("cpu", "edgeqa.io/pool")):
        pair = [groups[f"{pool}_spot"], groups[f"{pool}_on_demand"]]
        assert [_one(g["capacity_type"]) for g in pair] == ["SPOT", "ON_DEMAND"]
        for group in pair:
            scaling = _one(group["scaling_config"])
            assert _one(scaling["min_size"]) == 0 and _one(scaling["desired_size"]) == 0
            assert _one(_one(group["taint"])["key"]) == taint
            assert group["labels"] == pair[0]["labels"]
            assert _one(group["instance_types"]) == f"${{var.{pool}_instance_types}}"
        assert _one(group["node_group_name"]) == f"{pool}-on-demand"
        assert _one(pair[0]["node_group_name"]) == f"{pool}-spot"
    assert all("NVIDIA" in _one(groups[g]["ami_type"]) for g in ("gpu_spot", "gpu_on_demand"))
    ray_vars = {k: v for b in parsed["modules/ray/variables.tf"]["variable"] for k, v in b.items()}
    root_vars = {k: v for b in parsed["variables.tf"]["variable"] for k, v in b.items()}
    for default in (
        ray_vars["gpu_instance_types"]["default"],
        root_vars["ray_gpu_instance_types"]["default"],
    ):
        assert all(str(t).startswith(("g5.", "g6.")) for t in _flat(default)), default
    assert "g[56]" in json.dumps(ray_vars["gpu_instance_types"]["validation"])
    # the Cluster Autoscaler tries the spot groups first and falls back on demand
    autoscaler = json.dumps(_blocks(parsed, ray, "resource", "helm_release")["cluster_autoscaler"])
    assert "'expander': 'priority,least-waste'" in autoscaler
    assert "'max-node-provision-time'" in autoscaler
    priorities = _one(_one(parsed[ray]["locals"])["autoscaler_priorities"])
    assert "^eks-(gpu|cpu)-spot-" in priorities
    # Ray's own autoscaler adds a worker per GPU asked for, from none
    text = json.dumps(parsed[ray])
    releases = _blocks(parsed, ray, "resource", "helm_release")
    assert {"kuberay_operator", "ray_cluster", "cluster_autoscaler"} <= set(releases)
    values = json.dumps(releases["ray_cluster"]["values"])
    for setting in ("'enableInTreeAutoscaling': True", "'minReplicas': 0", "'nvidia.com/gpu': 1"):
        assert setting in values, setting
    # the CPU worker group: its own Ray resource, no CPU slot for any other Ray work (its cores
    # are the stage driver's), the workers' narrow identity
    assert "'rayStartParams': {'num-cpus': '0', 'resources': " in values
    for setting in (
        "'groupName': 'gpu'",
        "'additionalWorkerGroups': {'cpu': {",
        "'resources': '${jsonencode(jsonencode(local.cpu_worker_resource))}'",
        "'maxReplicas': '${var.cpu_max_nodes}'",
    ):
        assert setting in values, setting
    assert _one(_one(parsed[ray]["locals"])["cpu_worker_resource"]) == {"cpu_worker": 1}
    # the model settings every Ray pod gets, from the module's variables
    for name, value in (
        ("EDGEQA_GENERATION_ENGINE", "${var.generation_engine}"),
        ("EDGEQA_VLLM_MODEL", "${local.vllm_model}"),
        ("EDGEQA_VLLM_QUANTIZATION", "${var.vllm_quantization}"),
    ):
        assert f"{{'name': '{name}', 'value': '{value}'}}" in values, name
    assert "s3://${var.bucket_name}/models/${var.vllm_model}" in json.dumps(parsed[ray]["locals"])
    for name, default in (
        ("generation_engine", "vllm"),
        ("vllm_quantization", "w8a8"),
        ("vllm_model", "Meta-Llama-3.1-8B-Instruct-quantized.w8a8"),
    ):
        assert _one(ray_vars[name]["default"]) == _one(root_vars[name]["default"]) == default
    # the head: an internal NLB, its Jobs API (8265) reached from the Airflow workers' group only
    (nlb,) = _blocks(parsed, ray, "resource", "aws_lb").values()
    assert _one(nlb["internal"]) is True and _one(nlb["load_balancer_type"]) == "network"
    assert '"internal": [false]' not in text and 'endpoint_public_access": [true]' not in text
    head = _blocks(parsed, ray, "resource", "aws_security_group")["head"]
    ingress = {_one(rule["from_port"]): rule for rule in head["ingress"]}
    assert set(ingress) == {8265}
    for rule in ingress.values():
        assert "cidr_blocks" not in rule and "ipv6_cidr_blocks" not in rule
        assert _one(rule["security_groups"]) == "${var.client_security_group_ids}"
    policies = _blocks(parsed, ray, "data", "aws_iam_policy_document")
    statements = {
        name: {
            _one(st["sid"]): (set(_flat(st["actions"])), set(_flat(st["resources"])))
            for st in policies[name]["statement"]
        }
        for name in ("ray", "ray_head")
    }
    # the GPU workers (the model actors): logs/ and the work areas of the store, nothing
    # broader; they cannot sign, so the fleet cannot publish
    workers = statements["ray"]
    denied = workers.pop("NoWritesToTheNightCaches")  # mine's caches: the head writes them
    assert denied == (
        {"s3:PutObject", "s3:AbortMultipartUpload"},
        {"${var.bucket_arn}/*/work/cache/*"},
    )
    deny = [
        st for st in policies["ray"]["statement"] if _one(st["sid"]) == "NoWritesToTheNightCaches"
    ]
    assert _one(deny[0]["effect"]) == "Deny"
    assert {r for _, resources in workers.values() for r in resources} == {
        "${var.bucket_arn}/${local.log_files}",
        "${var.bucket_arn}/models/*",
        "${var.bucket_arn}",
        "${var.kms_key_arn}",
    }
    # the work areas: per deployed profile (dynamic statements; tests/infra/test_iam_patterns.py)
    (work,) = [
        d["statement"] for d in policies["ray"]["dynamic"] if "s3:PutObject" in json.dumps(d)
    ]
    assert _one(work["for_each"]) == "${toset(var.profiles)}"
    assert _flat(_one(work["content"])["resources"]) == [
        "${var.bucket_arn}/${statement.value}/work/*"
    ]
    assert _one(_one(parsed[ray]["locals"])["log_files"]) == "logs/dt=????-??-??/*.parquet"
    # the model weights: read only, for the workers and the drivers on the head
    for role in ("ray", "ray_head"):
        assert statements[role]["ReadModels"] == ({"s3:GetObject"}, {"${var.bucket_arn}/models/*"})
    assert not any("models" in r for a, rs in head_writes(statements) for r in rs)
    assert not any(a.startswith("kms:Sign") for actions, _ in workers.values() for a in actions)
    assert not any("s3:Delete" in a for actions, _ in workers.values() for a in actions)
    # the head (every stage's driver): writes releases and pointers and signs with the release key
    head_role = statements["ray_head"]
    assert head_role["SignReleases"] == (
        {"kms:Sign", "kms:GetPublicKey"},
        {"${var.signing_key_arn}"},
    )
    writable = {
        r
        for dynamic in policies["ray_head"]["dynamic"]
        for content in dynamic["statement"]["content"]
        if "s3:PutObject" in _flat(content["actions"])
        for r in _flat(content["resources"])
    }
    assert writable == {
        "${var.bucket_arn}/${statement.value}/work/*",
        "${var.bucket_arn}/${statement.value}/releases/*",
        "${var.bucket_arn}/${statement.value}/a/*",
        "${var.bucket_arn}/${statement.value}/current.json",
    }
    assert not any("s3:PutObject" in actions for actions, _ in head_role.values())
    # the high-water mark: the head raises it (it signs); no other statement of it writes
    assert head_role["RaiseHighWaterMark"] == (
        {"dynamodb:GetItem", "dynamodb:UpdateItem"},
        {"${var.high_water_table_arn}"},
    )
    # its own service account and role; the GPU and CPU workers keep theirs
    accounts = _blocks(parsed, ray, "resource", "kubernetes_service_account_v1")
    assert set(accounts) == {"ray", "head", "cpu"}
    for account, role in (("head", "ray_head"), ("ray", "ray"), ("cpu", "ray_cpu")):
        annotations = _one(_one(accounts[account]["metadata"])["annotations"])
        assert annotations["eks.amazonaws.com/role-arn"] == f'${{aws_iam_role.irsa["{role}"].arn}}'
    assert "'serviceAccountName': '${local.head_service_account}'" in values
    assert "'serviceAccountName': '${local.service_account}'" in values
    assert "'serviceAccountName': '${local.cpu_service_account}'" in values
    # the drivers' settings are the head's; no secret value (the key stays in KMS)
    for setting in (
        "{'name': 'EDGEQA_SIGNING_KMS_KEY', 'value': '${var.signing_key_arn}'}",
        "{'name': 'EDGEQA_RAY_WORKERS', 'value': '${tostring(local.max_gpu_workers)}'}",
    ):
        assert setting in values, setting
    # the root wires the Jobs API to the DAG's workers, the workers' group and the key to the head
    root = {k: v for b in parsed["main.tf"]["module"] for k, v in b.items()}
    assert _one(root["airflow"]["ray_jobs_address"]) == "${module.ray.dashboard_address}"
    assert _one(root["ray"]["client_security_group_ids"]) == ["${module.airflow.security_group_id}"]
    assert _one(root["ray"]["signing_key_arn"]) == "${module.signing.key_arn}"
    assert _one(root["ray"]["image"]) == "${var.ray_image}"
    for gone in ("ray_address", "ray_workers", "signing_key_arn", "bucket_arn"):
        assert gone not in root["airflow"], gone
    # the RayCluster's rayVersion is a Ray the project (the image the stages run in) may install
    with (ROOT / "pyproject.toml").open("rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    (ray_pin,) = [Requirement(d) for d in dependencies if Requirement(d).name == "ray"]
    for default in (ray_vars["ray_version"]["default"], root_vars["ray_version"]["default"]):
        assert ray_pin.specifier.contains(_one(default)), f"ray_version {default}: {ray_pin}"
    # MWAA: its one setting is the Jobs API; its role has MWAA's own needs only, no store access
    airflow_tf = "modules/airflow/main.tf"
    airflow = json.dumps(parsed[airflow_tf])
    assert "export EDGEQA_RAY_JOBS_ADDRESS='${var.ray_jobs_address}'" in airflow
    for gone in ("EDGEQA_SIGNING_KMS_KEY", "EDGEQA_RAY_ADDRESS", "EDGEQA_RAY_WORKERS"):
        assert gone not in airflow, gone
    mwaa = json.dumps(_blocks(parsed, airflow_tf, "data", "aws_iam_policy_document")["mwaa"])
    assert "var.bucket_arn" not in mwaa and "kms:Sign" not in mwaa
    mwaa_group = _blocks(parsed, airflow_tf, "resource", "aws_security_group")["mwaa"]
    assert 10001 not in {_one(rule["from_port"]) for rule in mwaa_group["egress"]}
    # the Airflow pool the generate task once queued on is gone everywhere
    for path in TERRAFORM.rglob("*"):
        if path.is_file() and ".terraform" not in path.parts:
            assert "gpu_a10" not in path.read_text(), path


def test_checkov_reports_no_failed_checks() -> None:
    tools = _tools()
    done = subprocess.run(
        [
            str(tools / "checkov"),
            "-d",
            str(TERRAFORM),
            "--framework",
            "terraform",
            "--compact",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    start = done.stdout.find("{")
    assert start >= 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout[start:])
    summary = report["summary"]
    failed = [f"{c['check_id']} {c['resource']}" for c in report["results"]["failed_checks"]]
    assert summary["failed"] == 0, failed
    assert summary["passed"] > 200
    # every skip says why, in the code
    skips = []
    for path in TERRAFORM.rglob("*.tf"):
        skips += re.findall(r"#checkov:skip=(CKV2?_[A-Z0-9]+_\d+):(.*)", path.read_text())
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped and skipped <= {check for check, _ in skips}  # none skipped outside the code
    assert all(len(reason.strip()) > 20 for _, reason in skips)


def head_writes(statements: dict[str, dict[str, Any]]) -> list[tuple[set[str], set[str]]]:
    """(actions, resources) of every statement of both Ray roles that writes or deletes."""
    return [
        (actions, resources)
        for role in statements.values()
        for actions, resources in role.values()
        if {"s3:PutObject", "s3:DeleteObject"} & actions
    ]


def _flat(value: Any) -> list[Any]:
    """Every scalar in ``value`` (hcl2 wraps values, and lists, in lists)."""
    if isinstance(value, list):
        return [item for part in value for item in _flat(part)]
    return [value]


def _resources(parsed: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(path, type, name, body)`` of every resource of every file."""
    found = []
    for path, body in parsed.items():
        for block in body.get("resource", []):
            for type_, named in block.items():
                for name, spec in named.items():
                    found.append((path, type_, name, spec))
    return found


# the conditions that tie a service principal's use of a key to the resource it acts for: the
# global source keys, or (CloudWatch Logs) the log group's ARN it puts in the encryption context
SOURCE_CONDITIONS = {"aws:SourceArn", "aws:SourceAccount", "kms:EncryptionContext:aws:logs:arn"}


def test_a_service_principal_may_use_a_key_only_for_this_accounts_resources(
    parsed: dict[str, Any],
) -> None:
    services: dict[str, dict[str, tuple[str, list[str]]]] = {}
    keys = [r for r in _resources(parsed) if r[1] == "aws_kms_key"]
    assert {(path, name) for path, _, name, _ in keys} >= {("modules/storage/main.tf", "store")}
    for path, _, name, key in keys:
        document = re.fullmatch(
            r"\$\{data\.aws_iam_policy_document\.(\w+)\.json\}", _one(key["policy"])
        )
        assert document, f"{path}: aws_kms_key.{name} has no policy document of its own"
        policy = _blocks(parsed, path, "data", "aws_iam_policy_document")[document.group(1)]
        for statement in policy["statement"]:
            conditions = {
                _one(c["variable"]): (_one(c["test"]), _flat(c["values"]))
                for c in statement.get("condition", [])
            }
            for principal in statement.get("principals", []):
                if _one(principal["type"]) != "Service":
                    continue
                for service in _flat(principal["identifiers"]):
                    where = f"{path}: aws_kms_key.{name}, {service}"
                    sources = SOURCE_CONDITIONS & set(conditions)
                    assert sources, f"{where}: no aws:SourceArn/aws:SourceAccount condition"
                    for variable in sources:
                        test, values = conditions[variable]
                        assert test in {"ArnEquals", "ArnLike", "StringEquals"}, where
                        assert values and all("${var.account_id}" in v for v in values), where
                    services[service] = conditions
    # the store's key: CloudFront (origin access control) for this account's distributions;
    # CloudWatch Logs for this account's log groups (the services', the WAF's, MWAA's, EKS's)
    assert services["cloudfront.amazonaws.com"]["aws:SourceArn"] == (
        "ArnLike",
        ["arn:aws:cloudfront::${var.account_id}:distribution/*"],
    )
    assert services["logs.amazonaws.com"]["kms:EncryptionContext:aws:logs:arn"] == (
        "ArnLike",
        ["arn:aws:logs:*:${var.account_id}:log-group:*"],
    )


# a shell command that creates or writes a file (a redirection that is not to a descriptor or
# /dev/null, or a command that makes files)
WRITES = re.compile(
    r"(^|[^0-9&<>])>>?\s*(?!&|/dev/null\b)\S|\b(tee|mktemp|install|cp|mv|mkdir|touch|dd)\b"
)


def test_every_user_data_script_sets_umask_077_before_it_writes_a_file(
    parsed: dict[str, Any],
) -> None:
    scripts = []
    for path, type_, name, spec in _resources(parsed):
        for field, value in spec.items():
            if not field.startswith("user_data"):
                continue
            files = re.findall(r"path\.module\}/([\w.\-/]+)", json.dumps(value))
            assert files, f"{path}: {type_}.{name}.{field} is not a script file of the module"
            scripts += [TERRAFORM / Path(path).parent / f for f in files]
    assert TERRAFORM / "modules" / "origin" / "user_data.sh" in scripts
    for script in scripts:
        # (a heredoc's lines are data; none of these scripts has a '>' in one)
        lines = [line.split(" #")[0] for line in script.read_text().splitlines()]
        commands = [(n, line) for n, line in enumerate(lines) if not line.lstrip().startswith("#")]
        umask = next((n for n, line in commands if re.fullmatch(r"\s*umask 0?077\s*", line)), None)
        write = next((n for n, line in commands if WRITES.search(line)), None)
        assert umask is not None, f"{script}: no umask 077"
        assert write is None or umask < write, f"{script}: line {write + 1} writes before umask"


def test_no_variable_carries_a_secret_the_origin_verify_value_is_read_from_secrets_manager(
    parsed: dict[str, Any],
) -> None:
    # a secret is named by its Secrets Manager ARN, never passed as a value (a tfvars file, a
    # plan's variables, a CI log): no variable is sensitive, each one named for a secret is an ARN
    for path, body in parsed.items():
        for block in body.get("variable", []):
            for name, spec in block.items():
                assert _one(spec.get("sensitive", False)) is not True, f"{path}: {name}"
                if "secret" in name:
                    assert name.endswith("_secret_arn"), f"{path}: variable {name}"
    root_vars = {k for b in parsed["variables.tf"]["variable"] for k in b}
    assert "origin_verify_secret_arn" in root_vars and "origin_verify_secret" not in root_vars
    # Terraform reads it where it configures the header: CloudFront's origins, the ALB's rule,
    # the regional WAF's exemption
    for path, secret in (
        ("modules/cdn/main.tf", "${var.origin_verify_secret_arn}"),
        ("modules/alb/main.tf", "${var.origin_verify_secret_arn}"),
        ("modules/waf/main.tf", "${var.rate_limit_exempt_header.secret_arn}"),
    ):
        (version,) = _blocks(parsed, path, "data", "aws_secretsmanager_secret_version").values()
        assert _one(version["secret_id"]) == secret, path
    cdn = json.dumps(parsed["modules/cdn/main.tf"])
    assert cdn.count("data.aws_secretsmanager_secret_version.origin_verify.secret_string") == 2
    alb = json.dumps(parsed["modules/alb/main.tf"])
    assert "data.aws_secretsmanager_secret_version.origin_verify.secret_string" in alb
    waf = {k: v for b in parsed["modules/alb/main.tf"]["module"] for k, v in b.items()}["waf"]
    exempt = _one(waf["rate_limit_exempt_header"])
    assert exempt["secret_arn"] == "${var.origin_verify_secret_arn}" and "value" not in exempt
    # each role may read the secrets it needs, named: never a wildcard, never the origin-verify one
    grants = []
    for path in parsed:
        for name, document in _blocks(parsed, path, "data", "aws_iam_policy_document").items():
            for statement in document.get("statement", []):
                actions = _flat(statement.get("actions", []))
                if any(a.startswith("secretsmanager:") or a == "*" for a in actions):
                    assert actions == ["secretsmanager:GetSecretValue"], f"{path}: {name}"
                    grants.append((path, name, _flat(statement["resources"])))
    assert {(path, name) for path, name, _ in grants} == {
        ("modules/origin/main.tf", "origin"),
        ("modules/edge/main.tf", "execution"),
    }
    for path, name, resources in grants:
        assert all(re.fullmatch(r"\$\{var\.\w+_secret_arn\}", r) for r in resources), (path, name)
        assert "${var.origin_verify_secret_arn}" not in resources, (path, name)


def test_the_edge_lists_only_its_profiles_keys(parsed: dict[str, Any]) -> None:
    for path, document in (
        ("modules/edge/main.tf", "task"),
        ("modules/origin/main.tf", "origin"),
    ):
        policy = _blocks(parsed, path, "data", "aws_iam_policy_document")[document]
        assert not [
            s for s in policy["statement"] if "s3:ListBucket" in _flat(s.get("actions", []))
        ], path
        (listing,) = [
            d["statement"]
            for d in policy["dynamic"]
            if "s3:ListBucket" in _flat(_one(d["statement"]["content"])["actions"])
        ]
        assert _one(listing["for_each"]) == "${toset(var.profiles)}", path
        (condition,) = _one(listing["content"])["condition"]
        assert _one(condition["variable"]) == "s3:prefix", path
        assert _one(condition["test"]) == "StringLike", path
        assert _flat(condition["values"]) == ["${statement.value}/releases/*"], path


def test_the_high_water_mark_is_a_table_the_signer_alone_writes(parsed: dict[str, Any]) -> None:
    signing = "modules/signing/main.tf"
    (table,) = _blocks(parsed, signing, "resource", "aws_dynamodb_table").values()
    assert _one(table["billing_mode"]) == "PAY_PER_REQUEST"
    assert _one(table["hash_key"]) == "profile"
    assert _one(_one(table["attribute"])["type"]) == "S"
    assert _one(table["deletion_protection_enabled"]) is True
    assert _one(_one(table["point_in_time_recovery"])["enabled"]) is True
    sse = _one(table["server_side_encryption"])
    assert _one(sse["enabled"]) is True and _one(sse["kms_key_arn"]) == "${var.kms_key_arn}"
    # the table's own policy: every write denied but the signers'
    (policy,) = _blocks(parsed, signing, "resource", "aws_dynamodb_resource_policy").values()
    assert _one(policy["policy"]) == "${data.aws_iam_policy_document.high_water.json}"
    document = _blocks(parsed, signing, "data", "aws_iam_policy_document")["high_water"]
    (deny,) = document["statement"]
    assert _one(deny["effect"]) == "Deny"
    assert {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"} <= set(
        _flat(deny["actions"])
    )
    (condition,) = deny["condition"]
    assert (_one(condition["test"]), _one(condition["variable"])) == (
        "ArnNotEquals",
        "aws:PrincipalArn",
    )
    root = {k: v for b in parsed["main.tf"]["module"] for k, v in b.items()}
    writers = _one(root["signing"]["high_water_writer_role_arns"])
    assert "module.ray.head_role_arn" in writers and "var.release_operator_role_arns" in writers
    # who may touch it: the head raises it, the readers read it, no one else has any of it
    grants: dict[str, set[str]] = {}
    for path in parsed:
        for name, doc in _blocks(parsed, path, "data", "aws_iam_policy_document").items():
            for st in doc.get("statement", []):
                actions = {a for a in _flat(st.get("actions", [])) if a.startswith("dynamodb:")}
                if actions and _one(st.get("effect", "Allow")) == "Allow":
                    assert _flat(st["resources"]) == ["${var.high_water_table_arn}"], name
                    grants.setdefault(name, set()).update(actions)
    assert grants == {
        "ray_head": {"dynamodb:GetItem", "dynamodb:UpdateItem"},
        "ray_cpu": {"dynamodb:GetItem"},
        "task": {"dynamodb:GetItem"},  # the edge's
        "origin": {"dynamodb:GetItem"},
    }
    # the kms:Sign holders are the writers: the head's role alone in this configuration
    signers = [
        name
        for path in parsed
        for name, doc in _blocks(parsed, path, "data", "aws_iam_policy_document").items()
        for st in doc.get("statement", [])
        if _one(st.get("effect", "Allow")) == "Allow" and "kms:Sign" in _flat(st.get("actions", []))
    ]
    assert signers == ["ray_head"]
    # every reader and the signer are told where it is
    uri = "dynamodb://${var.high_water_table_name}"
    edge = json.dumps(parsed["modules/edge/main.tf"])
    assert f"{{'name': 'EDGEQA_HIGH_WATER_URI', 'value': '{uri}'}}" in edge
    origin = _blocks(parsed, "modules/origin/main.tf", "resource", "aws_launch_template")["origin"]
    assert uri in json.dumps(origin)
    user_data = (TERRAFORM / "modules" / "origin" / "user_data.sh").read_text()
    assert "EDGEQA_HIGH_WATER_URI=${high_water_uri}" in user_data
    assert "AWS_DEFAULT_REGION=${region}" in user_data  # boto3's DynamoDB client needs a region
    ray = "modules/ray/main.tf"
    assert _one(_one(parsed[ray]["locals"])["high_water_uri"]) == uri
    values = json.dumps(_blocks(parsed, ray, "resource", "helm_release")["ray_cluster"]["values"])
    assert (
        values.count("{'name': 'EDGEQA_HIGH_WATER_URI', 'value': '${local.high_water_uri}'}") == 2
    )
    for module in ("edge", "origin", "ray"):
        assert _one(root[module]["high_water_table_name"]) == (
            "${module.signing.high_water_table_name}"
        )
    assert "HIGH_WATER" not in json.dumps(parsed["modules/airflow/main.tf"])  # submits jobs only


def test_fresh_readers_keep_their_pointer_memory_on_a_writable_disk(parsed: dict[str, Any]) -> None:
    edge = "modules/edge/main.tf"
    (task,) = _blocks(parsed, edge, "resource", "aws_ecs_task_definition").values()
    text = json.dumps(task)
    assert _one(_one(parsed[edge]["locals"])["cache_dir"]) == "/var/cache/edgeqa"
    assert "'readonlyRootFilesystem': True" in text
    assert "{'name': 'EDGEQA_CACHE_DIR', 'value': '${local.cache_dir}'}" in text
    assert "{'sourceVolume': 'cache', 'containerPath': '${local.cache_dir}'}" in text
    assert "cache" in {_one(v["name"]) for v in task["volume"]}
    # the image makes the folder, its user's, and declares it a volume (ECS copies its owner)
    dockerfile = (TERRAFORM.parents[1] / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.rindex("\nFROM ") :]
    assert "install -d -o edgeqa -g edgeqa -m 0700 /var/cache/edgeqa" in runtime
    assert 'VOLUME ["/var/cache/edgeqa"]' in runtime
    # the origin: a state folder systemd makes for its unit on the instance's disk
    user_data = (TERRAFORM / "modules" / "origin" / "user_data.sh").read_text()
    assert "EDGEQA_CACHE_DIR=/var/lib/edgeqa" in user_data
    assert "StateDirectory=edgeqa" in user_data
    assert user_data.index("daemon-reload") < user_data.index("enable --now edgeqa-origin")
