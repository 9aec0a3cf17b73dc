"""Revocations: recorded with an audit trail, published as a derived release without the revoked
cluster, honoured by the origin's online cache and by every later nightly build."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from base.answer_objects import bucket_entry
from base.keys import key
from base.pointers import signed_root
from base.release import load_release, read_pointer, release_prefix
from base.signing import LocalSigner, generate_keypair
from base.store import FileStore, Store
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
from origin.server.cache import OnlineCache
from origin.server.tiers import revoke_cached, scoped_key
from precompute.config import PrecomputeSettings
from precompute.publish import publish
from precompute.revocations import (
    RevocationError,
    in_force,
    list_floor,
    nightly_revocations,
    read_revocations,
    record_revocation,
    revocations_path,
    revoke,
    unrevoke,
)
from precompute.workarea import WorkArea
from tests.releases import PROFILE, QUESTIONS, build, load_checked

PARAPHRASE = "How can I freeze my card?"


def _published(embedder: Any, store: Store, tmp: Path, signer: Any = None) -> str:
    # the first question asked in two phrasings: one cluster of two
    build(embedder, tmp / "r1", store, questions=(*QUESTIONS, PARAPHRASE))
    return publish(store, tmp / "r1", signer=signer).version


def test_revoke_records_then_publishes_a_release_without_the_cluster(
    embedder,  # type: ignore[no-untyped-def]
    store: Store,
    tmp_path: Path,
) -> None:
    private, public = generate_keypair()
    first = _published(embedder, store, tmp_path, LocalSigner(private))
    before = load_release(store, PROFILE)
    rows = {r["key"]: r for s in before.shards for r in s.rows.to_pylist()}
    cluster = rows[key(QUESTIONS[0])]["cluster"]
    assert rows[key(PARAPHRASE)]["cluster"] == cluster  # the paraphrase is the same answer

    done = revoke(
        store,
        PROFILE,
        "wrong fee amount",
        "alice",
        question=PARAPHRASE,
        signer=LocalSigner(private),
        public_keys=(public,),
    )
    assert done["cluster"] == cluster and done["phrasings"] == 2 and done["parent"] == first
    pointer, _ = read_pointer(store, PROFILE)
    assert pointer is not None and pointer.version == done["version"] != first
    assert signed_root(pointer, PROFILE, (public,)) is not None  # signed like a nightly release

    after = load_checked(store, public_keys=(public,))
    kept = {r["key"]: r for s in after.shards for r in s.rows.to_pylist()}
    assert set(kept) == set(rows) - {key(QUESTIONS[0]), key(PARAPHRASE)}
    assert all(kept[k]["answer"] == rows[k]["answer"] for k in kept)  # nothing regenerated
    prefix = release_prefix(PROFILE, after.version)
    bucket = f"{prefix}/k/{key(QUESTIONS[0])[:3]}.json"  # the CDN's key index names it no more
    assert (
        not store.exists(bucket)
        or bucket_entry(json.loads(store.get(bucket)), key(QUESTIONS[0])) is None
    )
    revoked, derived = after.manifest.revoked, after.manifest.derived
    assert revoked is not None and revoked.keys == sorted([key(QUESTIONS[0]), key(PARAPHRASE)])
    assert derived is not None and derived.from_version == first
    assert after.manifest.excluded_clusters["revoked"] == 1

    # the edge no longer has it, by either tier
    watcher = ReleaseWatcher(store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS)
    assert watcher.refresh() and watcher.index is not None
    for asked in (QUESTIONS[0], PARAPHRASE, "how do i freeze my card"):
        assert watcher.index.explain(asked).outcome.hit is False, asked
    assert watcher.index.explain(QUESTIONS[1]).outcome.hit is True

    # recorded, with who, when and why; revoking again widens the same entry
    document, _ = read_revocations(store, PROFILE)
    (entry,) = document["revoked"]
    assert (entry["id"], entry["by"], entry["reason"]) == (done["id"], "alice", "wrong fee amount")
    assert document["audit"][0]["action"] == "revoke"


def test_revocation_errors_and_unrevoke(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = FileStore(tmp_path / "store")
    _published(embedder, store, tmp_path)
    with pytest.raises(RevocationError, match="no phrasing"):
        revoke(store, PROFILE, "why", "bob", question="Never asked by anyone?")
    with pytest.raises(RevocationError, match="reason"):
        revoke(store, PROFILE, "  ", "bob", question=QUESTIONS[1])
    with pytest.raises(RevocationError, match="exactly one"):
        revoke(store, PROFILE, "why", "bob", question=QUESTIONS[1], key=key(QUESTIONS[1]))
    done = revoke(store, PROFILE, "outdated", "bob", key=key(QUESTIONS[1]))
    again = record_revocation(
        store, PROFILE, done["cluster"], [key(QUESTIONS[1])], QUESTIONS[1], "again", "carol", "t"
    )
    assert again == done["id"] and len(in_force(store, PROFILE).ids) == 1
    with pytest.raises(RevocationError, match="no revocation"):
        unrevoke(store, PROFILE, "oops", "bob", entry="r-000000000000")
    assert unrevoke(store, PROFILE, "fixed upstream", "bob", key=key(QUESTIONS[1])) == {
        "ended": [done["id"]]
    }
    document, _ = read_revocations(store, PROFILE)
    assert document["revoked"] == []
    assert [a["action"] for a in document["audit"]] == ["revoke", "revoke", "unrevoke"]
    # a corrupt list is an error naming the file, never a silent "nothing revoked"
    store.put(f"{PROFILE}/revocations.json", b'{"revoked": 3}')
    with pytest.raises(RevocationError, match=r"revocations\.json"):
        in_force(store, PROFILE)


def test_the_signed_revocation_list_cannot_be_edited_dropped_or_rolled_back(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    private, public = generate_keypair()
    signer, keys = LocalSigner(private), (public,)
    store = FileStore(tmp_path / "store")
    _published(embedder, store, tmp_path, signer)
    first = revoke(
        store, PROFILE, "wrong", "alice", question=QUESTIONS[1], signer=signer, public_keys=keys
    )
    floor = list_floor(load_release(store, PROFILE, public_keys=keys).manifest)
    listed = in_force(store, PROFILE, keys, floor)
    assert floor > 0 and listed.sequence == floor and listed.ids == [first["id"]]
    nightly = PrecomputeSettings.from_env(
        {"EDGEQA_SIGNING_KEY": private, "EDGEQA_RELEASE_PUBLIC_KEYS": public}
    )
    assert nightly_revocations(store, PROFILE, nightly) == listed
    path = revocations_path(PROFILE)
    signed_list = store.get(path)
    document = json.loads(signed_list)

    def refused(changed: bytes | None, match: str, at: int = floor) -> None:
        if changed is None:
            store.delete(path)
        else:
            store.put(path, changed)
        with pytest.raises(RevocationError, match=match):
            in_force(store, PROFILE, keys, at)
        with pytest.raises(RevocationError, match=match):
            nightly_revocations(store, PROFILE, nightly)

    # whoever can write the store drops the entry, or the signature, or the whole list
    refused(json.dumps({**document, "revoked": []}).encode(), "changed after it was signed")
    unsigned = {k: v for k, v in document.items() if k != "signed"}
    refused(json.dumps(unsigned).encode(), "is unsigned")
    refused(json.dumps({**unsigned, "revoked": []}).encode(), "is unsigned")
    refused(None, "is missing")
    # ... or puts the first list back after a second revocation
    store.put(path, signed_list)
    revoke(store, PROFILE, "also", "alice", question=QUESTIONS[2], signer=signer, public_keys=keys)
    later = list_floor(load_release(store, PROFILE, public_keys=keys).manifest)
    assert later > floor
    refused(signed_list, "refused as a rollback", later)
    # readers check the list: writing it needs the signing key
    with pytest.raises(RevocationError, match="EDGEQA_SIGNING_KEY"):
        unrevoke(store, PROFILE, "fixed", "bob", cluster=first["cluster"], public_keys=keys)


def test_the_origin_cache_drops_revoked_questions_and_never_caches_them_again(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    _published(embedder, store, tmp_path)
    cache = OnlineCache(ttl_s=3600)
    revoked, other = key(QUESTIONS[0]), key(QUESTIONS[1])
    for tenant in ("", "acme"):
        for k in (revoked, other):
            assert cache.put(scoped_key(k, "key-1", tenant), "an answer", 3)
    revoke(store, PROFILE, "wrong", "alice", question=QUESTIONS[0])
    watcher = ReleaseWatcher(store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS)
    assert watcher.refresh() and watcher.index is not None
    assert revoke_cached(cache, watcher.index.revoked) == 2  # in every tenant's scope
    assert cache.get(scoped_key(revoked, "key-1", "acme")) is None
    assert cache.get(scoped_key(other, "key-1", "acme")) is not None
    assert not cache.put(scoped_key(revoked, "key-2", ""), "generated again", 3)
    assert watcher.index.manifest.revoked and watcher.index.manifest.revoked.keys


def test_nightly_mining_leaves_revoked_clusters_out(embedded_model: Any, tmp_path: Path) -> None:
    from datetime import date

    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams, mine_stage
    from precompute.samplelogs import generate_rows, write_logs

    until = date(2026, 11, 28)
    logs, out = FileStore(tmp_path / "logs"), FileStore(tmp_path / "out")
    write_logs(logs, generate_rows(until, intents=4, users=60, asks=300, tail_questions=0))
    params = RunParams(
        logs.uri,
        out.uri,
        until,
        until,
        PipelineConfig.from_env({}),
        started=datetime(2026, 11, 29, tzinfo=UTC),
    )
    first = mine_stage(params, model=embedded_model)
    hot = list(WorkArea(out, first.profile, first.run).hot())
    assert len(hot) >= 2 and "revoked" not in first.excluded_rows
    canonical = hot[0].key  # a cluster's id is its canonical phrasing's key
    record_revocation(out, first.profile, canonical, [canonical], "q", "r", "ops", "t")
    second = mine_stage(params, model=embedded_model)
    remaining = list(WorkArea(out, second.profile, second.run).hot())
    assert [h.key for h in remaining] == [h.key for h in hot[1:]]
    assert second.excluded_rows["revoked"] == hot[0].hits


def test_a_revoked_wording_gets_no_semantic_hit_in_its_place(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from edge_index.lookup import Hit, Miss, ReleaseIndex

    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "r1", store)  # without PARAPHRASE: it is a semantic neighbour
    publish(store, tmp_path / "r1")
    index = ReleaseIndex(load_release(store, PROFILE), embedder)
    hit = index.lookup_semantic(PARAPHRASE)
    assert isinstance(hit, Hit) and hit.question == QUESTIONS[0]
    # the paraphrase's own key revoked (as a release listing it does): the neighbour's answer is
    # not served in its place, while the neighbour itself still is
    index.revoke(frozenset({key(PARAPHRASE)}))
    refused = index.lookup_semantic(PARAPHRASE)
    assert isinstance(refused, Miss) and refused.reason == "revoked"
    assert isinstance(index.lookup_semantic(QUESTIONS[0]), Hit)
