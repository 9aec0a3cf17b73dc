"""The edge service: tiers, errors, hot swap under load, refusing a corrupt release, the CLI."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_index.logs import read_logs
from edge_index.release import release_prefix
from edge_index.service import create_app
from edge_index.store import FileStore, Store, open_store
from edge_index.watcher import EDGE_METRICS, NoProfileError, ReleaseWatcher, resolve_profile
from precompute.publish import publish
from tests.releases import PROFILE, QUESTIONS, build
from tests.s3proxy import FaultyS3
from tests.serving import Server, free_port, wait_healthy

MORE = (
    "What is the daily limit for 100 pound withdrawals?",
    "Can I use Apple Pay with my card?",
)


@pytest.fixture()
def s3_store(s3_bucket: str) -> Store:
    return open_store(f"s3://{s3_bucket}/edge")


def _publish(embedder: Any, store: Store, tmp: Path, tag: str, day: int, **kw: Any) -> str:
    build(embedder, tmp / tag, store, tag=tag, now=datetime(2026, 11, day, tzinfo=UTC), **kw)
    return publish(store, tmp / tag).version


def test_tiers_errors_health_and_metrics(embedder, s3_store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = ReleaseWatcher(s3_store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    with Server(create_app(state)) as server, httpx.Client(base_url=server.url) as client:
        # nothing published yet: alive and answering misses, not ready
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["reason"] == "no_release"
        assert client.get("/ready").status_code == 503
        miss = client.get("/v1/lookup", params={"q": "How do I freeze my card?"})
        assert miss.status_code == 404 and miss.json() == {
            "miss": True,
            "version": None,
            "reason": "no_release",
        }
        version = _publish(embedder, s3_store, tmp_path, "v1", 20, questions=QUESTIONS + MORE)
        assert state.refresh()
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["version"] == version
        assert health["entries"] == len(QUESTIONS + MORE)
        assert client.get("/ready").status_code == 200

        exact = client.get("/v1/lookup", params={"q": "  how do I FREEZE my card??  "})
        assert exact.status_code == 200, exact.text
        body = exact.json()
        assert body["tier"] == "exact" and body["version"] == version
        assert body["answer"] == "v1: answer to How do I freeze my card?"
        assert set(body) == {"answer", "question", "score", "tier", "version", "key", "profile"}
        assert body["profile"] == PROFILE
        assert exact.headers["x-edgeqa-tier"] == "exact"

        semantic = client.get("/v1/lookup", params={"q": "how can I freeze my card"})
        assert semantic.status_code == 200, semantic.text
        assert semantic.json()["tier"] == "semantic"
        assert semantic.json()["question"] == "How do I freeze my card?"

        for unrelated in ("What is the capital of France?", "Tell me a joke about cats"):
            assert client.get("/v1/lookup", params={"q": unrelated}).status_code == 404
        # the guard: a different number or a different named entity never matches
        for changed in (
            "What is the daily limit for 200 pound withdrawals?",
            "Can I use Google Pay with my card?",
        ):
            response = client.get("/v1/lookup", params={"q": changed})
            assert response.status_code == 404, response.text

        bad_queries = (({"q": "  ?? "}, "empty"), ({"q": "x" * 5000}, "too_long"), ({}, "missing"))
        for params, reason in bad_queries:
            bad = client.get("/v1/lookup", params=params)
            assert bad.status_code == 400
            assert bad.json()["error"]["field"] == "q" and bad.json()["error"]["reason"] == reason
        # POST keeps the question out of URLs (and so out of CDN and load-balancer access logs)
        posted = client.post("/v1/lookup", json={"q": "  how do I FREEZE my card??  "})
        assert posted.status_code == 200 and posted.json()["tier"] == "exact"
        bad_posts = (
            (b"{", 400, "body"),
            (b"[1]", 400, "body"),
            (b'{"q": 5}', 400, "q"),
            (b"{}", 400, "q"),
            (b'{"q": "' + b"x" * 20_000 + b'"}', 413, "body"),
        )
        for raw, status, field in bad_posts:
            bad = client.post("/v1/lookup", content=raw)
            assert bad.status_code == status and bad.json()["error"]["field"] == field, raw[:20]
        assert client.put("/v1/lookup").status_code == 405
        assert client.get("/nope").json()["error"]["field"] == "path"

        metrics = client.get("/metrics").text
        assert 'edgeqa_edge_lookups_total{outcome="hit",tier="exact"} 2.0' in metrics
        assert 'edgeqa_edge_lookups_total{outcome="hit",tier="semantic"} 1.0' in metrics
        assert 'edgeqa_edge_lookups_total{outcome="rejected",tier="none"} 8.0' in metrics
        assert f'edgeqa_edge_release_info{{language="en",version="{version}"}} 1.0' in metrics
        assert "edgeqa_edge_lookup_seconds_bucket" in metrics
        assert "edgeqa_edge_release_age_seconds" in metrics


def test_hot_swap_under_load_fails_no_lookup(embedder, s3_store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    old = _publish(embedder, s3_store, tmp_path, "old", 20)
    state = ReleaseWatcher(s3_store, PROFILE, embedder, poll_s=0.1, metrics_prefix=EDGE_METRICS)
    state.start()
    stop = threading.Event()
    outcomes: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    lock = threading.Lock()

    def client_loop(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            i = 0
            while not stop.is_set():
                question = QUESTIONS[(n + i) % len(QUESTIONS)]
                variant = question if i % 2 else question.lower().rstrip("?") + " please?"
                i += 1
                try:
                    response = client.get("/v1/lookup", params={"q": variant})
                    ok = response.status_code == 200
                    with lock:
                        outcomes["ok" if ok else f"status {response.status_code}"] += 1
                        if ok:
                            versions[response.json()["version"]] += 1
                except httpx.HTTPError as error:
                    with lock:
                        outcomes[f"error {type(error).__name__}"] += 1

    with Server(create_app(state)) as server:
        threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(20)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        new = _publish(embedder, s3_store, tmp_path, "new", 21)
        deadline = time.monotonic() + 60
        while (state.index is None or state.index.version != new) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # keep looking up on the new release
        stop.set()
        for t in threads:
            t.join()
    state.stop()
    assert state.index is not None and state.index.version == new
    # "please" variants are semantic lookups, the others exact: every one answered, none failed
    assert set(outcomes) == {"ok"}, outcomes
    assert versions[old] > 0 and versions[new] > 0, versions


def test_corrupt_release_is_refused_and_the_old_one_keeps_serving(
    embedder,
    s3_store: Store,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    old = _publish(embedder, s3_store, tmp_path, "old", 20)
    state = ReleaseWatcher(s3_store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    state.refresh()
    new = _publish(embedder, s3_store, tmp_path, "new", 21)
    shard = f"{release_prefix(PROFILE, new)}/shards/00000.faiss"
    data = bytearray(s3_store.get(shard))
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    s3_store.put(shard, bytes(data))
    assert state.refresh() is False
    assert state.index is not None and state.index.version == old
    assert state.refresh() is False  # not retried until the pointer changes
    with Server(create_app(state)) as server, httpx.Client(base_url=server.url) as client:
        response = client.get("/v1/lookup", params={"q": QUESTIONS[0]})
        assert response.status_code == 200 and response.json()["version"] == old
        metrics = client.get("/metrics").text
        assert 'edgeqa_edge_release_loads_total{language="en",result="refused"} 1.0' in metrics


def test_a_store_outage_is_retried_not_refused(
    embedder,  # type: ignore[no-untyped-def]
    s3_bucket: str,
    s3_proxy: type[FaultyS3],
    tmp_path: Path,
) -> None:
    version = _publish(embedder, open_store(f"s3://{s3_bucket}/edge"), tmp_path, "v1", 20)
    store = open_store(f"s3://{s3_bucket}/edge", retries=0)
    state = ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    s3_proxy.failing_paths = "/shards/"  # the pointer and manifest answer; the shards throttle
    assert state.refresh() is False and state.index is None
    with Server(create_app(state)) as server, httpx.Client(base_url=server.url) as client:
        health = client.get("/health")
        assert health.status_code == 200, health.text  # alive: not to be restarted
        assert health.json()["status"] == "degraded"
        assert health.json()["reason"] == "store_unreachable"
        assert "SlowDown" in health.json()["error"]
        assert client.get("/ready").status_code == 503
        assert state.next_poll_s() == 1.0  # retried soon, not at the next poll
        s3_proxy.failing_paths = ""
        assert state.refresh() is True  # the same pointer, loaded once the store is back
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/ready").status_code == 200
        metrics = client.get("/metrics").text
        assert 'edgeqa_edge_release_loads_total{language="en",result="retry"} 1.0' in metrics
        assert 'edgeqa_edge_release_loads_total{language="en",result="ok"} 1.0' in metrics
        assert f'edgeqa_edge_release_info{{language="en",version="{version}"}} 1.0' in metrics


def test_expired_answers_are_not_served(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from edge_index.lookup import Miss, ReleaseIndex
    from edge_index.release import load_release

    store = FileStore(tmp_path / "store")
    _publish(embedder, store, tmp_path, "v1", 20)
    release = load_release(store, PROFILE)
    expiry = [t.timestamp() for t in release.shards[0].rows.column("expires_at").to_pylist()]
    question, key = QUESTIONS[0], release.shards[0].rows.column("key").to_pylist()
    fresh = ReleaseIndex(release, embedder, clock=lambda: min(expiry) - 1)
    hit = fresh.lookup_semantic(question)
    assert not isinstance(hit, Miss) and fresh.lookup_exact(hit.key) is not None
    stale = ReleaseIndex(release, embedder, clock=lambda: max(expiry))
    assert all(stale.lookup_exact(k) is None for k in key)  # past expires_at: no exact hit
    miss = stale.lookup_semantic(question)
    assert isinstance(miss, Miss) and miss.reason == "expired"


def test_lookups_are_logged_with_hashed_users(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from edge_index.logs import LogWriter

    store = FileStore(tmp_path / "store")
    _publish(embedder, store, tmp_path, "v1", 20)
    state = ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    state.refresh()
    logs = LogWriter(store, source="edge", flush_interval_s=0)
    with Server(create_app(state, logs)) as server, httpx.Client(base_url=server.url) as client:
        client.get("/v1/lookup", params={"q": QUESTIONS[0]}, headers={"x-edgeqa-user": "alice"})
        client.get("/v1/lookup", params={"q": "something else entirely"})
        client.get("/v1/lookup", params={"q": ""})
    logs.close()
    today = datetime.now(UTC).date()
    rows = read_logs(store, today, today)
    assert sorted(r["tier"] for r in rows) == ["exact", "miss", "rejected"]
    assert all(r["user"] and "alice" not in r["user"] for r in rows)
    assert {r["status"] for r in rows} == {200, 404, 400}


def test_profile_resolution(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    with pytest.raises(NoProfileError, match="no release"):
        resolve_profile(store, None)
    _publish(embedder, store, tmp_path, "v1", 20)
    assert resolve_profile(store, None) == PROFILE
    assert resolve_profile(store, "other") == "other"


@pytest.fixture()
def served_store(embedder, tmp_path: Path) -> Iterator[FileStore]:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    _publish(embedder, store, tmp_path, "v1", 20)
    yield store


def test_edge_serve_command(served_store: FileStore, cli_env: dict[str, str]) -> None:
    port = free_port()
    env = {**cli_env, "EDGEQA_STORE": served_store.uri, "EDGEQA_USER_SALT": "test-salt-0123456789"}
    child = subprocess.Popen(
        ["edgeqa", "edge", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, child)
        response = httpx.get(f"{url}/v1/lookup", params={"q": QUESTIONS[1]})
        assert response.status_code == 200 and response.json()["tier"] == "exact"
    finally:
        child.terminate()
        child.wait(30)
    # the lookup was logged on shutdown
    today = datetime.now(UTC).date()
    assert any(r["tier"] == "exact" for r in read_logs(served_store, today, today))


def test_a_release_ships_its_finetuned_embedder(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import copy

    from edge_index.finetune import finetune, model_digest

    texts = [
        "how do i freeze my card",
        "freeze my card please",
        "opening hours",
        "when do you open",
    ]
    tuned = finetune(copy.deepcopy(embedder), texts, ["a", "a", "b", "b"], steps=2, batch_size=2)
    folder = tmp_path / "tuned"
    tuned.save(str(folder))
    store = FileStore(tmp_path / "store")
    info = {"finetuned": {"base": "embedded", "steps": 2, "sha256": model_digest(folder)}}
    manifest = build(tuned, tmp_path / "r1", store, embedder_dir=folder, embedder_info=info)
    publish(store, tmp_path / "r1")
    assert manifest["embedder"]["finetuned"]["sha256"] == model_digest(folder)
    assert any(f["path"].endswith(".safetensors") for f in manifest["embedder"]["files"])
    state = ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    assert state.refresh()
    assert state.index is not None and state.index.embedder is not embedder
    query = "how can I freeze my card"
    expected = state.index.embedder.encode([query], normalize_embeddings=True)
    assert float((state.index.embed([query]) * expected).sum()) > 0.999  # the tuned model
    # a release whose embedder file was tampered with is refused
    build(
        tuned,
        tmp_path / "r2",
        store,
        tag="v2",
        now=datetime(2026, 12, 1, tzinfo=UTC),
        embedder_dir=folder,
        embedder_info=info,
    )
    version = publish(store, tmp_path / "r2").version
    files = [f["path"] for f in manifest["embedder"]["files"]]
    weights = next(path for path in files if path.endswith(".safetensors"))
    path = f"{release_prefix(PROFILE, version)}/{weights}"
    data = bytearray(store.get(path))
    data[-1] ^= 0xFF
    store.put(path, bytes(data))
    old = state.index.version
    assert state.refresh() is False and state.index.version == old
    # a swap frees the release it replaces, shipped embedder included (it was frozen out of GC)
    import gc
    import weakref

    first = weakref.ref(state.index.embedder)
    build(
        tuned,
        tmp_path / "r3",
        store,
        tag="v3",
        now=datetime(2026, 12, 2, tzinfo=UTC),
        embedder_dir=folder,
        embedder_info=info,
    )
    publish(store, tmp_path / "r3")
    assert state.refresh() and state.index.version != old
    gc.collect()
    assert first() is None


def test_an_uncalibrated_release_serves_exact_hits_only(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Fail closed: a release whose calibration cannot show the target precision (here: four
    questions, no paraphrases to measure with) publishes with its semantic tier off, and the edge
    never applies the uncalibrated threshold."""
    store = FileStore(tmp_path / "store")
    manifest = build(embedder, tmp_path / "r1", store, semantic_uncalibrated=False)
    threshold = manifest["threshold"]
    assert threshold["calibrated"] is False and threshold["semantic"] is False
    assert "exact tier only" in threshold["semantic_off_reason"]
    publish(store, tmp_path / "r1")
    state = ReleaseWatcher(store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS)
    assert state.refresh() and state.health()["semantic"] is False
    with Server(create_app(state)) as server, httpx.Client(base_url=server.url) as client:
        assert client.post("/v1/lookup", json={"q": QUESTIONS[0]}).json()["tier"] == "exact"
        # the paraphrase the fallback decision would have matched (see the test above)
        miss = client.post("/v1/lookup", json={"q": "how can I freeze my card"})
        assert miss.status_code == 404 and miss.json()["reason"] == "semantic_off"
        metrics = client.get("/metrics").text
        assert 'edgeqa_edge_release_semantic_enabled{language="en"} 0.0' in metrics
