"""Reading a release from a store whose writer may be hostile: every manifest path and size is
held to the release layout before anything is fetched, parsed or written out."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import base.manifest as manifest_format
import base.release as release
from base.answer_objects import answer_object_problem
from base.release import (
    ReleaseError,
    load_release,
    pointer_path,
    release_prefix,
)
from base.release_check import check_release
from base.store import FileStore, sha256_hex
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
from precompute.publish import publish
from tests.releases import PROFILE, build


@pytest.fixture()
def published(embedder, tmp_path: Path) -> tuple[FileStore, str]:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "r1", store)
    return store, publish(store, tmp_path / "r1").version


def _forge(store: FileStore, version: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a published manifest and re-point the pointer at it, hashes and all: what anyone
    with write access to the store can do (signing, not hashing, is what stops that)."""
    manifest = json.loads(store.get(f"{release_prefix(PROFILE, version)}/manifest.json"))
    change(manifest)
    data = json.dumps(manifest).encode()
    store.put(f"{release_prefix(PROFILE, version)}/manifest.json", data)
    pointer = json.loads(store.get(pointer_path(PROFILE)))
    pointer["manifest_sha256"] = sha256_hex(data)
    store.put(pointer_path(PROFILE), json.dumps(pointer).encode())


def _add_file(store: FileStore, version: str, path: str, data: bytes) -> None:
    """An extra embedder file in the manifest, its bytes stored where a reader would fetch them."""
    try:
        store.put(f"{release_prefix(PROFILE, version)}/{path}", data)
    except ValueError:  # the store refuses '..' itself; the manifest can still name it
        pass
    entry = {"path": path, "bytes": len(data), "sha256": sha256_hex(data)}
    _forge(
        store, version, lambda m: m.setdefault("embedder", {}).setdefault("files", []).append(entry)
    )


@pytest.mark.parametrize(
    "name", ["absolute", "dotdot", "pickle", "binary", "hidden", "other-folder"]
)
def test_manifest_paths_outside_the_layout_are_refused(
    published: tuple[FileStore, str], tmp_path: Path, name: str
) -> None:
    store, version = published
    escaped = tmp_path / "escaped.txt"
    path = {
        "absolute": str(escaped),
        "dotdot": "embedder/../../../../escaped.txt",
        "pickle": "embedder/model.pkl",
        "binary": "embedder/pytorch_model.bin",
        "hidden": "embedder/.config.json",
        "other-folder": "a/../../escaped.json",
    }[name]
    _add_file(store, version, path, pickle.dumps({"owned": True}))
    with pytest.raises(ReleaseError, match="manifest path"):
        loaded = load_release(store, PROFILE)
        loaded.write_embedder(tmp_path / "embedder")  # what the watcher does next
    assert not escaped.exists()


def test_size_claims_are_capped_before_anything_is_read(
    published: tuple[FileStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, version = published
    real = load_release(store, PROFILE).manifest.shards[0].index.size_bytes
    # a 2 GB claim is refused from the manifest alone
    _forge(store, version, lambda m: m["shards"][0]["index"].update(bytes=2 << 30))
    with pytest.raises(ReleaseError, match="not within"):
        load_release(store, PROFILE)
    # an object larger than its claim is not read past the claim
    _forge(store, version, lambda m: m["shards"][0]["index"].update(bytes=real - 1))
    with pytest.raises(ReleaseError, match="larger than the manifest says"):
        load_release(store, PROFILE)
    _forge(store, version, lambda m: m["shards"][0]["index"].update(bytes=real))
    assert load_release(store, PROFILE).version == version
    # each kind of object has its cap: a shard file over it is refused however it is described
    monkeypatch.setattr(manifest_format, "MAX_SHARD_FILE_BYTES", real - 1)
    with pytest.raises(ReleaseError, match="not within"):
        load_release(store, PROFILE)
    monkeypatch.setattr(release, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(ReleaseError, match=r"manifest\.json is over"):
        load_release(store, PROFILE)
    monkeypatch.setattr(release, "MAX_POINTER_BYTES", 10)
    with pytest.raises(ReleaseError, match=r"current\.json is over"):
        load_release(store, PROFILE)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(shards={"not": "a list"}),
        lambda m: m.update(embedder=["not", "an", "object"]),
        lambda m: m["shards"][0].pop("count"),
        lambda m: m["shards"][0].update(index="shards/00000.faiss"),
        lambda m: m["shards"][0]["rows"].update(sha256="not-a-digest"),
    ],
    ids=["shards-not-list", "embedder-not-object", "no-count", "entry-not-object", "bad-digest"],
)
def test_malformed_manifests_are_refused_with_a_release_error(
    published: tuple[FileStore, str], change: Callable[[dict[str, Any]], None]
) -> None:
    store, version = published
    _forge(store, version, change)
    with pytest.raises(ReleaseError):
        load_release(store, PROFILE)


def test_a_pointer_naming_a_path_is_refused(published: tuple[FileStore, str]) -> None:
    store, _ = published
    pointer = {"version": "../../elsewhere", "manifest_sha256": "0" * 64}
    store.put(pointer_path(PROFILE), json.dumps(pointer).encode())
    with pytest.raises(ReleaseError, match="not a plain name"):
        load_release(store, PROFILE)


def test_a_pointer_without_the_manifest_hash_is_refused(published: tuple[FileStore, str]) -> None:
    store, version = published
    store.put(pointer_path(PROFILE), json.dumps({"version": version}).encode())
    with pytest.raises(ReleaseError, match="names no manifest_sha256"):
        load_release(store, PROFILE)
    assert load_release(store, PROFILE, version).version == version  # asked for by name: fine


def test_the_edge_refuses_a_forged_release_and_keeps_serving_the_old_one(
    embedder,  # type: ignore[no-untyped-def]
    published: tuple[FileStore, str],
    tmp_path: Path,
) -> None:
    store, old = published
    watcher = ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    assert watcher.refresh() and watcher.index is not None
    build(embedder, tmp_path / "r2", store, tag="v2", now=datetime(2026, 11, 30, tzinfo=UTC))
    new = publish(store, tmp_path / "r2").version
    assert new != old
    escaped = tmp_path / "escaped.txt"
    _add_file(store, new, str(escaped), b"owned")
    assert watcher.refresh() is False
    assert watcher.index.version == old and not escaped.exists()
    assert load_release(store, PROFILE, old).version == old  # the old release is untouched


def test_a_shard_index_that_does_not_parse_is_refused_loaded_or_checked(
    published: tuple[FileStore, str],
) -> None:
    """An index whose bytes match the manifest but are no FAISS index (a builder's bug): the
    edge's load and the publisher's check (lists mapped, not read) both refuse it by name, and
    a good one checks with its rows counted."""
    store, version = published
    pointer = json.loads(store.get(pointer_path(PROFILE)))
    manifest = check_release(store, PROFILE, version, pointer["manifest_sha256"])
    assert sum(shard.count for shard in manifest.shards) > 0
    garbage = b"not a faiss index" * 64
    store.put(f"{release_prefix(PROFILE, version)}/shards/00000.faiss", garbage)

    def forged(m: dict[str, Any]) -> None:
        m["shards"][0]["index"].update(bytes=len(garbage), sha256=sha256_hex(garbage))

    _forge(store, version, forged)
    sha = json.loads(store.get(pointer_path(PROFILE)))["manifest_sha256"]
    with pytest.raises(ReleaseError, match=r"shard 0 does not parse"):
        load_release(store, PROFILE)
    with pytest.raises(ReleaseError, match=r"shard 0 does not parse"):
        check_release(store, PROFILE, version, sha)


def test_answer_objects_are_shown_only_when_asked_for_and_fresh() -> None:
    path = Path(__file__).parents[1] / "vectors" / "answer_objects.json"
    vectors = json.loads(path.read_text())
    assert len(vectors["cases"]) > 20
    for case in vectors["cases"]:
        data = bytes.fromhex(case["hex"]) if "hex" in case else case["text"].encode()
        problem = answer_object_problem(
            data, vectors["key"], vectors["profile"], case["sha256"], vectors["now_s"]
        )
        assert problem == case["problem"], case["name"]


def test_a_signed_release_is_served_only_with_a_trusted_signature(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    from base.config import ConfigError, EdgeSettings
    from base.pointers import verify_pointer
    from base.signing import LocalSigner, generate_keypair
    from precompute.config import PrecomputeSettings

    (ours, our_key), (_, their_key) = generate_keypair(), generate_keypair()
    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "r1", store)
    version = publish(store, tmp_path / "r1", signer=LocalSigner(ours)).version
    # the pointer carries a signed statement, for browsers (which read nothing else of it)
    signed = verify_pointer(json.loads(store.get(pointer_path(PROFILE))), PROFILE, (our_key,))
    manifest = json.loads(store.get(f"{release_prefix(PROFILE, version)}/manifest.json"))
    assert (signed.profile, signed.version) == (PROFILE, version)
    assert signed.answers_root == manifest["answers_root"] and signed.sequence > 0
    assert load_release(store, PROFILE, public_keys=(our_key,)).version == version
    assert load_release(store, PROFILE, public_keys=(their_key, our_key)).version == version
    with pytest.raises(ReleaseError, match="trusted key"):
        load_release(store, PROFILE, public_keys=(their_key,))
    # whoever can write the store re-hashes a changed manifest and re-points the pointer: the hash
    # chain holds, the signature does not
    _forge(store, version, lambda m: m.update(note="an attacker's release"))
    assert load_release(store, PROFILE).version == version  # without keys: served
    with pytest.raises(ReleaseError, match="another manifest_sha256"):
        load_release(store, PROFILE, public_keys=(our_key,))
    watcher = ReleaseWatcher(
        store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS, public_keys=(our_key,)
    )
    assert watcher.refresh() is False and watcher.health()["reason"] == "refused"
    # an unsigned release, or a signature swapped in from elsewhere, is refused too
    build(embedder, tmp_path / "r2", store, tag="v2", now=datetime(2026, 11, 30, tzinfo=UTC))
    unsigned = publish(store, tmp_path / "r2").version
    with pytest.raises(ReleaseError, match="unsigned"):
        load_release(store, PROFILE, public_keys=(our_key,))
    store.put(f"{release_prefix(PROFILE, unsigned)}/manifest.sig", b'{"alg": "ed25519"}')
    with pytest.raises(ReleaseError, match="malformed"):
        load_release(store, PROFILE, public_keys=(our_key,))
    first = store.get(f"{release_prefix(PROFILE, version)}/manifest.sig")
    store.put(f"{release_prefix(PROFILE, unsigned)}/manifest.sig", first)
    with pytest.raises(ReleaseError, match="another version"):
        load_release(store, PROFILE, public_keys=(our_key,))
    # keys are checked where they are read
    with pytest.raises(ConfigError, match="EDGEQA_RELEASE_PUBLIC_KEYS"):
        EdgeSettings.from_env({"EDGEQA_RELEASE_PUBLIC_KEYS": f"{our_key},not-a-key"})
    with pytest.raises(ConfigError, match="EDGEQA_SIGNING_KEY"):
        PrecomputeSettings.from_env({"EDGEQA_SIGNING_KEY": "c2hvcnQ="})


def test_a_release_is_its_own_profile_s_and_lists_each_file_once(
    published: tuple[FileStore, str],
) -> None:
    store, version = published
    # a (signed) release copied under another profile is still not that profile's
    for path in store.list(release_prefix(PROFILE, version)):
        store.put(path.replace(PROFILE, "other", 1), store.get(path))
    store.put(pointer_path("other"), store.get(pointer_path(PROFILE)))
    with pytest.raises(ReleaseError, match="another profile"):
        load_release(store, "other")
    # the same 1 GiB file listed many times would pass every per-file check
    _forge(store, version, lambda m: m["shards"].extend([m["shards"][0]] * 3))
    with pytest.raises(ReleaseError, match="listed twice"):
        load_release(store, PROFILE)
    # a manifest nested past the parser's depth is refused, not retried forever
    store.put(f"{release_prefix(PROFILE, version)}/manifest.json", b"[" * 100_000)
    with pytest.raises(ReleaseError, match=r"manifest\.json"):
        load_release(store, PROFILE, version)
