"""The web client: the key spec under Node against the shared vectors, and the demo page in
headless Chromium asking a published question (an edge tier) and a novel one (the origin)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from base.answer_objects import bucket_entry, bucket_of, bucket_path, canonical_json, object_path
from base.keys import MAX_QUERY_CHARS, key
from base.release import release_prefix
from base.signing import LocalSigner, generate_keypair
from base.store import FileStore, sha256_hex
from edge_index.releases import Releases
from edge_index.server.app import create_app as edge_app
from edge_index.watcher import EDGE_METRICS, ORIGIN_METRICS, ReleaseWatcher
from edgeqa.client import EdgeQAClient
from edgeqa.demo import cdn_app
from origin.config import OriginSettings
from origin.engine import Engine, EngineConfig
from origin.runtime import Runtime
from origin.server import OriginServer, create_app
from precompute.publish import publish
from tests.releases import PROFILE, QUESTIONS, build
from tests.serving import Server, wait_healthy

WEB = Path(__file__).parents[2] / "web"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
NODE = shutil.which("node")
FORGED = "Send your card number to this address."
# text pasted without a space, as a URL or a token is: the question box keeps its first 2,048
# characters (MAX_QUERY_CHARS), which the release publishes, so its answer holds them too
PASTED = ("Whatdoesthispastedtokenmean:" + "qwertyuiop" * 300)[:3000]


def test_key_spec_vectors_under_node() -> None:
    if NODE is None:
        pytest.skip("Node.js is missing: apt-get install -y nodejs")
    done = subprocess.run(
        [
            NODE,
            "--test",
            "test/keys.test.mjs",
            "test/answers.test.mjs",
            "test/proofs.test.mjs",
            "test/languages.test.mjs",
            "test/missed.test.mjs",
        ],
        cwd=WEB,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# pass 14" in done.stdout and "# fail 0" in done.stdout


@pytest.fixture(scope="module")
def stack(embedded_model, embedder, tmp_path_factory) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A signed release (QUESTIONS and what the box keeps of PASTED) behind the CDN, the edge
    service and the origin serving the page; on the CDN, someone has replaced the answer object
    of QUESTIONS[1] (at its address: the bytes no longer hash to it) and rewritten the bucket of
    QUESTIONS[2] to name a forged object (stored at its own address: only the bucket's proof
    tells)."""
    tmp = tmp_path_factory.mktemp("web")
    store = FileStore(tmp / "store")
    questions = (*QUESTIONS, PASTED[:MAX_QUERY_CHARS])
    build(embedder, tmp / "v1", store, questions=questions, now=datetime(2026, 11, 20, tzinfo=UTC))
    private, public = generate_keypair()
    version = publish(store, tmp / "v1", signer=LocalSigner(private)).version
    replaced, _, _ = _object_of(store, version, QUESTIONS[1])
    obj = json.loads(store.get(replaced))
    store.put(replaced, canonical_json({**obj, "answer": FORGED}))
    named, digest, bucket_file = _object_of(store, version, QUESTIONS[2])
    forged = canonical_json({**json.loads(store.get(named)), "answer": FORGED})
    store.put(f"{PROFILE}/{object_path(sha256_hex(forged))}", forged)
    bucket = json.loads(store.get(bucket_file))
    bucket["entries"] = bucket["entries"].replace(digest, sha256_hex(forged))
    store.put(bucket_file, canonical_json(bucket))
    model, tokenizer = embedded_model
    engine = Engine(model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=512))
    with Server(cdn_app(store.root)) as cdn:
        edge_state = ReleaseWatcher(store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS)
        edge_state.refresh()
        with Server(edge_app(edge_state)) as edge:
            config = OriginSettings.from_env(
                {
                    "EDGEQA_STORE": store.uri,
                    "EDGEQA_PROFILE": PROFILE,
                    "EDGEQA_CDN_URL": cdn.url,
                    "EDGEQA_EDGE_URL": edge.url,
                    "EDGEQA_RELEASE_PUBLIC_KEYS": public,
                }
            )
            releases = Releases.of(
                ReleaseWatcher(store, PROFILE, embedder, 3600, metrics_prefix=ORIGIN_METRICS)
            )
            server = OriginServer(config, lambda: Runtime(engine.start(), 32, 0.0, releases))
            with Server(create_app(server)) as origin:
                wait_healthy(origin.url)
                yield {"origin": origin.url, "cdn": cdn.url, "edge": edge.url, "key": public}


def _object_of(store: FileStore, version: str, question: str) -> tuple[str, str, str]:
    """The path of ``question``'s answer object in the store, its sha256, and the path of the
    bucket of ``version``'s key index that names it."""
    k = key(question)
    bucket_file = f"{release_prefix(PROFILE, version)}/{bucket_path(bucket_of(k))}"
    digest = bucket_entry(json.loads(store.get(bucket_file)), k)
    assert digest is not None, question
    return f"{PROFILE}/{object_path(digest)}", digest, bucket_file


def test_the_page_and_its_config(stack: dict[str, Any]) -> None:
    import httpx

    page = httpx.get(f"{stack['origin']}/")
    assert page.status_code == 200 and '<script type="module" src="/web/app.js">' in page.text
    assert httpx.get(f"{stack['origin']}/web/edgeqa.js").status_code == 200
    config = httpx.get(f"{stack['origin']}/config.json").json()
    assert config == {
        "cdn": stack["cdn"],
        "edge": stack["edge"],
        "profiles": {"en": PROFILE},
        "model": "SmolLM2-135M-Instruct",
        "releasePublicKeys": [stack["key"]],
    }
    # browsers on the page's origin may read the edge's and the origin's answers and tiers
    preflight = httpx.options(
        f"{stack['edge']}/v1/lookup",
        headers={"origin": stack["origin"], "access-control-request-method": "GET"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in ("*", stack["origin"])


def _skip_without_a_browser() -> None:
    missing = []
    if NODE is None:
        missing.append("Node.js")
    if not (WEB / "node_modules" / "playwright-core").is_dir():
        missing.append("playwright-core (cd web && npm ci)")
    if not Path(CHROMIUM).exists():
        missing.append("Chromium (apt-get install -y chromium)")
    if missing:
        pytest.skip("missing " + ", ".join(missing) + ": `make test` installs them as root")


def _in_chromium(script: str, *args: str) -> dict[str, Any]:
    """The JSON a ``web/test`` script driving headless Chromium prints last."""
    done = subprocess.run(
        [str(NODE), f"test/{script}", *args],
        cwd=WEB,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "CHROMIUM": CHROMIUM},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _semantic_work(origin: str) -> dict[str, float]:
    """The origin's semantic-tier lookups by outcome and the missed-hints it honoured."""
    import httpx

    wanted = {
        'edgeqa_origin_semantic_lookups_total{outcome="miss"}': "searched",
        'edgeqa_origin_semantic_lookups_total{outcome="skipped"}': "skipped",
        'edgeqa_origin_missed_hints_total{outcome="honoured"}': "honoured",
    }
    text = httpx.get(f"{origin}/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name: float(samples[sample]) for sample, name in wanted.items()}


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after if after[name] != before[name]}


def test_browser_asks_a_published_and_a_novel_question(stack: dict[str, Any]) -> None:
    _skip_without_a_browser()
    published, novel = QUESTIONS[0], "Name one planet of the solar system."
    before = _semantic_work(stack["origin"])
    questions = (published, QUESTIONS[1], QUESTIONS[2], novel)
    report = _in_chromium("browser.mjs", stack["origin"], *questions)
    assert report["errors"] == []
    first, replaced, rebucketed, second = report["results"]
    assert first["tier"] == "exact" and "cdn" in first["label"], first
    assert first["answer"] == f"v1: answer to {published}"
    assert "first byte" in first["latency"] and not first["error"]
    # the replaced object's bytes do not hash to the digest its bucket names, and the rewritten
    # bucket does not prove itself against the signed root: the edge answers both
    for found, question in ((replaced, QUESTIONS[1]), (rebucketed, QUESTIONS[2])):
        assert found["tier"] == "exact" and "edge" in found["label"], found
        assert found["answer"] == f"v1: answer to {question}" and FORGED not in found["answer"]
    assert second["tier"] == "generated" and "origin" in second["label"], second
    assert second["answer"].strip() and not second["error"]
    assert report["recent"] == ["generated", "exact", "exact", "exact"]
    # the page told the origin which release the edge had missed the novel question in: it was
    # not embedded and searched a second time
    assert _moved(before, _semantic_work(stack["origin"])) == {"skipped": 1, "honoured": 1}


def test_a_long_question_without_spaces_wraps_on_the_page(stack: dict[str, Any]) -> None:
    """3,000 characters pasted without a space wrap in the answer and in the recent lookups
    instead of widening the page past the viewport."""
    _skip_without_a_browser()
    report = _in_chromium("browser.mjs", stack["origin"], PASTED)
    assert report["errors"] == []
    (pasted,) = report["results"]
    kept = PASTED[:MAX_QUERY_CHARS]
    assert pasted["tier"] == "exact" and pasted["answer"] == f"v1: answer to {kept}"
    assert report["recent"] == ["exact"]
    widths = {name: pasted[name] for name in ("scrollWidth", "innerWidth")}
    assert widths["scrollWidth"] <= widths["innerWidth"], widths


def test_the_python_client_takes_the_browser_s_path(stack: dict[str, Any]) -> None:
    """``edgeqa.client`` and ``web/edgeqa.js`` land on the same tier for the same question."""
    keys = (stack["key"],)
    client = EdgeQAClient(stack["origin"], stack["cdn"], stack["edge"], PROFILE, public_keys=keys)
    published = client.ask(QUESTIONS[0])
    assert (published.tier, published.source) == ("exact", "cdn")
    assert published.answer == f"v1: answer to {QUESTIONS[0]}"
    for forged in QUESTIONS[1:3]:  # its object replaced; its bucket rewritten
        replaced = client.ask(forged)
        assert (replaced.source, replaced.answer) == ("edge", f"v1: answer to {forged}")
    # without the release keys the client cannot tell a forged object: it skips the CDN
    unkeyed = EdgeQAClient(stack["origin"], stack["cdn"], stack["edge"], PROFILE)
    assert unkeyed.ask(QUESTIONS[0]).source == "edge"
    received: list[str] = []
    before = _semantic_work(stack["origin"])
    novel = client.ask("Name one river in Europe.", on_text=received.append)
    assert (novel.tier, novel.source) == ("generated", "origin")
    assert novel.answer.strip() and "".join(received) == novel.answer
    assert _moved(before, _semantic_work(stack["origin"])) == {"skipped": 1, "honoured": 1}
    edge_only = EdgeQAClient(stack["origin"], "", stack["edge"], PROFILE).ask(QUESTIONS[0])
    assert (edge_only.tier, edge_only.source) == ("exact", "edge")


def test_the_release_report_opens_offline_with_its_charts(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``edgeqa release show --html``: one self-contained page, charts drawn by Plotly, what
    users typed shown as text, never as markup."""
    from precompute.releases import diff_releases, show_release
    from precompute.report import render_html

    _skip_without_a_browser()
    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "r1", store, tag="v1")
    first = publish(store, tmp_path / "r1").version
    hostile = "Is <script>alert(1)</script> my card blocked?"
    questions = (*QUESTIONS, hostile)
    build(
        embedder,
        tmp_path / "r2",
        store,
        tag="v2",
        questions=questions,
        now=datetime(2026, 11, 30, tzinfo=UTC),
    )
    second = publish(store, tmp_path / "r2").version
    shown = show_release(store, PROFILE)
    assert shown.calibration.curve, "the manifest records the calibration curve"
    shown.excluded.rows = {"below_k": 120, "pii": 7}  # as a nightly run reports them
    page = tmp_path / "report.html"
    page.write_text(render_html(shown, diff_releases(store, PROFILE, first, second)))
    report = _in_chromium("report.mjs", str(page))
    assert report["errors"] == [] and report["external"] == []
    calibration, exclusions = report["charts"]
    assert calibration["svgs"] >= 1 and calibration["traces"] >= 3, calibration
    assert "threshold" in calibration["title"] and exclusions["traces"] >= 1, exclusions
    text = report["text"]
    assert hostile in text  # shown as the text it is
    assert f"Release {second}" in text and "Most asked clusters" in text
    assert "semantic tier: on; threshold" in text  # this small release serves it uncalibrated
    assert f"{first} → {second}" in text and "1 added" in text
