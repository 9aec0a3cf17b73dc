"""Pruning a profile's releases: old ones, refused ones, stopped uploads, and the answer objects
no kept release holds.

A release is kept while it is one of the ``keep`` newest complete releases (never the current one
or its parent); a release the quality gate refused (``refused.json`` in its folder), one built but
not published within ``ORPHAN_AGE`` (newer than the current one, unsigned) and an upload that
stopped before its manifest, once older than ``ORPHAN_AGE``, are removed whatever their age in
the order. A removed release's work area goes with it, unless a kept release names it.

Answer objects are shared by the releases that hold them (``answer_objects.py``), so one is
deleted only when no kept release names it (their ``objects/digests.parquet``) and it was
written more than ``ORPHAN_AGE`` ago (an upload in progress has written objects no manifest names
yet). The listing runs a folder of ``a/`` at a time (``concurrency`` at once) and the deletes go
in bulk (``Store.delete_many``: ``DeleteObjects`` batches of 1,000 on S3): its cost grows with the
objects, its memory with the kept releases' digests (8 bytes each).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np

from base.release import ReleaseError, list_versions, read_manifest, read_pointer, release_prefix
from base.release_check import load_digests
from base.signing import SIGNATURE
from base.store import Store, bounded_map
from precompute.workarea import work_prefix

log = logging.getLogger(__name__)

ORPHAN_AGE = timedelta(days=1)
REFUSED = "refused.json"  # written into a release's folder when the quality gate refuses it
_SINGLE_LISTING = 50_000  # fewer objects than this: ``a/`` is listed in one pass


def mark_refused(store: Store, profile: str, version: str, reason: str | None) -> None:
    """``refused.json`` in the release's folder, saying ``reason`` (the quality gate's): never
    published, pruned. Never on a release once served (current, or signed: published before).
    ``reason`` None: the release passed (a night run again under other rules): lift it."""
    marker = f"{release_prefix(profile, version)}/{REFUSED}"
    if reason is None:
        store.delete(marker)
        return
    pointer, _ = read_pointer(store, profile)
    served = pointer is not None and pointer.version == version
    if not served and not store.exists(f"{release_prefix(profile, version)}/{SIGNATURE}"):
        store.put_new(marker, json.dumps({"refused": reason}).encode(), "application/json")


def remove_release(store: Store, prefix: str) -> int:
    """Delete a release's folder, its manifest first: a folder without one is an incomplete
    upload no reader looks at, whatever is left of it if this stops half way."""
    store.delete(f"{prefix}/manifest.json")
    return store.delete_prefix(prefix)


def _version_time(version: str) -> datetime | None:
    try:
        return datetime.strptime(version.split("-", 1)[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def prune(store: Store, profile: str, keep: int, now: datetime | None = None) -> list[str]:
    """Delete all but the ``keep`` newest complete releases (never the current one or its
    parent), refused releases, releases and uploads left unpublished past ``ORPHAN_AGE``, the
    work areas no kept release names, and the answer objects none holds; the versions removed."""
    now = now or datetime.now(UTC)
    pointer, _ = read_pointer(store, profile)
    protected = {pointer.version, pointer.parent} if pointer else set()
    versions = list_versions(store, profile)
    old = now - ORPHAN_AGE

    def dropped(version: str) -> bool:
        prefix = release_prefix(profile, version)
        if version in protected:
            return False
        if store.exists(f"{prefix}/{REFUSED}"):
            return True
        made = _version_time(version)
        newer = pointer is not None and version > pointer.version
        stale = made is not None and made < old
        return newer and stale and not store.exists(f"{prefix}/{SIGNATURE}")

    doomed = {v for v in versions if dropped(v)}
    ranked = [v for v in versions if v not in doomed]
    doomed |= {v for v in ranked[: max(len(ranked) - keep, 0)] if v not in protected}
    kept = [v for v in versions if v not in doomed]

    def run_of(version: str) -> str | None:
        try:
            return read_manifest(store, profile, version)[0].run_id
        except ReleaseError:
            return None

    kept_runs = {run_of(v) for v in kept} if doomed else set()
    removed = []
    for version in sorted(doomed):
        run = run_of(version)
        remove_release(store, release_prefix(profile, version))
        if run and run not in kept_runs:
            store.delete_prefix(work_prefix(profile, run))
        removed.append(version)
    prefix = f"{profile}/releases/"
    folders = {path[len(prefix) :].split("/", 1)[0] for path in store.list(prefix.rstrip("/"))}
    for folder in sorted(folders - set(versions)):
        started = _version_time(folder)
        if started is not None and started < old:
            store.delete_prefix(f"{prefix}{folder}")
            removed.append(folder)
    prune_objects(store, profile, kept, old.timestamp())
    return removed


def _held(store: Store, profile: str, versions: list[str]) -> np.ndarray | None:
    """The first 8 bytes of every digest the ``versions`` name, sorted and unique; None when one
    of them cannot say (then no object may be judged unheld)."""
    parts = []
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


def prune_objects(store: Store, profile: str, kept: list[str], before_s: float) -> int:
    """Delete the answer objects under ``<profile>/a/`` that none of the ``kept`` releases names
    and that were written before ``before_s``; how many."""
    held = _held(store, profile, kept)
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

    def folders() -> Iterator[str]:
        if len(held) < _SINGLE_LISTING:
            yield f"{profile}/a"
        else:
            yield from (f"{profile}/a/{first:02x}" for first in range(256))

    started = time.perf_counter()
    doomed = (p for paths in bounded_map(unheld, folders(), store.concurrency, 1) for p in paths)
    count = store.delete_many(doomed)
    if count:
        log.info(
            "%s: %d answer objects no kept release holds, deleted in %.1f s",
            profile,
            count,
            time.perf_counter() - started,
        )
    return count
