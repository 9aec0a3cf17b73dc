"""Publishing a built release: upload, verify, flip the pointer, prune.

Stages, in order (``STAGES``): ``objects`` (exact-tier answer objects), ``shards``, ``manifest``
(last of the uploads: a version folder without one is an incomplete upload no reader will look
at), ``verify`` (everything read back and checked against the manifest, and the manifest against
the local copy), ``flip`` (``current.json`` replaced by a conditional write on the ETag read at the
start — S3 ``If-Match`` / ``If-None-Match``), ``prune`` (all but the ``keep`` newest releases,
never the current one or its parent, and their generation work areas).

A failure or kill before ``flip`` leaves readers on the previous release; the flip is one atomic
object write. Two publishers racing from the same parent: the first flip wins, the other gets
``PublishConflictError`` and removes its own upload.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from edge_index.errors import EdgeQAError
from edge_index.release import (
    ReleaseError,
    list_versions,
    load_release,
    pointer_path,
    read_manifest,
    read_pointer,
    release_prefix,
    sha256_hex,
)
from edge_index.store import PreconditionFailedError, Store
from precompute.workarea import work_prefix

log = logging.getLogger(__name__)

STAGES = ("objects", "shards", "manifest", "verify", "flip", "prune")
ORPHAN_AGE = timedelta(days=1)  # incomplete uploads older than this are removed by prune


class PublishConflictError(EdgeQAError, RuntimeError):
    """Another publisher changed ``current.json`` first; this release was not published."""


@dataclass
class PublishReport:
    version: str = ""
    parent: str | None = None
    files: int = 0
    bytes: int = 0
    pruned: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds": round(self.seconds, 2)}


def _upload(store: Store, prefix: str, files: list[Path], staging: Path, workers: int) -> int:
    def one(path: Path) -> int:
        relative = path.relative_to(staging).as_posix()
        kind = "application/json" if path.suffix == ".json" else "application/octet-stream"
        store.put_file(f"{prefix}/{relative}", path, kind)
        return path.stat().st_size

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(one, files))


def publish(
    store: Store,
    staging: Path,
    keep: int = 5,
    on_stage: Callable[[str], None] | None = None,
    workers: int = 16,
) -> PublishReport:
    """Publish the release built in ``staging`` (its ``manifest.json`` says which)."""
    import time

    if keep < 2:
        raise ValueError("keep must be at least 2 (the current release and one to roll back to)")
    started = time.perf_counter()
    manifest_bytes = (staging / "manifest.json").read_bytes()
    manifest = json.loads(manifest_bytes)
    profile, version = manifest["profile"]["name"], manifest["version"]
    parent = manifest.get("parent")
    report = PublishReport(version=version, parent=parent)
    pointer, etag = read_pointer(store, profile)
    current = pointer["version"] if pointer else None
    if current != parent:
        raise PublishConflictError(
            f"{profile}: current release is {current}, but {version} was built on {parent}; "
            "rebuild on the current release"
        )
    prefix = release_prefix(profile, version)
    if store.exists(f"{prefix}/manifest.json"):
        raise PublishConflictError(f"{profile}/{version} already exists (releases are immutable)")
    stage = on_stage or (lambda name: None)
    uploaded = False
    try:
        stage("objects")
        uploaded = True
        objects = sorted((staging / "a").glob("*.json")) if (staging / "a").is_dir() else []
        report.bytes += _upload(store, prefix, objects, staging, workers)
        stage("shards")
        shards = sorted((staging / "shards").glob("*"))
        shards += sorted(p for p in (staging / "embedder").rglob("*") if p.is_file())
        report.bytes += _upload(store, prefix, shards, staging, workers)
        stage("manifest")
        store.put(f"{prefix}/manifest.json", manifest_bytes, "application/json")
        report.bytes += len(manifest_bytes)
        report.files = len(objects) + len(shards) + 1
        stage("verify")
        load_release(store, profile, version, sha256_hex(manifest_bytes), check_objects=True)
        stage("flip")
        new_pointer = {
            "version": version,
            "manifest_sha256": sha256_hex(manifest_bytes),
            "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "parent": parent,
        }
        try:
            store.put_if(pointer_path(profile), json.dumps(new_pointer, indent=2).encode(), etag)
        except PreconditionFailedError as error:
            raise PublishConflictError(
                f"{profile}: another publisher flipped current.json first; {version} was not "
                f"published ({error})"
            ) from None
    except BaseException:
        if uploaded:
            _remove_quietly(store, prefix)
        raise
    stage("prune")
    report.pruned = prune(store, profile, keep)
    report.seconds = time.perf_counter() - started
    return report


def _remove_quietly(store: Store, prefix: str) -> None:
    try:
        store.delete_prefix(prefix)
    except Exception:  # best effort: prune removes what is left
        log.warning("could not remove the unpublished upload %s", prefix, exc_info=True)


def _version_time(version: str) -> datetime | None:
    try:
        return datetime.strptime(version.split("-", 1)[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def prune(store: Store, profile: str, keep: int, now: datetime | None = None) -> list[str]:
    """Delete all but the ``keep`` newest complete releases (never the current one or its
    parent), their work areas, and incomplete uploads older than ``ORPHAN_AGE``."""
    now = now or datetime.now(UTC)
    pointer, _ = read_pointer(store, profile)
    protected = {pointer.get("version"), pointer.get("parent")} if pointer else set()
    versions = list_versions(store, profile)
    doomed = [v for v in versions[: max(len(versions) - keep, 0)] if v not in protected]

    def run_of(version: str) -> str | None:
        try:
            return read_manifest(store, profile, version)[0].get("run_id")
        except ReleaseError:
            return None

    kept_runs = {run_of(v) for v in versions if v not in doomed} if doomed else set()
    removed = []
    for version in doomed:
        run = run_of(version)
        store.delete_prefix(release_prefix(profile, version))
        if run and run not in kept_runs:
            store.delete_prefix(work_prefix(profile, run))
        removed.append(version)
    complete = set(versions)
    prefix = f"{profile}/releases/"
    folders = {path[len(prefix) :].split("/", 1)[0] for path in store.list(prefix.rstrip("/"))}
    for folder in sorted(folders - complete):
        started = _version_time(folder)
        if started is not None and now - started > ORPHAN_AGE:
            store.delete_prefix(f"{prefix}{folder}")
            removed.append(folder)
    return removed
