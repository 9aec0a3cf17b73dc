"""Building and publishing releases: integrity, atomic flips, races, fault injection, pruning."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from base.answer_objects import object_path
from base.pointers import signed_root
from base.release import (
    POINTER_CACHE_CONTROL,
    ReleaseError,
    list_versions,
    load_release,
    pointer_path,
    read_pointer,
    release_prefix,
)
from base.signing import LocalSigner, generate_keypair
from base.store import FileStore, S3Store, Store, open_store
from precompute.publish import STAGES, PublishConflictError, prune, publish
from tests.releases import PROFILE, QUESTIONS, load_checked
from tests.releases import build as _build
from tests.s3proxy import FaultyS3


def test_publish_then_load_verifies_everything(embedder, store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    manifest = _build(embedder, tmp_path / "r1", store, ttl_days=7.0)
    report = publish(store, tmp_path / "r1")
    assert report.version == manifest.version and report.parent is None
    release = load_checked(store)
    assert release.version == manifest.version
    rows = release.shards[0].rows.to_pylist()
    assert sorted(r["question"] for r in rows) == sorted(QUESTIONS)
    assert manifest.index.factory == "HNSW32,Flat"
    # the exact-tier object for a key, as the CDN serves it
    obj = json.loads(store.get(f"{PROFILE}/{object_path(rows[0]['object_sha256'])}"))
    assert obj["answer"] == rows[0]["answer"] and obj["key"] == rows[0]["key"]
    # the semantic index finds each question's own row
    vectors = embedder.encode([r["normalized"] for r in rows], normalize_embeddings=True)
    _, ids = release.shards[0].index.search(vectors, 1)
    assert [int(i[0]) for i in ids] == [r["id"] for r in rows]
    # expiry carries jitter within bounds
    for r in rows:
        ttl = (r["expires_at"] - r["generated_at"]).total_seconds() / 86400
        assert 7.0 <= ttl <= 7.0 * 1.2


def test_browsers_ask_again_for_the_pointer_every_time(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    """``current.json`` carries its ``Cache-Control`` (on S3; the demo's CDN serves a folder's the
    same): without it a browser would reuse a pointer by heuristic, for hours, and miss a
    revocation or a rollback."""
    from starlette.testclient import TestClient

    from edgeqa.demo import cdn_app

    _build(embedder, tmp_path / "r1", store)
    version = publish(store, tmp_path / "r1").version
    row = load_release(store, PROFILE, version).shards[0].rows.to_pylist()[0]
    answer = f"{PROFILE}/{object_path(row['object_sha256'])}"
    if isinstance(store, S3Store):

        def served(path: str) -> str | None:
            head = store.client.head_object(Bucket=store.bucket, Key=store._key(path))
            return head.get("CacheControl")
    else:
        cdn = TestClient(cdn_app(store.root))
        # as CloudFront: answer objects, key-index buckets and pointers; nothing else of the store
        private = f"{release_prefix(PROFILE, version)}/manifest.json"
        assert store.exists(private) and cdn.get(f"/{private}").status_code == 404
        bucket = store.list(f"{release_prefix(PROFILE, version)}/k")[0]
        assert cdn.get(f"/{bucket}").status_code == 200

        def served(path: str) -> str | None:
            response = cdn.get(f"/{path}")
            assert response.status_code == 200
            return response.headers.get("cache-control")

    assert served(pointer_path(PROFILE)) == POINTER_CACHE_CONTROL
    assert served(answer) is None  # immutable: the CDN's own policy caches it a year


def test_corrupt_release_is_refused(embedder, store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    manifest = _build(embedder, tmp_path / "r1", store)
    publish(store, tmp_path / "r1")
    prefix = release_prefix(PROFILE, manifest.version)
    shard = f"{prefix}/{manifest.shards[0].rows.path}"
    store.put(shard, store.get(shard)[:-10] + b"0123456789")
    with pytest.raises(ReleaseError, match="sha256"):
        load_release(store, PROFILE)


def test_next_release_builds_on_the_current_one_and_pruning_keeps_n(
    embedder,
    store: Store,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    versions = []
    for n in range(4):
        now = datetime(2026, 11, 20 + n, tzinfo=UTC)
        _build(embedder, tmp_path / f"r{n}", store, tag=f"v{n}", now=now)
        versions.append(publish(store, tmp_path / f"r{n}", keep=2).version)
    assert list_versions(store, PROFILE) == versions[-2:]
    pointer, _ = read_pointer(store, PROFILE)
    assert pointer is not None
    assert pointer.version == versions[-1] and pointer.parent == versions[-2]


def test_stale_parent_is_refused(embedder, store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _build(embedder, tmp_path / "a", store, tag="a")
    _build(embedder, tmp_path / "b", store, tag="b", questions=QUESTIONS[:2])
    publish(store, tmp_path / "a")
    with pytest.raises(PublishConflictError, match="built on None"):
        publish(store, tmp_path / "b")


def test_two_racing_publishers_exactly_one_wins(embedder, store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base = _build(embedder, tmp_path / "base", store, tag="base")
    publish(store, tmp_path / "base")
    later = datetime(2026, 11, 30, tzinfo=UTC)
    a = _build(embedder, tmp_path / "a", store, tag="a", now=later)
    b = _build(embedder, tmp_path / "b", store, tag="b", now=later, questions=QUESTIONS[:3])
    assert a.parent == b.parent == base.version
    barrier = threading.Barrier(2)
    outcome: dict[str, str] = {}

    def run(name: str) -> None:
        def stage(s: str) -> None:
            if s == "flip":
                barrier.wait(timeout=60)  # both have uploaded and verified

        try:
            publish(store, tmp_path / name, on_stage=stage)
            outcome[name] = "won"
        except PublishConflictError as error:
            outcome[name] = f"lost: {error}"

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, o in outcome.items() if o == "won"]
    assert len(winners) == 1, outcome
    loser = "b" if winners == ["a"] else "a"
    assert "another publisher" in outcome[loser]
    pointer, _ = read_pointer(store, PROFILE)
    assert pointer is not None
    won = a if winners == ["a"] else b
    lost = b if won is a else a
    assert pointer.version == won.version
    load_checked(store)
    # the loser's upload is gone
    assert store.list(release_prefix(PROFILE, lost.version)) == []


@pytest.mark.parametrize("stage", STAGES[:-1])
def test_failure_at_any_stage_keeps_readers_on_the_previous_release(
    embedder,
    store: Store,
    tmp_path: Path,
    stage: str,  # type: ignore[no-untyped-def]
) -> None:
    old = _build(embedder, tmp_path / "old", store, tag="old")
    publish(store, tmp_path / "old")
    new = _build(
        embedder, tmp_path / "new", store, tag="new", now=datetime(2026, 12, 1, tzinfo=UTC)
    )

    def fail(s: str) -> None:
        if s == stage:
            raise ConnectionError(f"injected failure at {s}")

    with pytest.raises(ConnectionError):
        publish(store, tmp_path / "new", on_stage=fail)
    assert load_checked(store).version == old.version
    assert store.list(release_prefix(PROFILE, new.version)) == []
    # and the same release publishes fine afterwards
    assert publish(store, tmp_path / "new").version == new.version


def _publish_and_die(root: str, staging: str, stage: str, signing_key: str = "") -> None:
    def die(s: str) -> None:
        if s == stage:
            os._exit(17)  # a kill: no cleanup, no exception handlers

    signer = LocalSigner(signing_key) if signing_key else None
    publish(FileStore(root), Path(staging), on_stage=die, signer=signer)


@pytest.mark.parametrize("stage", ["shards", "manifest", "verify", "flip"])
def test_kill_at_any_stage_never_exposes_a_partial_release(
    embedder, tmp_path: Path, stage: str
) -> None:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    old = _build(embedder, tmp_path / "old", store, tag="old")
    publish(store, tmp_path / "old")
    new = _build(
        embedder, tmp_path / "new", store, tag="new", now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    child = multiprocessing.get_context("fork").Process(
        target=_publish_and_die, args=(str(store.root), str(tmp_path / "new"), stage)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 17
    assert load_checked(store).version == old.version
    assert list_versions(store, PROFILE) in ([old.version], [old.version, new.version])
    # what the killed publisher left behind is cleaned once it is old enough
    leftovers = store.list(release_prefix(PROFILE, new.version))
    assert leftovers or stage == "shards"  # the kill left files (before "shards": objects only)
    if new.version not in list_versions(store, PROFILE):
        prune(store, PROFILE, keep=5)  # written just now: an upload that may be in progress
        assert store.list(release_prefix(PROFILE, new.version)) == leftovers
        prune(store, PROFILE, keep=5, now=datetime.now(UTC) + timedelta(days=2))
        assert store.list(release_prefix(PROFILE, new.version)) == []


def test_a_flip_whose_reply_is_lost_still_publishes_and_keeps_the_release(
    embedder,  # type: ignore[no-untyped-def]
    s3_bucket: str,
    s3_proxy: type[FaultyS3],
    tmp_path: Path,
) -> None:
    store = open_store(f"s3://{s3_bucket}/root")
    old = _build(embedder, tmp_path / "old", store, tag="old")
    publish(store, tmp_path / "old")
    new = _build(
        embedder, tmp_path / "new", store, tag="new", now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    s3_proxy.drop_conditional_puts = 1  # current.json is written, the reply never arrives
    report = publish(store, tmp_path / "new")
    assert s3_proxy.drop_conditional_puts == 0 and report.version == new.version
    assert load_checked(store).version == new.version
    assert list_versions(store, PROFILE) == [old.version, new.version]


def test_publishing_again_resumes_an_upload_that_stopped_before_the_flip(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    private, public = generate_keypair()
    _build(embedder, tmp_path / "old", store, tag="old")
    publish(store, tmp_path / "old")
    new = _build(
        embedder, tmp_path / "new", store, tag="new", now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    child = multiprocessing.get_context("fork").Process(
        target=_publish_and_die, args=(str(store.root), str(tmp_path / "new"), "flip", private)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 17 and new.version in list_versions(store, PROFILE)
    stages: list[str] = []
    report = publish(store, tmp_path / "new", on_stage=stages.append, signer=LocalSigner(private))
    assert report.version == new.version and stages == ["verify", "flip", "prune"]
    assert load_checked(store, public_keys=(public,))
    # the resumed flip carries the signature the interrupted upload left, for browsers
    pointer_body = json.loads(store.get(f"{PROFILE}/current.json"))
    assert signed_root(pointer_body, PROFILE, (public,)) == new.answers_root
    # publishing the live release again changes nothing
    pointer = store.get(f"{PROFILE}/current.json")
    assert publish(store, tmp_path / "new").version == new.version
    assert store.get(f"{PROFILE}/current.json") == pointer
    # an interrupted upload that no longer verifies is uploaded again
    newer = _build(
        embedder, tmp_path / "newer", store, tag="newer", now=datetime(2026, 12, 2, tzinfo=UTC)
    )
    prefix = release_prefix(PROFILE, newer.version)
    store.put(f"{prefix}/manifest.json", (tmp_path / "newer" / "manifest.json").read_bytes())
    stages.clear()
    assert publish(store, tmp_path / "newer", on_stage=stages.append).version == newer.version
    assert "objects" in stages
    # a version holding a different release is never overwritten
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "newer", other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["parent"], manifest["note"] = newer.version, "a different release, same version"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PublishConflictError, match="different release"):
        publish(store, other)


def test_publish_refuses_keep_below_two(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        publish(FileStore(tmp_path), tmp_path, keep=1)


def test_prune_never_removes_current_or_recent_orphans(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    _build(embedder, tmp_path / "r", store)
    version = publish(store, tmp_path / "r").version
    # an upload dated days back (a night run again) but written just now is in progress
    store.put(f"{PROFILE}/releases/20261129T120000Z-inflight/a/x.json", b"{}")
    removed = prune(store, PROFILE, keep=2)
    assert removed == []
    assert store.exists(f"{PROFILE}/releases/20261129T120000Z-inflight/a/x.json")
    removed = prune(store, PROFILE, keep=2, now=datetime.now(UTC) + timedelta(days=2))
    assert removed == ["20261129T120000Z-inflight"]
    assert list_versions(store, PROFILE) == [version]


def test_answer_objects_written_on_processes_make_the_release_one_process_makes(
    embedder,  # type: ignore[no-untyped-def]
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``PROCESS_OBJECTS`` the answer objects go out on processes (``put_files``: each
    opens the store again by its URI, with its own S3 client): every object is written once,
    and the release verifies and loads as when one process writes them."""
    import precompute.publish as publish_module

    monkeypatch.setattr(publish_module, "PROCESS_OBJECTS", 1)
    monkeypatch.setattr(publish_module, "usable_cpus", lambda: 2)
    store = open_store(f"s3://{s3_bucket}/on-processes")
    manifest = _build(embedder, tmp_path / "r1", store)
    report = publish(store, tmp_path / "r1")
    assert report.objects_written == manifest.objects.count > 1
    release = load_checked(store)
    assert release.version == manifest.version
    for row in release.shards[0].rows.to_pylist():
        obj = json.loads(store.get(f"{PROFILE}/{object_path(row['object_sha256'])}"))
        assert obj["answer"] == row["answer"]
