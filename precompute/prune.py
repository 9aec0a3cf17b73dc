"""Pruning a profile's releases: old ones, refused ones, stopped uploads, and the answer objects
no kept release holds.

A release is kept while it is one of the ``keep`` newest complete releases (never the current one
or its parent); a release the quality gate refused (``refused.json`` in its folder), one built
after the current one and left unpublished and unsigned, and an upload that stopped before its
manifest are removed, the last two once nothing under them was written for ``ORPHAN_AGE`` (by
the store's own times: a night run again is dated days back). A removed release's work area goes
with it, unless a kept release names it. The pointer is read again before each removal: a
publish or a rollback meanwhile stops the prune (the next one finishes).

Answer objects are shared by the releases that hold them (``answer_objects.py``), so one is
deleted only when no kept release names it (their ``objects/digests.parquet``), nor an upload in
progress (its digests file, written before its objects), and it was written more than
``ORPHAN_AGE`` ago. The folders of ``a/`` are found with one listing and listed ``concurrency``
at a time; the deletes go in bulk (``Store.delete_many``: ``DeleteObjects`` batches of 1,000 on
S3): its cost grows with the objects, its memory with the kept releases' digests (8 bytes each).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from base.release import ReleaseError, list_versions, read_manifest, read_pointer, release_prefix
from base.release_check import load_digests
from base.signing import SIGNATURE
from base.store import ObjectNotFoundError, ObjectTooLargeError, Store, StoreError, bounded_map
from precompute.workarea import work_prefix

log = logging.getLogger(__name__)

ORPHAN_AGE = timedelta(days=1)
REFUSED = "refused.json"  # written into a release's folder when the quality gate refuses it
CHECKED = "checked.json"  # written when it passed: the manifest sha256 checked; publish needs it


def mark_refused(store: Store, profile: str, version: str, reason: str | None) -> None:
    """``refused.json`` in the release's folder, saying ``reason`` (the quality gate's): never
    published, pruned; its ``checked.json`` goes. Never on a release once served (current, or
    signed: published before). ``reason`` None: the release passed (a night run again under
    other rules): a refusal is lifted."""
    prefix = release_prefix(profile, version)
    if reason is None:
        store.delete(f"{prefix}/{REFUSED}")
        return
    pointer, _ = read_pointer(store, profile)
    served = pointer is not None and pointer.version == version
    if not served and not store.exists(f"{prefix}/{SIGNATURE}"):
        store.delete(f"{prefix}/{CHECKED}")
        store.put_new(f"{prefix}/{REFUSED}", json.dumps({"refused": reason}).encode())


def mark_checked(store: Store, profile: str, version: str, manifest_sha: str) -> None:
    """``checked.json``: the release with this manifest passed ``check_release`` (and the quality
    gate, in the nightly): what ``publish_uploaded`` and a rollback ask for."""
    marker = json.dumps({"manifest_sha256": manifest_sha}).encode()
    store.put(f"{release_prefix(profile, version)}/{CHECKED}", marker, "application/json")


def is_checked(store: Store, profile: str, version: str, manifest_sha: str) -> bool:
    try:
        found = json.loads(store.get(f"{release_prefix(profile, version)}/{CHECKED}", 4096))
    except (ObjectNotFoundError, ObjectTooLargeError, ValueError):
        return False
    return isinstance(found, dict) and found.get("manifest_sha256") == manifest_sha


def remove_release(store: Store, prefix: str) -> int:
    """Delete a release's folder, its manifest first: a folder without one is an incomplete
    upload no reader looks at, whatever is left of it if this stops half way."""
    store.delete(f"{prefix}/manifest.json")
    return store.delete_prefix(prefix)


def last_written(store: Store, prefix: str) -> float:
    """When anything under ``prefix`` was last written (epoch s; 0 when nothing is there): how
    old an upload is, whatever instant its version names (a night run again is dated days ago)."""
    return max((found.modified for found in store.scan(prefix)), default=0.0)


class _Moved(Exception):
    """The pointer changed while prune ran (a publish, a rollback): it stops, removing no more."""


def prune(store: Store, profile: str, keep: int, now: datetime | None = None) -> list[str]:
    """Delete all but the ``keep`` newest complete releases (never the current one or its
    parent), refused releases, releases and uploads left unpublished past ``ORPHAN_AGE`` since
    they were last written, the work areas no kept release names, and the answer objects none
    holds; the versions removed. The pointer is read again before each removal: when it has
    changed, prune stops there (the next one finishes the work)."""
    now = now or datetime.now(UTC)
    old = (now - ORPHAN_AGE).timestamp()
    pointer, etag = read_pointer(store, profile)
    protected = {pointer.version, pointer.parent} if pointer else set()
    folders = store.folders(f"{profile}/releases")
    versions = list_versions(store, profile)

    def dropped(version: str) -> bool:
        prefix = release_prefix(profile, version)
        if version in protected:
            return False
        if store.exists(f"{prefix}/{REFUSED}"):
            return True
        newer = pointer is not None and version > pointer.version
        if not newer or store.exists(f"{prefix}/{SIGNATURE}"):
            return False
        return last_written(store, prefix) < old  # built after the current one, never published

    def still(action: str) -> None:
        if read_pointer(store, profile)[1] != etag:
            raise _Moved(action)

    doomed = {v for v in versions if dropped(v)}
    ranked = [v for v in versions if v not in doomed]
    doomed |= {v for v in ranked[: max(len(ranked) - keep, 0)] if v not in protected}
    kept = [v for v in versions if v not in doomed]
    removed: list[str] = []
    try:
        kept_runs = {_run_of(store, profile, v) for v in kept} if doomed else set()
        for version in sorted(doomed):
            run = _run_of(store, profile, version)
            still(f"removing {version}")
            remove_release(store, release_prefix(profile, version))
            if run and run not in kept_runs:
                store.delete_prefix(work_prefix(profile, run))
            removed.append(version)
        young: list[str] = []  # uploads in progress: the objects they rely on are held
        for folder in sorted(set(folders) - set(versions)):
            if last_written(store, release_prefix(profile, folder)) >= old:
                young.append(folder)
                continue
            still(f"removing the stopped upload {folder}")
            store.delete_prefix(release_prefix(profile, folder))
            removed.append(folder)
        if pointer is not None and pointer.version not in kept:
            log.warning(
                "%s: the current release %s has no manifest: no object pruned",
                profile,
                pointer.version,
            )
            return removed
        still("pruning answer objects")
        prune_objects(store, profile, kept, old, young)
    except _Moved as moved:
        log.warning("%s: the pointer changed while pruning (%s): stopped", profile, moved)
    return removed


def _run_of(store: Store, profile: str, version: str) -> str | None:
    try:
        return read_manifest(store, profile, version)[0].run_id
    except ReleaseError:
        return None


def _held(
    store: Store,
    profile: str,
    versions: list[str],
    young: tuple[str, ...] | list[str] = (),
) -> np.ndarray | None:
    """The first 8 bytes of every digest the ``versions`` name, and the ``young`` uploads (their
    digests file, written first, when there is one yet: not checked, it only keeps more),
    sorted and unique; None when one of the ``versions`` cannot say (then no object may be
    judged unheld)."""
    parts = [_young_digests(store, profile, folder) for folder in young]
    for version in versions:
        try:
            manifest, _ = read_manifest(store, profile, version)
            digests = load_digests(store, release_prefix(profile, version), manifest)
        except ReleaseError as error:
            log.warning(
                "%s/%s: its objects are unknown (%s); no object is pruned", profile, version, error
            )
            return None
        parts.append(digests[:, :8].copy().view(">u8").ravel())
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, ">u8")


def _young_digests(store: Store, profile: str, folder: str) -> np.ndarray:
    import tempfile
    from pathlib import Path

    from base.release_check import read_digests

    with tempfile.TemporaryDirectory(prefix="edgeqa-digests-") as tmp:
        local = Path(tmp) / "digests.parquet"
        try:
            store.get_file(f"{release_prefix(profile, folder)}/objects/digests.parquet", local)
            return read_digests(local)[:, :8].copy().view(">u8").ravel()
        except (StoreError, OSError, ValueError, KeyError, AttributeError):
            return np.empty(0, ">u8")


def prune_objects(
    store: Store,
    profile: str,
    kept: list[str],
    before_s: float,
    young: tuple[str, ...] | list[str] = (),
) -> int:
    """Delete the answer objects under ``<profile>/a/`` that none of the ``kept`` releases (nor
    the ``young`` uploads in progress) names and that were written before ``before_s``; how
    many."""
    held = _held(store, profile, kept, young)
    if held is None:
        return 0

    def unheld(folder: str) -> list[str]:
        found = []
        for item in store.scan(folder):
            name = item.path.rsplit("/", 1)[-1].removesuffix(".json")
            try:
                first = np.frombuffer(bytes.fromhex(name[:16]), ">u8")[0]
            except ValueError:
                first = None
            if len(name) != 64 or first is None or item.modified >= before_s:
                continue
            at = int(np.searchsorted(held, first))
            if at == len(held) or held[at] != first:
                found.append(item.path)
        return found

    started = time.perf_counter()
    folders = [f"{profile}/a/{name}" for name in store.folders(f"{profile}/a")]  # one listing
    listers = min(store.concurrency, 32)  # each holds its folder's unheld names until handed on
    doomed = (p for paths in bounded_map(unheld, folders, listers, 1) for p in paths)
    count = store.delete_many(doomed)
    if count:
        log.info(
            "%s: %d answer objects no kept release holds, deleted in %.1f s",
            profile,
            count,
            time.perf_counter() - started,
        )
    return count
