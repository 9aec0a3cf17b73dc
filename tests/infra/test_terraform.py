"""The Terraform: every file parses (python-hcl2), every variable and output is documented, the
modules are wired as the README says, and checkov reports no failed check (skips carry a reason
in the code). The tools live in their own venv (``make test`` installs ``.tools/infra``)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

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
    for module in ("storage", "cdn", "alb", "waf", "origin", "edge", "airflow"):
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
    assert root_modules == {"storage", "signing", "origin", "edge", "cdn", "airflow"}

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
    for header in ("authorization", "x-api-key", "x-edgeqa-user", "x-edgeqa-origin-verify"):
        assert has(waf, "name", f'"{header}"'), header
    assert "query_string" in waf
    # releases are signed in KMS (Ed25519); the edge and the origin verify with its public half
    signing = json.dumps(parsed["modules/signing/main.tf"])
    assert has(signing, "customer_master_key_spec", '"ECC_NIST_EDWARDS25519"')
    airflow = json.dumps(parsed["modules/airflow/main.tf"])
    assert "kms:Sign" in airflow and "EDGEQA_SIGNING_KMS_KEY" in airflow
    edge = json.dumps(parsed["modules/edge/main.tf"])
    for name in ("EDGEQA_RELEASE_PUBLIC_KEYS", "EDGEQA_IDENTITY_SECRET"):
        assert name in edge and name + "=" in user_data, name
    # browsers read pointers and answer objects; manifests, shards and embedders stay private
    assert '/*/releases/*/a/*"' in cdn and '/*/releases/*"' not in cdn


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
        skips += re.findall(r"#checkov:skip=(CKV2?_AWS_\d+):(.*)", path.read_text())
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped and skipped <= {check for check, _ in skips}  # none skipped outside the code
    assert all(len(reason.strip()) > 20 for _, reason in skips)
