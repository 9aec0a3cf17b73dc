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
from base.store import FileStore, Store, sha256_hex
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


def test_only_a_release_checked_where_it_is_is_published(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    """``publish_uploaded`` asks for the validate stage's ``checked.json`` naming this manifest:
    an upload nobody checked is never pointed to; once checked, it is."""
    from precompute.prune import mark_checked

    manifest = build(embedder, tmp_path / "n1", store, tag="n1", now=NIGHT_1)
    upload_release(store, tmp_path / "n1")
    sha = sha256_hex((tmp_path / "n1" / "manifest.json").read_bytes())
    with pytest.raises(PublishConflictError, match="validate it first"):
        publish_uploaded(store, PROFILE, manifest.version, sha)
    assert read_pointer(store, PROFILE)[0] is None
    mark_checked(store, PROFILE, manifest.version, "0" * 64)  # another manifest's check
    with pytest.raises(PublishConflictError, match="validate it first"):
        publish_uploaded(store, PROFILE, manifest.version, sha)
    check_release(store, PROFILE, manifest.version, sha)
    mark_checked(store, PROFILE, manifest.version, sha)
    assert publish_uploaded(store, PROFILE, manifest.version, sha).version == manifest.version


def test_a_digests_file_that_names_other_objects_is_refused(  # type: ignore[no-untyped-def]
    embedder, store: Store, tmp_path: Path
) -> None:
    """Prune keeps what the digests files name: one that does not name the rows' objects (the
    right count, sorted, signed into the manifest all the same) is refused by the check."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from base.manifest import Manifest

    staging = tmp_path / "n1"
    manifest = build(embedder, staging, store, tag="n1", now=NIGHT_1)
    digests = staging / "objects" / "digests.parquet"
    column = pq.read_table(digests).column("sha256").to_pylist()
    column[0] = bytes(32)  # sorts first still, and is no row's object
    pq.write_table(pa.table({"sha256": pa.array(sorted(column), pa.binary(32))}), digests)
    data = json.loads((staging / "manifest.json").read_bytes())
    data["objects"]["digests"].update(
        bytes=digests.stat().st_size, sha256=sha256_hex(digests.read_bytes())
    )
    forged = Manifest.of(data).to_json()
    (staging / "manifest.json").write_bytes(forged)
    upload_release(store, staging)
    with pytest.raises(ReleaseError, match="does not name the rows' objects"):
        check_release(store, PROFILE, manifest.version, sha256_hex(forged))


def test_a_format_2_release_is_still_read_and_built_on(tmp_path: Path) -> None:
    """The release current when a deployment moves to format 3 is format 2: its manifest still
    reads (readers serve it, a night builds on it), while a format-3 one must name its index."""
    from base.manifest import FormatError, Manifest
    from tests.base.test_manifest import first_format_3_manifest

    old = first_format_3_manifest()
    old["format"] = 2
    old["objects"] = {"prefix": "a/", "count": 6, "integrity": "rows.object_sha256"}
    manifest = Manifest.of(old)
    assert manifest.objects.digests is None and [e.path for e in manifest.files] == [
        "shards/00000.faiss",
        "shards/00000.parquet",
    ]
    with pytest.raises(FormatError, match="names its key index"):
        Manifest.of({**old, "format": 3})


def test_a_browser_s_path_checks_the_objects_of_both_nights(  # type: ignore[no-untyped-def]
    embedder, tmp_path: Path
) -> None:
    """Through the demo's CDN (what CloudFront may read), as the clients read it: the signed
    pointer, the key's bucket (proved to the signed root), the object it names (its digest).
    Night 2 shares night 1's unchanged objects (the same URL) and names a new one for the
    changed answer; an expired answer and a revoked one are refused on both nights."""
    from starlette.testclient import TestClient

    from base.answer_objects import answer_object_problem, bucket_entry, bucket_path, bucket_problem
    from base.keys import key
    from base.pointers import signed_root
    from base.signing import LocalSigner, generate_keypair
    from edgeqa.demo import cdn_app
    from precompute.revocations import revoke

    store = FileStore(tmp_path / "store")
    private, public = generate_keypair()
    signer = LocalSigner(private)
    stale = QUESTIONS[3]  # generated a year back with a 7-day TTL: long expired
    long_ago = NIGHT_1 - timedelta(days=365)
    build(
        embedder, tmp_path / "n1", store, tag="n1", now=NIGHT_1, ttl_days=7.0,
        dated={stale: long_ago},
    )  # fmt: skip
    publish(store, tmp_path / "n1", signer=signer)
    changed = QUESTIONS[0]
    build(
        embedder, tmp_path / "n2", store, tag="n2", now=NIGHT_2, ttl_days=7.0,
        answers={q: f"n1: answer to {q}" for q in QUESTIONS if q != changed},
        dated={**{q: NIGHT_1 for q in QUESTIONS if q != changed}, stale: long_ago},
    )  # fmt: skip
    cdn = TestClient(cdn_app(store.root))
    now_s = (NIGHT_2 + timedelta(hours=1)).timestamp()

    def ask(question: str) -> tuple[str | None, str]:
        """(the answer shown, the object's URL or why nothing was shown)."""
        pointer = cdn.get(f"/{PROFILE}/current.json").json()
        root = signed_root(pointer, PROFILE, (public,))
        assert root is not None
        version, k = pointer["version"], key(question)
        found = cdn.get(f"/{PROFILE}/releases/{version}/{bucket_path(k[:3])}")
        if found.status_code == 404:
            return None, "no bucket"
        bucket = found.json()
        assert bucket_problem(bucket, k[:3], PROFILE, version, root) is None
        digest = bucket_entry(bucket, k)
        if digest is None:
            return None, "not listed"
        url = f"/{PROFILE}/{object_path(digest)}"
        data = cdn.get(url).content
        problem = answer_object_problem(data, k, PROFILE, digest, now_s)
        return (json.loads(data)["answer"], url) if problem is None else (None, problem)

    first = {q: ask(q) for q in QUESTIONS}
    publish(store, tmp_path / "n2", signer=signer)
    second = {q: ask(q) for q in QUESTIONS}
    for night in (first, second):
        assert night[stale] == (None, "expired")
    assert first[changed][0] == f"n1: answer to {changed}"
    assert (
        second[changed][0] == f"n2: answer to {changed}" and second[changed][1] != first[changed][1]
    )
    for question in QUESTIONS[1:3]:  # unchanged: the same object, at the same URL
        assert (
            second[question] == first[question] == (f"n1: answer to {question}", first[question][1])
        )
    # a revocation (a release derived from night 2 without it) is refused at once, as it would
    # be on night 1's: its key is in no bucket of the release the pointer names
    revoke(store, PROFILE, "wrong", "alice", question=QUESTIONS[1], signer=signer,
           public_keys=(public,))  # fmt: skip
    assert ask(QUESTIONS[1])[0] is None and ask(QUESTIONS[2]) == second[QUESTIONS[2]]
