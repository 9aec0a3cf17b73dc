"""Signed pointers (``base/pointers.py``): sequences that only grow, expiries that are
reported, and readers that remember the newest pointer they verified."""

from __future__ import annotations

import json
import logging
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from base.pointers import (
    PointerMemory,
    RollbackError,
    SignedPointer,
    new_pointer,
    next_sequence,
    verify_pointer,
)
from base.release import pointer_path, read_pointer, release_prefix
from base.signing import LocalSigner, generate_keypair
from base.store import FileStore
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
from precompute.publish import flip_pointer, publish
from tests.releases import PROFILE, build

SHA = "ab" * 32


def _signed(sequence: int, sha: str = SHA) -> SignedPointer:
    return SignedPointer(PROFILE, "v", sha, "cd" * 32, sequence, None)


def test_the_memory_refuses_older_pointers_and_survives_a_restart(tmp_path: Path) -> None:
    where = "s3://bucket/p/current.json"
    memory = PointerMemory(tmp_path / "state")
    memory.remember(where, _signed(5))
    memory.check(where, _signed(6))  # newer: fine
    memory.check(where, _signed(5))  # the same pointer again: fine
    with pytest.raises(RollbackError, match="refused as a rollback"):
        memory.check(where, _signed(4))
    with pytest.raises(RollbackError):  # one sequence, another release
        memory.check(where, _signed(5, "ef" * 32))
    memory.check("s3://bucket/other/current.json", _signed(1))  # each pointer its own
    (state,) = (tmp_path / "state").iterdir()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    restarted = PointerMemory(tmp_path / "state")
    with pytest.raises(RollbackError):
        restarted.check(where, _signed(4))
    with pytest.raises(RollbackError):  # remembering checks first
        restarted.remember(where, _signed(3))


def test_a_damaged_memory_file_is_reported_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    where = "file:///store/p/current.json"
    PointerMemory(tmp_path).remember(where, _signed(9))
    (state,) = tmp_path.iterdir()
    state.write_text("{not json")
    with caplog.at_level(logging.ERROR):
        assert PointerMemory(tmp_path).newest(where) is None
    assert "ignoring the pointer memory" in caplog.text


def test_sequences_grow_even_after_a_rolled_back_pointer() -> None:
    now = datetime(2026, 12, 3, tzinfo=UTC)
    ms = int(now.timestamp() * 1000)
    assert next_sequence(0, now) == ms  # the time, in milliseconds
    assert next_sequence(ms + 10, now) == ms + 11  # a clock behind: still one more
    # an old pointer read back (sequence from last week) still yields a higher sequence now
    assert next_sequence(ms - 7 * 86_400_000, now) == ms
    with pytest.raises(ValueError, match="positive"):
        new_pointer(None, PROFILE, "v", SHA, SHA, 0, expires_s=0)


def _publish(embedder: Any, store: FileStore, tmp: Path, tag: str, day: int, **kw: Any) -> str:
    build(embedder, tmp / tag, store, tag=tag, now=datetime(2026, 11, day, tzinfo=UTC))
    return publish(store, tmp / tag, **kw).version


def test_the_edge_reports_an_expired_pointer_and_takes_a_renewal_without_reloading(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    private, public = generate_keypair()
    signer, keys = LocalSigner(private), (public,)
    store = FileStore(tmp_path / "store")
    version = _publish(embedder, store, tmp_path, "v1", 20, signer=signer, expires_s=1)
    pointer, _ = read_pointer(store, PROFILE)
    signed = verify_pointer(pointer, PROFILE, keys)
    assert signed.not_after is not None and signed.stale(signed.not_after) is None
    assert "expired" in str(signed.stale(signed.not_after + timedelta(seconds=1)))
    # signed an hour ago, fresh for a minute: expired
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    manifest = json.loads(store.get(f"{release_prefix(PROFILE, version)}/manifest.json"))
    old = new_pointer(
        signer,
        PROFILE,
        version,
        pointer.manifest_sha256,
        manifest["answers_root"],
        0,
        expires_s=60,
        now=hour_ago,
    )
    store.put(pointer_path(PROFILE), json.dumps(old.as_dict()).encode())
    watcher = ReleaseWatcher(
        store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS, public_keys=keys
    )
    assert watcher.refresh() and watcher.version == version  # served all the same ...
    health = watcher.health()
    assert health["status"] == "ok" and health["pointer"]["stale"] is True  # ... and reported
    assert "expired" in health["pointer"]["stale_reason"]
    watcher.observe_age()
    metrics = watcher.metrics
    assert metrics.stale.labels("en")._value.get() == 1
    assert metrics.expires.labels("en")._value.get() < -3000
    # renewed: the same release under a newer sequence, taken without reloading it
    index = watcher.index
    renewed = new_pointer(
        signer, PROFILE, version, pointer.manifest_sha256, manifest["answers_root"], 0
    )
    flip_pointer(store, PROFILE, renewed, read_pointer(store, PROFILE)[1])
    assert watcher.refresh() is False and watcher.index is index
    assert watcher.health()["pointer"] == {
        "version": version,
        "sequence": renewed.sequence,
        "not_after": renewed.not_after,
        "stale": False,
    }
    watcher.observe_age()
    assert metrics.stale.labels("en")._value.get() == 0
    assert metrics.sequence.labels("en")._value.get() == renewed.sequence
    # the hour-old pointer put back is now a rollback
    store.put(pointer_path(PROFILE), json.dumps(old.as_dict()).encode())
    assert watcher.refresh() is False and watcher.index is index
    assert "refused as a rollback" in watcher.health()["pointer"]["stale_reason"]


def test_a_pointer_signed_before_sequences_is_served_stale_until_a_sequenced_one_is_seen(
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    private, public = generate_keypair()
    keys = (public,)
    store = FileStore(tmp_path / "store")
    version = _publish(embedder, store, tmp_path, "v1", 20, signer=LocalSigner(private))
    pointer, _ = read_pointer(store, PROFILE)
    sequenced = store.get(pointer_path(PROFILE))
    # as an older publisher wrote it: the release's own statement as the pointer's signature
    release_signed = json.loads(store.get(f"{release_prefix(PROFILE, version)}/manifest.sig"))
    legacy = pointer.as_dict(include={"version", "manifest_sha256"}) | {"signed": release_signed}
    store.put(pointer_path(PROFILE), json.dumps(legacy).encode())
    watcher = ReleaseWatcher(
        store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS, public_keys=keys
    )
    assert watcher.refresh() and watcher.version == version
    state = watcher.health()["pointer"]
    assert state["sequence"] == 0 and state["stale"] is True
    assert "no sequence or expiry" in state["stale_reason"]
    store.put(pointer_path(PROFILE), sequenced)
    assert watcher.refresh() is False and watcher.health()["pointer"]["stale"] is False
    store.put(pointer_path(PROFILE), json.dumps(legacy).encode())
    assert watcher.refresh() is False
    assert "refused as a rollback" in watcher.health()["pointer"]["stale_reason"]
