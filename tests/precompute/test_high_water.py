"""The high-water mark (``base/highwater.py``): a bucket writer who puts back an older signed
pointer and the revocation list from before a revocation cannot bring the revoked answer back,
neither through an edge started fresh nor through the next night, which would sign it anew."""

from __future__ import annotations

import json
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from base.config import EdgeSettings
from base.highwater import HighWaterError, Marks, open_high_water, parse_high_water
from base.pointers import POINTER_FORMAT, new_pointer, verify_pointer
from base.release import pointer_path, read_pointer
from base.signing import LocalSigner, generate_keypair, sign_statement, statement
from base.store import FileStore
from edge_index.releases import Releases
from edge_index.server.app import create_app
from edge_index.watcher import EDGE_METRICS
from precompute.config import PipelineConfig
from precompute.publish import publish
from precompute.releases import renew, rollback
from precompute.revocations import (
    RevocationError,
    nightly_revocations,
    revocations_path,
    revoke,
    unrevoke,
)
from tests.releases import QUESTIONS, build

PARAPHRASE = "How can I freeze my card?"
UNTIL = date(2026, 11, 28)


def _edge(store: FileStore, profile: str, env: dict[str, str], cache: Path, embedder: Any) -> Any:
    """An edge service started fresh (``cache``: its pointer memory), its first poll done."""
    settings = EdgeSettings.from_env({**env, "EDGEQA_CACHE_DIR": str(cache)})
    releases = Releases.from_settings(settings, EDGE_METRICS, {"embedded": embedder}, store)
    releases.primary.refresh()
    return TestClient(create_app(releases))


def _served(client: Any, question: str) -> bool:
    return bool(client.get("/v1/lookup", params={"q": question}).status_code == 200)


def test_a_bucket_writers_rollback_undoes_no_revocation(
    embedder: Any, embedded_model: Any, tmp_path: Path
) -> None:
    from precompute.fleet.llm import run_profile
    from precompute.pipeline import RunParams, mine_stage
    from precompute.samplelogs import generate_rows, write_logs

    private, public = generate_keypair()
    signer, keys = LocalSigner(private), (public,)
    store, logs = FileStore(tmp_path / "store"), FileStore(tmp_path / "logs")
    marks = tmp_path / "signer-only" / "high-water.json"  # outside the store
    env = {
        "EDGEQA_STORE": store.uri,
        "EDGEQA_LANGUAGES": "en",
        "EDGEQA_SIGNING_KEY": private,
        "EDGEQA_RELEASE_PUBLIC_KEYS": public,
        "EDGEQA_HIGH_WATER_URI": marks.as_uri(),
    }
    config = PipelineConfig.from_env(env)
    profile = run_profile(config.settings, config.generation.quantization, embedded_model, "en")
    env["EDGEQA_PROFILE"] = name = profile.name
    high_water = config.settings.high_water()
    assert high_water is not None

    # v1 published; a question revoked: v2 published without it, both marks raised
    build(embedder, tmp_path / "r1", store, questions=(*QUESTIONS, PARAPHRASE), profile=name)
    v1 = publish(store, tmp_path / "r1", signer=signer, public_keys=keys, high_water=high_water)
    v1_pointer = store.get(pointer_path(name))
    v1_sequence = verify_pointer(read_pointer(store, name)[0], name, keys).sequence
    done = revoke(
        store, name, "wrong", "alice", question=QUESTIONS[1], signer=signer, public_keys=keys,
        high_water=high_water,
    )  # fmt: skip
    v2_pointer = read_pointer(store, name)[0]
    mark = high_water.read(name)
    assert mark.pointer == verify_pointer(v2_pointer, name, keys).sequence > v1_sequence
    assert mark.revocations == json.loads(store.get(revocations_path(name)))["sequence"] > 0
    fresh = _edge(store, name, env, tmp_path / "edge-0", embedder)
    assert not _served(fresh, QUESTIONS[1]) and _served(fresh, QUESTIONS[0])

    # a bucket writer puts back v1's signed pointer and the list from before (there was none)
    store.put(pointer_path(name), v1_pointer)
    store.delete(revocations_path(name))

    # (a) an edge started with an empty cache folder serves nothing, and says why
    edge = _edge(store, name, env, tmp_path / "edge-1", embedder)
    ready = edge.get("/ready")
    assert ready.status_code == 503 and ready.json()["reason"] == "rollback"
    assert f"sequence {v1_sequence}" in ready.json()["error"]
    assert f"high-water mark {mark.pointer}" in ready.json()["error"]
    assert not _served(edge, QUESTIONS[1]) and not _served(edge, QUESTIONS[0])
    # (without the mark, the same fresh edge serves the revoked answer: what the mark changes)
    unmarked = {k: v for k, v in env.items() if k != "EDGEQA_HIGH_WATER_URI"}
    assert _served(_edge(store, name, unmarked, tmp_path / "edge-2", embedder), QUESTIONS[1])

    # (b) the next night refuses to run; renew, revoke and unrevoke refuse too: nothing signed
    write_logs(logs, generate_rows(UNTIL, intents=4, users=60, asks=300, tail_questions=0))
    started = datetime(2026, 11, 29, tzinfo=UTC)
    params = RunParams(logs.uri, store.uri, UNTIL, UNTIL, config, started=started)
    both = rf"sequence {v1_sequence}, below the high-water mark {mark.pointer}"
    with pytest.raises(HighWaterError, match=both):
        mine_stage(params, model=embedded_model)
    with pytest.raises(HighWaterError, match=both):
        renew(store, name, signer, keys, high_water=high_water)
    with pytest.raises(HighWaterError, match=both):
        revoke(
            store, name, "again", "bob", question=QUESTIONS[2], signer=signer, public_keys=keys,
            high_water=high_water,
        )  # fmt: skip
    settings = config.settings
    with pytest.raises(RevocationError, match=f"sequence {mark.revocations}"):
        nightly_revocations(store, name, settings)  # the list, even on v1's floor of 0
    with pytest.raises(RevocationError, match=f"sequence {mark.revocations}"):
        unrevoke(
            store, name, "x", "bob", cluster="c", signer=signer, public_keys=keys,
            high_water=high_water,
        )  # fmt: skip
    assert store.get(pointer_path(name)) == v1_pointer
    assert not store.exists(revocations_path(name))
    assert high_water.read(name) == mark

    # (c) an edge started fresh after it still serves nothing
    later = _edge(store, name, env, tmp_path / "edge-3", embedder)
    assert later.get("/ready").status_code == 503 and not _served(later, QUESTIONS[1])

    # the same with v1's pointer put back unsigned: refused as not verifying, by both
    unsigned = {k: v for k, v in json.loads(v1_pointer).items() if k != "signed"}
    store.put(pointer_path(name), json.dumps(unsigned).encode())
    with pytest.raises(HighWaterError, match=rf"does not verify.*mark {mark.pointer}"):
        mine_stage(params, model=embedded_model)
    unsigned_edge = _edge(store, name, env, tmp_path / "edge-4", embedder)
    assert unsigned_edge.get("/ready").status_code == 503
    assert not _served(unsigned_edge, QUESTIONS[1])

    # the operator who holds the key puts it right: a rollback to v2 is signed above the mark
    rolled = rollback(store, name, done["version"], keys, signer, high_water=high_water)
    assert rolled["status"] == "rolled_back" and rolled["sequence"] > mark.pointer
    assert high_water.read(name).pointer == rolled["sequence"]
    recovered = _edge(store, name, env, tmp_path / "edge-5", embedder)
    assert _served(recovered, QUESTIONS[0]) and not _served(recovered, QUESTIONS[1])
    assert v1.version != done["version"]


def test_a_fresh_reader_with_a_mark_refuses_a_legacy_or_expired_pointer(
    embedder: Any, tmp_path: Path
) -> None:
    private, public = generate_keypair()
    signer, keys = LocalSigner(private), (public,)
    store = FileStore(tmp_path / "store")
    marks = tmp_path / "marks.json"
    env = {
        "EDGEQA_STORE": store.uri,
        "EDGEQA_LANGUAGES": "en",
        "EDGEQA_PROFILE": "test-profile",
        "EDGEQA_RELEASE_PUBLIC_KEYS": public,
        "EDGEQA_HIGH_WATER_URI": marks.as_uri(),
    }
    unmarked = {k: v for k, v in env.items() if k != "EDGEQA_HIGH_WATER_URI"}
    build(embedder, tmp_path / "r1", store)
    publish(store, tmp_path / "r1", signer=signer)
    pointer, _ = read_pointer(store, "test-profile")
    assert pointer is not None
    signed = verify_pointer(pointer, "test-profile", keys)
    # the same release, its pointer signed an hour ago and fresh for a minute
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    expired = new_pointer(
        signer, "test-profile", signed.version, signed.manifest_sha256, signed.answers_root,
        signed.sequence, expires_s=60, now=hour_ago,
    )  # fmt: skip
    store.put(pointer_path("test-profile"), json.dumps(expired.as_dict()).encode())

    def ready(environ: dict[str, str], folder: str) -> int:
        edge = _edge(store, "test-profile", environ, tmp_path / folder, embedder)
        return int(edge.get("/ready").status_code)

    # an expired pointer: a fresh reader with a mark serves nothing; one without serves it stale
    assert ready(env, "a") == 503 and ready(unmarked, "b") == 200
    # a pointer carrying the release's own statement (signed before sequences: read as 0)
    legacy = pointer.as_dict()
    text = statement("test-profile", signed.version, signed.manifest_sha256, signed.answers_root)
    legacy["signed"] = json.loads(sign_statement(text, signer))
    store.put(pointer_path("test-profile"), json.dumps(legacy).encode())
    assert (
        verify_pointer(read_pointer(store, "test-profile")[0], "test-profile", keys).sequence == 0
    )
    assert ready(env, "c") == 503 and ready(unmarked, "d") == 200
    assert POINTER_FORMAT not in json.dumps(legacy["signed"])


def test_the_file_mark_only_rises_and_a_damaged_one_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "signer" / "marks.json"
    mark = open_high_water(path.as_uri())
    assert mark is not None and mark.read("en") == Marks()
    mark.raise_to("en", "pointer", 5)
    mark.raise_to("en", "pointer", 3)  # never lowered
    mark.raise_to("en", "revocations", 2)
    mark.raise_to("zh", "pointer", 9)
    assert mark.read("en") == Marks(pointer=5, revocations=2)
    threads = [
        threading.Thread(target=mark.raise_to, args=("en", "pointer", n)) for n in range(6, 30)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mark.read("en").pointer == 29 and mark.read("zh") == Marks(pointer=9)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    for damaged in (b"{", b"[]", b'{"en": {"pointer": -1}}', b'{"en": {"pointer": "7"}}'):
        path.write_bytes(damaged)
        with pytest.raises(HighWaterError):
            mark.read("en")
    with pytest.raises(ValueError, match="not a sequence"):
        mark.raise_to("en", "pointer", 0)
    for uri in (
        "s3://bucket/x",
        "file://relative/x.json",
        "file:///dir/",
        "ssm://",
        "dynamodb://a/b",
    ):
        with pytest.raises(ValueError):
            parse_high_water(uri)
    assert parse_high_water("") is None
    assert parse_high_water("ssm:///edgeqa/high-water") == ("ssm", "edgeqa/high-water")


def test_the_dynamodb_and_ssm_marks_only_rise(s3_endpoint: str) -> None:
    import uuid

    import boto3

    table = f"edgeqa-marks-{uuid.uuid4().hex[:8]}"
    boto3.client("dynamodb").create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "profile", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "profile", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for uri in (f"dynamodb://{table}", f"ssm://edgeqa/{uuid.uuid4().hex[:8]}"):
        mark = open_high_water(uri)
        assert mark is not None and mark.read("en") == Marks(), uri
        mark.raise_to("en", "pointer", 1_700_000_000_000)
        mark.raise_to("en", "pointer", 1_600_000_000_000)  # lower: kept as it was
        mark.raise_to("en", "revocations", 4)
        assert mark.read("en") == Marks(pointer=1_700_000_000_000, revocations=4), uri
        assert mark.read("zh") == Marks(), uri
    missing = open_high_water("dynamodb://no-such-table")
    assert missing is not None
    with pytest.raises(HighWaterError, match="cannot read"):
        missing.read("en")


def test_a_mark_without_a_region_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    for uri in ("dynamodb://marks", "ssm://edgeqa/marks"):
        with pytest.raises(HighWaterError, match=f"cannot reach the high-water mark {uri}"):
            open_high_water(uri)
