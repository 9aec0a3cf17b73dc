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

from base.logreader import read_logs
from base.manifest import Finetuned, Manifest
from base.release import release_prefix
from base.store import FileStore, Store, open_store
from base.users import UserHasher
from edge_index.profiles import NoProfileError, resolve_profile
from edge_index.server.app import create_app
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
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
            "profile": None,  # no release searched: nothing to tell the origin
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
            miss = client.get("/v1/lookup", params={"q": unrelated})
            assert miss.status_code == 404
            # the release searched, which a client names to the origin (base.missed.missed_hint)
            assert (miss.json()["profile"], miss.json()["version"]) == (PROFILE, version)
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
    from base.release import load_release
    from edge_index.lookup import Miss, ReleaseIndex

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


def test_a_posted_value_python_cannot_hold_or_encode_is_a_400_naming_its_field(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """An integer past Python's 4300-digit conversion limit, and a lone surrogate (no UTF-8
    form), are valid JSON: refused naming the field, as any other bad value is."""
    state = ReleaseWatcher(
        FileStore(tmp_path / "store"), PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS
    )
    huge = b"9" * 5000
    cases = (
        (b'{"q": ' + huge + b"}", "q"),
        (b'{"q": "how do I freeze my card", "profile": -' + huge + b"}", "profile"),
        (b'{"q": "how do I freeze \\ud800 my card"}', "q"),
        (b'{"q": "how do I freeze my card", "profile": "\\udfff"}', "profile"),
    )
    with Server(create_app(state)) as server, httpx.Client(base_url=server.url) as client:
        for raw, field in cases:
            refused = client.post("/v1/lookup", content=raw)
            assert refused.status_code == 400, (raw[-40:], refused.text[:200])
            error = refused.json()["error"]
            assert error["field"] == field and error["reason"] == "invalid", raw[-40:]
        fine = client.post("/v1/lookup", json={"q": "how do I freeze my card \U0001f600"})
        assert fine.status_code == 404 and fine.json()["reason"] == "no_release"


def test_metrics_behind_a_bearer_token(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = ReleaseWatcher(
        FileStore(tmp_path / "store"), PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS
    )
    token = "m" * 24
    app = create_app(state, metrics_token=token)
    with Server(app) as server, httpx.Client(base_url=server.url) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["field"] == "authorization"
        wrong = client.get("/metrics", headers={"authorization": f"Bearer {token[:-1]}x"})
        assert wrong.status_code == 401
        scraped = client.get("/metrics", headers={"authorization": f"Bearer {token}"})
        assert scraped.status_code == 200 and "edgeqa_edge_lookups_total" in scraped.text
        assert client.get("/health").status_code == 200  # load balancers need no token
    from starlette.testclient import TestClient

    # without a token, /metrics answers this machine only
    for peer, status in (("203.0.113.9", 403), ("::1", 200), ("127.0.0.1", 200)):
        assert (
            TestClient(create_app(state), client=(peer, 5000)).get("/metrics").status_code == status
        )


def test_lookups_are_logged_with_hashed_users(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from base.logs import LogWriter

    store = FileStore(tmp_path / "store")
    _publish(embedder, store, tmp_path, "v1", 20)
    state = ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    state.refresh()
    logs = LogWriter(store, source="edge", flush_interval_s=0)
    users = UserHasher("salt-0123456789abcdef")
    app = create_app(state, logs, users=users)
    with Server(app) as server, httpx.Client(base_url=server.url) as client:
        alice = {"x-edgeqa-user": "alice", "x-edgeqa-tenant": "acme"}
        client.get("/v1/lookup", params={"q": QUESTIONS[0]}, headers=alice)
        client.get("/v1/lookup", params={"q": "something else entirely"})
        client.get("/v1/lookup", params={"q": ""})
    logs.close()
    today = datetime.now(UTC).date()
    rows = read_logs(store, today, today)
    assert sorted(r["tier"] for r in rows) == ["exact", "miss", "rejected"]
    assert all(r["user"] and "alice" not in r["user"] for r in rows)
    assert {r["status"] for r in rows} == {200, 404, 400}
    # the tenant is hashed as the user is; no header, nothing
    assert {r["tier"]: r["tenant"] for r in rows} == {
        "exact": users("tenant:acme"),
        "miss": "",
        "rejected": "",
    }


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
    from precompute.finetune import finetune, model_digest
    from semantic.loading import trainable

    texts = [
        "how do i freeze my card",
        "freeze my card please",
        "opening hours",
        "when do you open",
    ]
    tuned = finetune(trainable(embedder), texts, ["a", "a", "b", "b"], steps=2, batch_size=2)
    folder = tmp_path / "tuned"
    tuned.save(str(folder))
    store = FileStore(tmp_path / "store")
    info = Finetuned(base="embedded", steps=2, examples=4, sha256=model_digest(folder))
    manifest = build(tuned, tmp_path / "r1", store, embedder_dir=folder, embedder_info=info)
    publish(store, tmp_path / "r1")
    assert manifest.embedder.finetuned == info
    assert any(f.path.endswith(".safetensors") for f in manifest.embedder.files)
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
    files = [f.path for f in manifest.embedder.files]
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
    threshold = manifest.threshold
    assert threshold.calibrated is False and threshold.semantic is False
    assert "exact tier only" in str(threshold.semantic_off_reason)
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


ZH_QUESTIONS = (
    "如何冻结我的银行卡？",
    "网点的营业时间是几点？",
    "跨行转账多久能到账？",
    "怎么修改我的联系地址？",
)
# answered in Chinese: a Chinese question answered in Latin letters is flagged (``language``)
ZH_ANSWERS = {
    ZH_QUESTIONS[0]: "请在手机银行的“卡片管理”中选择冻结，或致电客服。",
    ZH_QUESTIONS[1]: "网点营业时间为周一至周五上午九点到下午五点。",
    ZH_QUESTIONS[2]: "跨行转账通常在两个工作日内到账。",
    ZH_QUESTIONS[3]: "请登录网上银行，在个人资料中修改联系地址。",
}
# e5 cosine to ZH_QUESTIONS[0]: 0.997 through encode, 0.9995 as the edge scores it (the other
# questions: <= 0.85); the fallback decision (0.9, margin 0.05) lets it through
ZH_PARAPHRASE = "怎么冻结我的银行卡"


def _publish_languages(
    embedder: Any,
    multilingual_embedder: Any,
    store: Store,
    tmp: Path,
) -> tuple[str, str]:
    """An English release (test-en, MiniLM) and a Chinese one (test-zh, multilingual-e5)."""
    build(embedder, tmp / "en", store, profile="test-en", language="en")
    build(
        multilingual_embedder,
        tmp / "zh",
        store,
        profile="test-zh",
        language="zh",
        embedder_name="multilingual",
        questions=ZH_QUESTIONS,
        answers=ZH_ANSWERS,
    )
    return publish(store, tmp / "en").version, publish(store, tmp / "zh").version


def _releases(
    store: Store,
    model_cache_dir: Path,
    embedders: dict[str, Any],
    **env: str,
) -> Any:
    from base.config import EdgeSettings
    from edge_index.releases import Releases

    settings = EdgeSettings.from_env(
        {
            "EDGEQA_STORE": store.uri,
            "EDGEQA_CACHE_DIR": str(model_cache_dir),
            "EDGEQA_POLL_S": "3600",
            **env,
        }
    )
    return Releases.from_settings(settings, EDGE_METRICS, embedders=embedders, store=store)


def test_each_question_is_answered_from_its_language_profile(
    embedder,  # type: ignore[no-untyped-def]
    multilingual_embedder,
    model_cache_dir: Path,
    tmp_path: Path,
) -> None:
    from starlette.testclient import TestClient

    store = FileStore(tmp_path / "store")
    en_version, zh_version = _publish_languages(embedder, multilingual_embedder, store, tmp_path)
    embedders = {"embedded": embedder, "multilingual": multilingual_embedder}
    releases = _releases(store, model_cache_dir, embedders)
    releases.start()
    try:
        assert releases.profiles() == {"en": "test-en", "zh": "test-zh"}
        with TestClient(create_app(releases), client=("127.0.0.1", 5000)) as client:
            exact = client.get("/v1/lookup", params={"q": ZH_QUESTIONS[0]})
            assert exact.status_code == 200, exact.text
            body = exact.json()
            assert body["tier"] == "exact" and body["profile"] == "test-zh"
            assert body["version"] == zh_version
            assert body["answer"] == ZH_ANSWERS[ZH_QUESTIONS[0]]

            semantic = client.post("/v1/lookup", json={"q": ZH_PARAPHRASE})
            assert semantic.status_code == 200, semantic.text
            body = semantic.json()
            assert body["tier"] == "semantic" and body["profile"] == "test-zh"
            assert body["question"] == ZH_QUESTIONS[0] and body["score"] > 0.99

            english = client.get("/v1/lookup", params={"q": QUESTIONS[1]})
            assert english.status_code == 200, english.text
            assert english.json()["profile"] == "test-en"
            assert english.json()["version"] == en_version

            # a profile named: looked up there (test-en's version), whatever the script
            named = client.get("/v1/lookup", params={"q": ZH_QUESTIONS[0], "profile": "test-en"})
            assert named.status_code == 404, named.text
            assert named.json()["version"] == en_version
            posted = client.post("/v1/lookup", json={"q": QUESTIONS[1], "profile": "test-zh"})
            assert posted.status_code == 404 and posted.json()["version"] == zh_version

            unknown = client.get("/v1/lookup", params={"q": QUESTIONS[1], "profile": "test-fr"})
            assert unknown.status_code == 400 and unknown.json()["error"]["field"] == "profile"
            assert "test-en, test-zh" in unknown.json()["error"]["message"]
            unknown = client.post("/v1/lookup", json={"q": QUESTIONS[1], "profile": 5})
            assert unknown.status_code == 400 and unknown.json()["error"]["field"] == "profile"

            health = client.get("/health").json()
            assert health["status"] == "ok"
            languages = health["languages"]
            assert set(languages) == {"en", "zh"}
            assert languages["en"]["status"] == "ok" and languages["zh"]["status"] == "ok"
            assert languages["zh"]["profile"] == "test-zh"
            assert languages["zh"]["version"] == zh_version
            assert languages["zh"]["entries"] == len(ZH_QUESTIONS)

            metrics = client.get("/metrics").text
            entries = f'edgeqa_edge_release_entries{{language="zh"}} {float(len(ZH_QUESTIONS))}'
            assert entries in metrics
            assert (
                f'edgeqa_edge_release_info{{language="zh",version="{zh_version}"}} 1.0' in metrics
            )
            assert (
                f'edgeqa_edge_release_info{{language="en",version="{en_version}"}} 1.0' in metrics
            )
    finally:
        releases.stop()

    only_en = _releases(store, model_cache_dir, embedders, EDGEQA_LANGUAGES="en")
    only_en.start()
    try:
        assert only_en.profiles() == {"en": "test-en"}
        with TestClient(create_app(only_en)) as client:
            miss = client.get("/v1/lookup", params={"q": ZH_QUESTIONS[0]})
            assert miss.status_code == 404, miss.text
            assert miss.json() == {
                "miss": True,
                "version": None,
                "reason": "language_not_served",
                "profile": None,
            }
            assert client.get("/v1/lookup", params={"q": QUESTIONS[1]}).status_code == 200
            health = client.get("/health").json()  # one language: that watcher's health
            assert health["status"] == "ok" and health["profile"] == "test-en"
    finally:
        only_en.stop()


def test_a_release_embedded_with_another_embedder_is_refused(
    embedder,  # type: ignore[no-untyped-def]
    multilingual_embedder,
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    _publish_languages(embedder, multilingual_embedder, store, tmp_path)
    # MiniLM is 384-d like e5: only the recorded name tells the two apart
    state = ReleaseWatcher(
        store, "test-zh", embedder, embedder_spec="embedded", metrics_prefix=EDGE_METRICS
    )
    assert state.refresh() is False and state.index is None
    health = state.health()
    assert health["status"] == "degraded" and health["reason"] == "refused"
    assert "'multilingual'" in health["error"] and "'embedded'" in health["error"]
    assert state.refresh() is False  # not retried until the pointer changes
    # the embedder the release names loads it
    right = ReleaseWatcher(
        store,
        "test-zh",
        multilingual_embedder,
        embedder_spec="multilingual",
        metrics_prefix=EDGE_METRICS,
    )
    assert right.refresh() is True and right.health()["status"] == "ok"


def test_resolve_profile_by_language(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    with pytest.raises(NoProfileError, match="no en release"):
        resolve_profile(store, None, "en")
    # en-old: built before languages were recorded (no language in its inputs: English)
    _publish(embedder, store, tmp_path, "old", 20, profile="en-old")
    manifest = _current_manifest(store, "en-old")
    assert "language" not in manifest.profile.inputs and manifest.profile.language == "en"
    assert resolve_profile(store, None, "en") == "en-old"
    _publish(embedder, store, tmp_path, "new", 21, profile="en-new", language="en")
    # a zh profile (routing reads the manifest only: MiniLM vectors are fine here)
    _publish(embedder, store, tmp_path, "zh", 22, profile="zh-only", language="zh")
    assert resolve_profile(store, None, "en") == "en-new"  # the newest en release
    assert resolve_profile(store, None, "zh") == "zh-only"
    assert resolve_profile(store, None, "en", ("en-old", "zh-only")) == "en-old"
    assert resolve_profile(store, None, "en", ("en-old", "en-new")) == "en-new"
    # a newer release of the older profile makes it the newest
    _publish(embedder, store, tmp_path, "old2", 23, profile="en-old")
    assert resolve_profile(store, None, "en") == "en-old"
    assert resolve_profile(store, "pinned", "en") == "pinned"  # a named profile is served as is
    with pytest.raises(NoProfileError, match="among"):
        resolve_profile(store, None, "zh", ("en-old", "en-new"))
    with pytest.raises(NoProfileError, match="among"):
        resolve_profile(store, None, "en", ("missing",))
    with pytest.raises(NoProfileError, match="several profiles"):
        resolve_profile(store, None)  # no language, several profiles: which one is not known


def _current_manifest(store: Store, profile: str) -> Manifest:
    from base.release import read_manifest, read_pointer

    pointer, _ = read_pointer(store, profile)
    assert pointer is not None
    manifest, _ = read_manifest(store, profile, pointer.version)
    return manifest
