"""A release written once where it is served, and only what changed: answer objects by content,
shared by the releases that hold them, pruned when none does; a refused release never served."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from base.answer_objects import object_path
from base.release import ReleaseError, list_versions, load_release, read_pointer, release_prefix
from base.release_check import check_release
from base.store import Store, sha256_hex
from precompute.prune import REFUSED, prune
from precompute.publish import PublishConflictError, publish, publish_uploaded, upload_release
from tests.releases import PROFILE, QUESTIONS, build, load_checked

NIGHT_1 = datetime(2026, 11, 29, tzinfo=UTC)
NIGHT_2 = NIGHT_1 + timedelta(days=1)


def _objects(store: Store) -> set[str]:
    return {path.rsplit("/", 1)[-1] for path in store.list(f"{PROFILE}/a")}


def _digests(store: Store, version: str) -> dict[str, str]:
    rows = load_release(store, PROFILE, version).shards[0].rows.to_pylist()
    return {r["question"]: r["object_sha256"] for r in rows}


def test_a_night_writes_only_the_answers_that_changed(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    build(embedder, tmp_path / "n1", store, tag="n1", now=NIGHT_1)
    first = upload_release(store, tmp_path / "n1")
    assert (first.objects_written, first.objects_kept) == (len(QUESTIONS), 0)
    v1 = publish(store, tmp_path / "n1").version  # already uploaded: checked and flipped
    changed = QUESTIONS[0]
    build(
        embedder,
        tmp_path / "n2",
        store,
        tag="n2",
        now=NIGHT_2,
        answers={q: f"n1: answer to {q}" for q in QUESTIONS if q != changed},
        dated={q: NIGHT_1 for q in QUESTIONS if q != changed},
    )
    second = upload_release(store, tmp_path / "n2")
    assert (second.objects_written, second.objects_kept) == (1, len(QUESTIONS) - 1)
    v2 = publish(store, tmp_path / "n2").version
    before, after = _digests(store, v1), _digests(store, v2)
    assert [q for q in QUESTIONS if before[q] != after[q]] == [changed]
    # every object of both releases is there and reads back whole; the new one is served
    assert _objects(store) == {f"{d}.json" for d in {*before.values(), *after.values()}}
    assert load_checked(store).version == v2
    # prune keeps what the kept releases hold, and drops the rest once it is a day old
    assert prune(store, PROFILE, keep=2, now=datetime.now(UTC) + timedelta(days=2)) == []
    assert len(_objects(store)) == len(QUESTIONS) + 1


def test_an_object_no_kept_release_holds_is_pruned(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    versions = []
    for night in range(3):
        now = NIGHT_1 + timedelta(days=night)
        build(embedder, tmp_path / f"n{night}", store, tag=f"n{night}", now=now)
        versions.append(publish(store, tmp_path / f"n{night}", keep=2).version)
    first = set(_digests(store, versions[1]).values()) | set(_digests(store, versions[2]).values())
    stray = f"{PROFILE}/{object_path('ab' * 32)}"
    store.put(stray, b"{}")
    # the oldest release is gone; its objects, written just now, wait out the orphan age
    assert list_versions(store, PROFILE) == versions[1:]
    assert len(_objects(store)) == 3 * len(QUESTIONS) + 1
    prune(store, PROFILE, keep=2, now=datetime.now(UTC) + timedelta(days=2))
    assert _objects(store) == {f"{d}.json" for d in first}
    assert load_checked(store).version == versions[2]


def test_a_refused_release_is_never_published_and_is_pruned(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    build(embedder, tmp_path / "n1", store, tag="n1", now=NIGHT_1)
    v1 = publish(store, tmp_path / "n1").version
    manifest = build(embedder, tmp_path / "n2", store, tag="n2", now=NIGHT_2)
    upload_release(store, tmp_path / "n2")
    prefix = release_prefix(PROFILE, manifest.version)
    store.put(f"{prefix}/{REFUSED}", b'{"refused": "a test"}')
    sha = sha256_hex((tmp_path / "n2" / "manifest.json").read_bytes())
    with pytest.raises(PublishConflictError, match="refused"):
        publish_uploaded(store, PROFILE, manifest.version, sha)
    pointer, _ = read_pointer(store, PROFILE)
    assert pointer is not None and pointer.version == v1
    assert prune(store, PROFILE, keep=5) == [manifest.version]
    assert store.list(prefix) == []


def test_a_release_missing_an_object_or_with_a_forged_bucket_is_refused(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    manifest = build(embedder, tmp_path / "n1", store, tag="n1", now=NIGHT_1)
    upload_release(store, tmp_path / "n1")
    sha = sha256_hex((tmp_path / "n1" / "manifest.json").read_bytes())
    prefix = release_prefix(PROFILE, manifest.version)
    check_release(store, PROFILE, manifest.version, sha, readback=None)
    bucket = store.list(f"{prefix}/k")[0]
    original = store.get(bucket)
    forged = json.loads(original)
    forged["entries"] = forged["entries"].replace(forged["entries"][70:74], "0000", 1)
    store.put(bucket, json.dumps(forged).encode())
    with pytest.raises(ReleaseError, match="answers root"):
        check_release(store, PROFILE, manifest.version, sha)
    store.put(bucket, original)
    victim = sorted(store.list(f"{PROFILE}/a"))[0]
    store.delete(victim)
    with pytest.raises(ReleaseError, match="missing"):
        check_release(store, PROFILE, manifest.version, sha)
