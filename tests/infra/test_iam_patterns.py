"""Each store grant, checked against the object names it must and must not reach.

The Terraform's IAM documents are read with python-hcl2 (``tests/infra/test_terraform.py``'s
fixture) and their S3 resource patterns evaluated as IAM evaluates them: ``*`` is any run of
characters, ``/`` included, ``?`` one character; an explicit deny wins. Per-profile statements
(``dynamic "statement"`` over ``var.profiles``) are expanded with the profiles bound below, as
Terraform would. Each role then answers a table of keys (``docs/release-format.md``'s layout):
what it must reach, and what it must never — the nightly work areas (held-back wordings, hashed
askers) for the readers, anything under ``logs/`` for the fleet's writes, a profile not deployed.

What a pattern still matches, and why that is enough: S3 has no "one path segment" wildcard, so
the log grant ``logs/dt=????-??-??/*.parquet`` also matches ``logs/dt=<day>/work/x.parquet``. No
role but the edge's and the origin's may write under ``logs/`` (checked here), and the log reader
takes only the files directly in a day's folder (``base/logreader.py``), so such a file is never
mined. Likewise a release's ``k/*`` pattern reaches any ``k/`` folder under a release: only the
roles that build releases write there, and the CloudFront function serves the exact key-index
names alone (``modules/cdn/release_paths.js``, tested at the bottom).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

from tests.infra.test_terraform import TERRAFORM, _blocks, _flat, _one, parsed  # noqa: F401

BUCKET = "arn:aws:s3:::edgeqa-store"
PROFILES = ("en", "zh")  # var.profiles for this test (profile names are free-form)
VERSION, RUN, SHA = "20261205T000000Z-0123abcd", "r0123456789abcdef", "ab" * 32
IF_NONE_MATCH = "s3:if-none-match"

# role -> (file, policy document)
ROLES = {
    "edge": ("modules/edge/main.tf", "task"),
    "origin": ("modules/origin/main.tf", "origin"),
    "ray": ("modules/ray/main.tf", "ray"),
    "ray_cpu": ("modules/ray/main.tf", "ray_cpu"),
    "ray_head": ("modules/ray/main.tf", "ray_head"),
    "mwaa": ("modules/airflow/main.tf", "mwaa"),
}
FLEET = ("ray", "ray_cpu", "ray_head")
READERS = ("edge", "origin")

# object names as the code makes them (base/release.py, base/answer_objects.py, base/logs.py,
# precompute/workarea.py, precompute/nightcache.py, precompute/revocations.py)
POINTER = "en/current.json"
REVOCATIONS = "en/revocations.json"
MANIFEST = f"en/releases/{VERSION}/manifest.json"
SHARD = f"en/releases/{VERSION}/shards/00000.faiss"
KEY_INDEX = f"en/releases/{VERSION}/k/abc.json"
ANSWER = f"en/a/ab/{SHA}.json"
HOT = f"en/work/{RUN}/hot/00000.parquet"
HOT_JSON = f"en/work/{RUN}/hot.json"
GEN = f"en/work/{RUN}/gen/00000.parquet"
CACHE = "en/work/cache/days/ffffffffffffffff/2026-12-01/00000-0a1b2c3d.parquet"
LOG = "logs/dt=2026-12-01/edge-20261201T000000Z-0a1b2c3d.parquet"
LOG_IN_A_SUBFOLDER = "logs/dt=2026-12-01/work/x.parquet"
MODEL = "models/Meta-Llama-3.1-8B-Instruct-quantized.w8a8/config.json"
NOT_DEPLOYED = ("zh2/current.json", f"zh2/releases/{VERSION}/manifest.json", f"zh2/work/{RUN}/x")
# what a store writer could try to host on the CDN's domain
HOSTED = (
    f"en/work/{RUN}/a/x.html",
    "logs/dt=2026-12-01/a/x.html",
    f"logs/dt=2026-12-01/en/releases/{VERSION}/k/x.html",
    f"en/work/{RUN}/releases/{VERSION}/k/x.html",
    "models/a/x.html",
    "x.html",
)


def _bind(text: str, statement_value: str | None = None) -> str:
    for name, value in _LOCALS.items():  # the module's plain-string locals
        text = text.replace(f"${{local.{name}}}", value)
    text = text.replace("${var.bucket_arn}", BUCKET)
    if "${var.profile}" in text:  # a single served profile (before var.profiles)
        text = text.replace("${var.profile}", PROFILES[0])
    if statement_value is not None:
        text = text.replace("${statement.value}", statement_value)
        text = text.replace("${statement.key}", statement_value)
    return text


def _statement(body: dict[str, Any], value: str | None = None) -> dict[str, Any]:
    conditions = [
        (_one(c["test"]), _one(c["variable"]), [_bind(v, value) for v in _flat(c["values"])])
        for c in body.get("condition", [])
    ]
    return {
        "sid": _one(body.get("sid", "")),
        "effect": _one(body.get("effect", "Allow")),
        "actions": set(_flat(body.get("actions", []))),
        "resources": {_bind(r, value) for r in _flat(body.get("resources", []))},
        "conditions": conditions,
        "principals": [
            (_one(p["type"]), _flat(p["identifiers"])) for p in body.get("principals", [])
        ],
    }


_LOCALS: dict[str, str] = {}


def statements_of(
    document: dict[str, Any], locals_: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """A policy document's statements, its ``dynamic "statement"`` blocks expanded per profile
    and the module's plain-string ``locals_`` put in."""
    _LOCALS.clear()
    _LOCALS.update(
        {k: v for k, v in (locals_ or {}).items() if isinstance(v, str) and "${" not in v}
    )
    found = [_statement(st) for st in document.get("statement", [])]
    for dynamic in document.get("dynamic", []):
        block = dynamic["statement"]
        for_each = _one(block["for_each"])
        assert for_each in ("${toset(var.profiles)}", "${var.profiles}"), for_each
        for profile in PROFILES:
            found += [_statement(content, profile) for content in block["content"]]
    return found


def matches(pattern: str, resource: str) -> bool:
    """IAM's wildcards: ``*`` any run of characters (``/`` included), ``?`` one."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, resource) is not None


def _conditions_hold(conditions: list[Any], prefix: str | None) -> bool:
    """Whether some request of this kind meets the conditions (a header can be sent)."""
    for test, variable, values in conditions:
        if variable == "s3:prefix":
            if prefix is None or test != "StringLike":
                return False
            if not any(matches(v, prefix) for v in values):
                return False
        elif variable == IF_NONE_MATCH and test == "Null":
            continue  # the caller may send it: the grant is reachable
        elif variable == "AWS:SourceArn":
            continue  # the bucket policy's distribution
        else:
            raise AssertionError(f"a condition this test cannot evaluate: {test} {variable}")
    return True


def can(statements: list[dict[str, Any]], action: str, key: str) -> bool:
    """``action`` on ``key`` (an object; for s3:ListBucket, the listed prefix)."""
    if action == "s3:ListBucket":
        resource, prefix = BUCKET, key
    else:
        resource, prefix = f"{BUCKET}/{key}", None
    relevant = [
        st
        for st in statements
        if action in st["actions"] and any(matches(r, resource) for r in st["resources"])
    ]
    if any(st["effect"] == "Deny" and not st["conditions"] for st in relevant):
        return False
    return any(
        st["effect"] == "Allow" and _conditions_hold(st["conditions"], prefix) for st in relevant
    )


def locals_of(parsed: dict[str, Any], path: str) -> dict[str, Any]:  # noqa: F811
    return {k: _one(v) for block in parsed[path].get("locals", []) for k, v in block.items()}


def role_statements(parsed: dict[str, Any], path: str, document: str) -> list[dict[str, Any]]:  # noqa: F811
    """The statements of ``document`` in ``path``, expanded and bound (``statements_of``)."""
    policy = _blocks(parsed, path, "data", "aws_iam_policy_document")[document]
    return statements_of(policy, locals_of(parsed, path))


@pytest.fixture(scope="module")
def roles(parsed: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:  # noqa: F811
    found = {
        role: role_statements(parsed, path, document) for role, (path, document) in ROLES.items()
    }
    cdn = "modules/cdn/main.tf"
    store = _blocks(parsed, cdn, "data", "aws_iam_policy_document")["store"]
    found["cdn"] = [
        st
        for st in statements_of(store, locals_of(parsed, cdn))
        if ("Service", ["cloudfront.amazonaws.com"]) in st["principals"]
    ]
    assert found["cdn"], "the bucket policy's CloudFront statement"
    return found


def _table(
    roles: dict[str, list[dict[str, Any]]],
    role: str,
    action: str,
    must: tuple[str, ...],
    must_not: tuple[str, ...],
) -> list[str]:
    wrong = [f"{role} cannot {action} {key}" for key in must if not can(roles[role], action, key)]
    wrong += [f"{role} can {action} {key}" for key in must_not if can(roles[role], action, key)]
    return wrong


def test_the_edge_and_the_origin_read_the_releases_and_pointers_and_write_their_logs_only(
    roles: dict[str, list[dict[str, Any]]],
) -> None:
    wrong = []
    for role in READERS:
        wrong += _table(
            roles,
            role,
            "s3:GetObject",
            must=(POINTER, REVOCATIONS, MANIFEST, SHARD, KEY_INDEX, "zh/current.json"),
            must_not=(HOT, HOT_JSON, GEN, CACHE, LOG, MODEL, "en/work", *NOT_DEPLOYED),
        )
        wrong += _table(
            roles,
            role,
            "s3:PutObject",
            must=(LOG, "logs/dt=2026-12-31/origin-20261231T235959Z-ffffffff.parquet"),
            must_not=(
                POINTER,
                REVOCATIONS,
                MANIFEST,
                ANSWER,
                HOT,
                MODEL,
                "logs/x.parquet",
                "logs/dt=2026-12-01/x.json",
                "en/logs/dt=2026-12-01/x.parquet",
            ),
        )
        wrong += _table(
            roles,
            role,
            "s3:ListBucket",
            must=("en/releases/", "zh/releases/"),
            must_not=("", "en/", "en/work/", f"en/work/{RUN}/", "logs/", "zh2/releases/"),
        )
        for action in ("s3:DeleteObject", "s3:PutObjectAcl"):
            wrong += _table(roles, role, action, (), (LOG, POINTER, MANIFEST, HOT))
    assert not wrong, "\n".join(wrong)


def test_the_fleet_writes_its_profiles_only_and_nothing_under_logs(
    roles: dict[str, list[dict[str, Any]]],
) -> None:
    wrong = []
    never = (
        LOG,
        LOG_IN_A_SUBFOLDER,
        "logs/dt=2026-12-01/en/work/x.parquet",
        "logs/en/work/x",
        MODEL,
        *NOT_DEPLOYED,
        "x/en/work/y",
        "en/x/work/y",
    )
    for role in FLEET:
        for action in ("s3:PutObject", "s3:DeleteObject"):
            wrong += _table(roles, role, action, (), never)
        # the logs they mine: files of a day's folder, nothing else under logs/
        wrong += _table(
            roles,
            role,
            "s3:GetObject",
            must=(LOG, MODEL, HOT, GEN),
            must_not=("logs/other.json", "logs/x.parquet", "logs/dt=2026-12-01/x.json"),
        )
        wrong += _table(
            roles, role, "s3:PutObject", must=(GEN, f"zh/work/{RUN}/gen/00000.parquet"), must_not=()
        )
    # the GPU workers: the work areas only (never the caches across nights)
    wrong += _table(
        roles, "ray", "s3:PutObject", (), (CACHE, MANIFEST, KEY_INDEX, ANSWER, POINTER, REVOCATIONS)
    )
    # the CPU workers: the caches, the releases, the answer objects (created); no pointer
    wrong += _table(
        roles,
        "ray_cpu",
        "s3:PutObject",
        must=(CACHE, MANIFEST, KEY_INDEX, ANSWER),
        must_not=(POINTER, REVOCATIONS),
    )
    # the head: publishes (the pointer), never the revocation list (an operator's act)
    wrong += _table(
        roles,
        "ray_head",
        "s3:PutObject",
        must=(POINTER, "zh/current.json", MANIFEST, KEY_INDEX, ANSWER, HOT),
        must_not=(REVOCATIONS,),
    )
    # writes under logs/: the services that log requests, no one else
    writers = {
        role
        for role, statements in roles.items()
        for key in (LOG, LOG_IN_A_SUBFOLDER, "logs/dt=2026-12-01/a/x.parquet")
        if can(statements, "s3:PutObject", key)
    }
    wrong += [f"{role} writes under logs/" for role in sorted(writers - set(READERS))]
    assert not wrong, "\n".join(wrong)


def test_the_fleet_lists_the_store_by_prefix_where_it_can(
    roles: dict[str, list[dict[str, Any]]],
) -> None:
    # the GPU workers list the logs, their profiles' work areas and the models only
    wrong = _table(
        roles,
        "ray",
        "s3:ListBucket",
        must=("logs/dt=2026-12-01/", f"en/work/{RUN}/", "models/"),
        must_not=("", "en/", "en/releases/", "zh2/work/", "x/en/work/"),
    )
    assert not wrong, "\n".join(wrong)


def test_cloudfront_reads_the_release_objects_of_the_deployed_profiles_only(
    roles: dict[str, list[dict[str, Any]]],
) -> None:
    wrong = _table(
        roles,
        "cdn",
        "s3:GetObject",
        must=(POINTER, "zh/current.json", KEY_INDEX, ANSWER),
        must_not=(
            MANIFEST,
            SHARD,
            REVOCATIONS,
            f"en/releases/{VERSION}/objects/digests.parquet",
            HOT,
            HOT_JSON,
            CACHE,
            LOG,
            *NOT_DEPLOYED,
            *HOSTED,
        ),
    )
    # nothing a role may write is served unless it is a release object
    for role, statements in roles.items():
        for key in HOSTED:
            if can(statements, "s3:PutObject", key) and can(roles["cdn"], "s3:GetObject", key):
                wrong.append(f"{role} can host {key} on the CDN")
    assert not wrong, "\n".join(wrong)


def test_no_role_reads_or_writes_the_store_with_a_wildcard_profile(
    roles: dict[str, list[dict[str, Any]]],
) -> None:
    # an allow that starts with a wildcard reaches every prefix of the bucket (logs/, models/,
    # a profile not deployed): per profile, never */...
    broad = [
        f"{role}: {resource}"
        for role, statements in roles.items()
        for st in statements
        if st["effect"] == "Allow"
        for resource in st["resources"]
        if resource.startswith(f"{BUCKET}/*") or resource.startswith(f"{BUCKET}/?")
    ]
    assert not broad, "\n".join(broad)


CDN = TERRAFORM / "modules" / "cdn"
SERVED = (
    "/en/current.json",
    "/llama-3-1-8b-instruct-quantized-w8a8-zh-0123456789/current.json",
    f"/en/releases/{VERSION}/k/abc.json",
    f"/en/a/ab/{SHA}.json",
)
REFUSED = (
    "/",
    "/index.html",
    "/en/revocations.json",
    f"/en/releases/{VERSION}/manifest.json",
    f"/en/releases/{VERSION}/manifest.sig",
    f"/en/releases/{VERSION}/shards/00000.faiss",
    f"/en/releases/{VERSION}/objects/digests.parquet",
    f"/en/releases/{VERSION}/embedder/config.json",
    f"/en/releases/{VERSION}/k/abc.html",
    f"/en/releases/{VERSION}/k/abcd.json",
    f"/en/releases/{VERSION}/k/../../current.json",
    f"/en/releases/{VERSION}/a/ab/{SHA}.json",
    f"/en/work/{RUN}/hot.json",
    f"/en/work/{RUN}/a/ab/{SHA}.json",
    "/logs/dt=2026-12-01/x.parquet",
    f"/logs/dt=2026-12-01/a/ab/{SHA}.json",
    "/models/x/config.json",
    f"/en/a/ab/{SHA}.html",
    f"/en/a/ab/{SHA[:-1]}.json",
    "/EN/current.json",
    "/en/current.json/",
    "/en//current.json",
    "/x/en/current.json",
    "/en/current.json%00.html",
)

RUN_HANDLERS = """
const fs = require("fs");
const load = (file) => new Function(fs.readFileSync(file, "utf8") + "\\nreturn handler;")();
const [paths, responses] = [load(process.argv[1]), load(process.argv[2])];
const out = {};
for (const uri of JSON.parse(process.argv[3])) {
  const request = { uri, method: "GET", querystring: { v: { value: "1" } }, headers: {} };
  const answer = paths({ request });
  out[uri] = answer.statusCode ? { status: answer.statusCode, headers: answer.headers }
                               : { status: "pass", query: answer.querystring };
}
const html = { "content-type": { value: "text/html" } };
const served = responses({ response: { statusCode: 200, headers: html } });
out["response"] = served.headers["content-type"].value;
console.log(JSON.stringify(out));
"""


def test_the_cloudfront_function_serves_the_release_objects_only() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (web/'s tests need it too)")
    done = subprocess.run(
        [
            node,
            "-e",
            RUN_HANDLERS,
            str(CDN / "release_paths.js"),
            str(CDN / "json_response.js"),
            json.dumps([*SERVED, *REFUSED]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert {uri: out[uri]["status"] for uri in SERVED} == dict.fromkeys(SERVED, "pass")
    assert all(out[uri]["query"] == {} for uri in SERVED)  # no query string reaches the bucket
    assert {uri: out[uri]["status"] for uri in REFUSED} == dict.fromkeys(REFUSED, 404)
    refusal = out[REFUSED[0]]["headers"]
    assert refusal["content-type"]["value"] == "application/json"
    # what is served goes out as JSON, whatever the object's own Content-Type
    assert out["response"] == "application/json"


def test_the_store_behaviors_run_both_functions_with_a_strict_csp(
    parsed: dict[str, Any],  # noqa: F811
) -> None:
    cdn = "modules/cdn/main.tf"
    functions = _blocks(parsed, cdn, "resource", "aws_cloudfront_function")
    assert {name: _one(f["runtime"]) for name, f in functions.items()} == {
        "release_paths": "cloudfront-js-2.0",
        "json_response": "cloudfront-js-2.0",
    }
    assert _one(functions["release_paths"]["code"]) == '${file("${path.module}/release_paths.js")}'
    assert _one(functions["json_response"]["code"]) == '${file("${path.module}/json_response.js")}'
    (distribution,) = _blocks(parsed, cdn, "resource", "aws_cloudfront_distribution").values()
    behaviors = [
        _one(distribution["default_cache_behavior"]),
        *distribution["ordered_cache_behavior"],
    ]
    store = [b for b in behaviors if _one(b["target_origin_id"]) == "${local.store_origin}"]
    assert len(store) == 2  # the default (releases, answer objects) and */current.json
    for behavior in store:
        events = {
            _one(f["event_type"]): _one(f["function_arn"]) for f in behavior["function_association"]
        }
        assert events == {
            "viewer-request": "${aws_cloudfront_function.release_paths.arn}",
            "viewer-response": "${aws_cloudfront_function.json_response.arn}",
        }
        assert (
            _one(behavior["response_headers_policy_id"])
            == "${aws_cloudfront_response_headers_policy.store.id}"
        )
    policy = _blocks(parsed, cdn, "resource", "aws_cloudfront_response_headers_policy")["store"]
    headers = _one(policy["security_headers_config"])
    csp = _one(headers["content_security_policy"])
    assert _one(csp["content_security_policy"]) == (
        "default-src 'none'; frame-ancestors 'none'; sandbox"
    )
    assert _one(csp["override"]) is True
    assert _one(_one(headers["content_type_options"])["override"]) is True
    # the services' behaviors (/v1/*) keep their own policy and no store function
    for behavior in behaviors:
        if behavior not in store:
            assert "function_association" not in behavior
