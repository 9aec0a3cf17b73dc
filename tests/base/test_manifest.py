"""The typed release documents: a manifest or a pointer is validated once, when it is read, with
errors that name the field; old documents still load; what is read is written back byte for
byte (the pointer and the signatures hash those bytes)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from base.manifest import FormatError, Manifest
from base.pointers import Pointer
from base.release import ReleaseError, read_manifest, read_pointer, release_prefix
from base.store import FileStore
from semantic.matcher import VOTE_K, decision_from_manifest

PROFILE = "p-0123456789"
VERSION = "20261201T020000Z-1a2b3c4d"


def first_format_3_manifest() -> dict[str, Any]:
    """A manifest as the first format-3 builds wrote it: none of the fields added since
    (``excluded_clusters``, ``excluded_rows``, ``revoked``, ``derived``, the threshold's
    ``semantic``, ``held_back_samples``, ``out_of_scope_share``, ``curve``, mining's
    ``carry_half_lives``)."""
    return {
        "format": 3,
        "version": VERSION,
        "profile": {"name": PROFILE, "inputs": {"model": "test"}},
        "embedder": {"name": "embedded", "dim": 384},
        "metric": "inner_product",
        "index": {"factory": "HNSW32,Flat", "ef_construction": 200, "ef_search": 128, "nprobe": 16},
        "threshold": {
            "value": 0.9162,
            "margin": 0.05,
            "agreement": 1.0,
            "vote_k": 10,
            "calibrated": True,
            "target_precision": 0.99,
            "precision": 0.9935,
            "precision_lower_bound": 0.9916,
            "hit_rate": 0.672,
            "recall": 0.6676,
            "samples": 9998,
            "out_of_scope_hit_rate": None,
            "z": 1.645,
            "method": "leave-one-out and leave-label-out on the release's phrasings, Wilson bounds",
        },
        "guard": {"numbers": True, "negations": True, "entities": True},
        "shards": [
            {
                "id": 0,
                "count": 6,
                "index": {"path": "shards/00000.faiss", "bytes": 12345, "sha256": "a" * 64},
                "rows": {"path": "shards/00000.parquet", "bytes": 6789, "sha256": "b" * 64},
            }
        ],
        "objects": {
            "prefix": "a/",
            "count": 6,
            "integrity": "rows.object_sha256",
            "index": "k/",
            "buckets": 6,
            "key_digits": 3,
            "digests": {"path": "objects/digests.parquet", "bytes": 384, "sha256": "e" * 64},
        },
        "counts": {"clusters": 5, "rows": 6},
        "expiry": {"ttl_days": 7, "jitter": 0.2},  # an int stays an int
        "content_sha256": "c" * 64,
        "answers_root": "d" * 64,
        "created_at": "2026-12-01T02:00:00+00:00",
        "parent": None,
        "run_id": "ecbffe2f3d4af3a5",
        "runner": "airflow",
        "log_range": {"since": "2026-11-24", "until": "2026-11-30"},
        "mining": {"k": 5, "top_n": 1000000, "half_life_days": 7.0, "cluster_threshold": 0.9},
    }


def test_an_old_manifest_loads_with_the_defaults_readers_always_gave_it() -> None:
    old = first_format_3_manifest()
    manifest = Manifest.of(old)
    assert manifest.threshold.semantic is False  # exact hits only: never calibrated to serve
    assert manifest.threshold.semantic_off_reason is None
    assert manifest.revoked is None and manifest.derived is None
    assert manifest.excluded_clusters == {} and manifest.excluded_rows == {}
    assert manifest.profile.language == "en"  # made before languages
    assert manifest.mining is not None and manifest.mining.carry_half_lives is None
    assert manifest.embedder.files == [] and manifest.embedder.finetuned is None
    assert [e.path for e in manifest.files] == [
        "shards/00000.faiss",
        "shards/00000.parquet",
        "objects/digests.parquet",
    ]
    # a scale benchmark's threshold names four fields: the decision's defaults fill the rest
    minimal = {"value": 0.9, "margin": 0.05, "semantic": False, "calibrated": False}
    decision = decision_from_manifest(Manifest.of({**old, "threshold": minimal}).threshold)
    assert (decision.threshold, decision.margin, decision.agreement) == (0.9, 0.05, 0.0)
    assert decision.vote_k == VOTE_K


def test_a_manifest_is_written_back_byte_for_byte() -> None:
    old = first_format_3_manifest()
    written = json.dumps(old, indent=2, sort_keys=True).encode()
    assert Manifest.from_json(written).to_json() == written  # nothing added, nothing coerced
    # a field this reader does not know is kept (a derived release copies its parent's)
    noted = {**old, "note": {"by": "someone"}, "threshold": {**old["threshold"], "extra": [1]}}
    assert Manifest.of(noted).as_dict() == noted
    assert Manifest.of(old).expiry.as_dict() == {"ttl_days": 7, "jitter": 0.2}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: m["counts"].update(rows="6"), "counts.rows: Input should be a valid integer"),
        (lambda m: m.pop("answers_root"), "answers_root: Field required"),
        (lambda m: m.update(format=1), "format: format 1 is not 3"),
        (lambda m: m["shards"][0]["rows"].update(sha256="x"), "shards.0.rows: manifest path"),
        (lambda m: m["shards"][0]["index"].update(bytes=True), "shards.0.index.bytes"),
        (lambda m: m["expiry"].update(ttl_days="7"), "expiry.ttl_days: '7' is not a number"),
        (lambda m: m.update(created_at="2026-12-01T02:00:00"), "created_at: "),
        (lambda m: m["guard"].update(typos=True), "guard.typos: Extra inputs are not permitted"),
        (
            lambda m: m["embedder"].update(files=[{"path": "embedder/model.pkl"}]),
            "embedder.files.0",
        ),
        (lambda m: m["shards"].append(m["shards"][0]), "files listed twice"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_field(
    change: Any, named: str, tmp_path: Path
) -> None:
    manifest = copy.deepcopy(first_format_3_manifest())
    change(manifest)
    with pytest.raises(FormatError) as refused:
        Manifest.of(manifest)
    assert named in str(refused.value)
    # through the reader: a ReleaseError naming the release, the file and the field
    store = FileStore(tmp_path / "store")
    store.put(f"{release_prefix(PROFILE, VERSION)}/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(ReleaseError, match=rf"{VERSION}: manifest\.json: .*{named[:12]}"):
        read_manifest(store, PROFILE, VERSION)


def test_a_pointer_is_validated_once_and_written_back_as_read(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    # written before pointers were signed: no sequence, no expiry, no signature
    unsigned = {"version": VERSION, "manifest_sha256": "e" * 64, "published_at": "2026-12-01"}
    store.put(f"{PROFILE}/current.json", json.dumps(unsigned, indent=2).encode())
    pointer, _ = read_pointer(store, PROFILE)
    assert pointer == Pointer.of(unsigned) and pointer.sequence is None and pointer.signed is None
    assert json.dumps(pointer.as_dict(), indent=2).encode() == store.get(f"{PROFILE}/current.json")
    # the order fields are written in is the model's, whatever order they were given in
    rolled = {**unsigned, "rolled_back_from": None, "parent": "v0", "sequence": 3}
    assert list(Pointer.of(rolled).as_dict()) == [
        "version",
        "manifest_sha256",
        "published_at",
        "parent",
        "rolled_back_from",
        "sequence",
    ]
    for bad, named in [
        ({"manifest_sha256": "e" * 64}, "version: Field required"),
        ({**unsigned, "sequence": "3"}, "sequence: Input should be a valid integer"),
        ([unsigned], "Input should be a valid dictionary"),
    ]:
        store.put(f"{PROFILE}/current.json", json.dumps(bad).encode())
        with pytest.raises(ReleaseError, match=rf"current\.json is not a valid pointer: {named}"):
            read_pointer(store, PROFILE)
