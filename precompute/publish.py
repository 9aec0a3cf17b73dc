"""Publishing a built release: upload, verify, flip the pointer, prune.

Stages, in order (``STAGES``): ``objects`` (exact-tier answer objects), ``shards``, ``manifest``
(last of the uploads: a version folder without one is an incomplete upload no reader will look
at), ``verify`` (everything read back and checked against the manifest, and the manifest against
the local copy), ``flip`` (``current.json``, signed under the next sequence with a fresh expiry
(``base/pointers.py``), replaced by a conditional write on the ETag read at the start — S3
``If-Match`` / ``If-None-Match``), ``prune`` (all but the ``keep`` newest releases,
never the current one or its parent, and their generation work areas).

A failure or kill before ``flip`` leaves readers on the previous release; the flip is one atomic
object write. Two publishers racing from the same parent: the first flip wins, the other gets
``PublishConflictError`` and removes its own upload.

The flip's outcome can be unknown (the write committed but its response was lost): it is settled
by reading the pointer back, never by writing again blindly, and no version the pointer names is
ever removed. Publishing a release again is idempotent: already live, it is a no-op; uploaded
whole by a publisher that stopped before the flip, it is verified and flipped (re-uploaded only
when the verification fails).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

from base.errors import EdgeQAError
from base.manifest import Manifest
from base.pointers import DEFAULT_EXPIRES_S, Pointer, new_pointer, verify_pointer
from base.release import (
    MAX_MANIFEST_BYTES,
    POINTER_CACHE_CONTROL,
    ReleaseError,
    check_release,
    list_versions,
    pointer_path,
    read_manifest,
    read_pointer,
    release_prefix,
    sha256_hex,
)
from base.signing import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE,
    SignatureError,
    Signer,
    sign_statement,
    statement,
)
from base.store import (
    ObjectNotFoundError,
    ObjectTooLargeError,
    PreconditionFailedError,
    Store,
    TransientStoreError,
    backoff_s,
)
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


UPLOADS_IN_FLIGHT = 64  # files handed to the upload threads at once, per thread


def _upload(store: Store, prefix: str, files: Iterable[Path], staging: Path, workers: int) -> int:
    """Upload ``files`` (each under ``prefix`` at its place in ``staging``), ``workers`` at a
    time, a bounded number waiting: a million answer objects are never a million futures."""

    def one(path: Path) -> int:
        relative = path.relative_to(staging).as_posix()
        kind = "application/json" if path.suffix == ".json" else "application/octet-stream"
        store.put_file(f"{prefix}/{relative}", path, kind)
        return path.stat().st_size

    total = 0
    waiting = iter(files)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while batch := list(islice(waiting, UPLOADS_IN_FLIGHT * workers)):
            total += sum(pool.map(one, batch))
    return total


def _answer_objects(staging: Path) -> Iterator[Path]:
    """The answer objects under ``staging/a/``, as the folder lists them (never all held)."""
    folder = staging / "a"
    if not folder.is_dir():
        return
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(".json") and entry.is_file():
                yield Path(entry.path)


def publish(
    store: Store,
    staging: Path,
    keep: int = 5,
    on_stage: Callable[[str], None] | None = None,
    workers: int = 16,
    signer: Signer | None = None,
    expires_s: float = DEFAULT_EXPIRES_S,
) -> PublishReport:
    """Publish the release built in ``staging`` (its ``manifest.json`` says which), signed by
    ``signer`` (``base/signing.py``; None = unsigned, which readers holding public keys
    refuse). The release's signature goes beside the manifest; ``current.json`` is signed too,
    fresh for ``expires_s`` (``base/pointers.py``)."""
    if keep < 2:
        raise ValueError("keep must be at least 2 (the current release and one to roll back to)")
    started = time.perf_counter()
    manifest_bytes = (staging / "manifest.json").read_bytes()
    manifest = Manifest.from_json(manifest_bytes)
    profile, version = manifest.profile.name, manifest.version
    manifest_sha = sha256_hex(manifest_bytes)
    parent = manifest.parent
    report = PublishReport(version=version, parent=parent)
    pointer, etag = read_pointer(store, profile)
    if _names(pointer, version, manifest_sha):
        log.info("%s/%s is already the current release", profile, version)
        report.seconds = time.perf_counter() - started
        return report
    current = pointer.version if pointer else None
    if current != parent:
        raise PublishConflictError(
            f"{profile}: current release is {current}, but {version} was built on {parent}; "
            "rebuild on the current release"
        )
    prefix = release_prefix(profile, version)
    resume = _uploaded_before(store, prefix, manifest_sha)
    stage = on_stage or (lambda name: None)
    uploaded = flipping = False
    try:
        keys = (signer.public_key,) if signer else ()
        verified = resume and _verifies(store, profile, version, manifest_sha, keys)
        signature = None
        if verified and signer:
            signature = store.get(f"{prefix}/{SIGNATURE}", max_bytes=MAX_SIGNATURE_BYTES)
        if not verified:
            uploaded = True
            if signer:
                signature = sign_statement(
                    statement(profile, version, manifest_sha, manifest.answers_root), signer
                )
            report.bytes, report.files = _upload_release(
                store, prefix, staging, workers, stage, signature
            )
        stage("verify")
        if not verified:  # a resumed upload was just read back whole: once is enough
            check_release(store, profile, version, manifest_sha, public_keys=keys)
        stage("flip")
        flipping = True
        flip_pointer(
            store,
            profile,
            new_pointer(
                signer,
                profile,
                version,
                manifest_sha,
                manifest.answers_root,
                pointer_sequence(pointer, profile, keys),
                expires_s=expires_s,
                parent=parent,
            ),
            etag,
        )
    except BaseException as error:
        # once the pointer write has been sent its outcome may land later (a timed-out write
        # still in flight at S3): only a lost race is sure never to name this version
        sure = not flipping or isinstance(error, PublishConflictError)
        if uploaded and sure and not _is_live(store, profile, version):
            _remove_quietly(store, prefix)
        raise
    stage("prune")
    report.pruned = prune(store, profile, keep)
    report.seconds = time.perf_counter() - started
    return report


def _upload_release(
    store: Store,
    prefix: str,
    staging: Path,
    workers: int,
    stage: Callable[[str], None],
    signature: bytes | None,
) -> tuple[int, int]:
    """Objects, shards (and the embedder), the signature, then the manifest: (bytes, files)."""
    stage("objects")
    objects = 0

    def counted() -> Iterator[Path]:
        nonlocal objects
        for path in _answer_objects(staging):
            objects += 1
            yield path

    total = _upload(store, prefix, counted(), staging, workers)
    stage("shards")
    shards = sorted((staging / "shards").glob("*"))
    shards += sorted(p for p in (staging / "embedder").rglob("*") if p.is_file())
    total += _upload(store, prefix, shards, staging, workers)
    stage("manifest")
    manifest_bytes = (staging / "manifest.json").read_bytes()
    if signature:
        store.put(f"{prefix}/{SIGNATURE}", signature, "application/json")
        total += len(signature)
    store.put(f"{prefix}/manifest.json", manifest_bytes, "application/json")
    return total + len(manifest_bytes), objects + len(shards) + 1 + bool(signature)


def _names(pointer: Pointer | None, version: str, manifest_sha: str) -> bool:
    return pointer is not None and (pointer.version, pointer.manifest_sha256) == (
        version,
        manifest_sha,
    )


def _uploaded_before(store: Store, prefix: str, manifest_sha: str) -> bool:
    """True when an earlier publish of this same release uploaded its manifest (and stopped
    before the flip); ``PublishConflictError`` when the version holds a different release."""
    try:
        existing = store.get(f"{prefix}/manifest.json", max_bytes=MAX_MANIFEST_BYTES)
    except ObjectNotFoundError:
        return False
    except ObjectTooLargeError:
        existing = b""
    if sha256_hex(existing) != manifest_sha:
        raise PublishConflictError(f"{prefix} holds a different release (releases are immutable)")
    return True


def _verifies(
    store: Store, profile: str, version: str, manifest_sha: str, public_keys: tuple[str, ...]
) -> bool:
    try:
        check_release(store, profile, version, manifest_sha, public_keys=public_keys)
    except ReleaseError as error:
        log.warning(
            "resuming %s/%s: the earlier upload does not verify (%s)", profile, version, error
        )
        return False
    log.info("resuming %s/%s: the earlier upload verifies; flipping", profile, version)
    return True


def pointer_sequence(pointer: Pointer | None, profile: str, keys: tuple[str, ...]) -> int:
    """The signed sequence of the pointer a new one replaces (0 when it has none, or none that
    ``keys`` verify: the next is then the time, ``pointers.next_sequence``)."""
    if pointer is None or not keys:
        return 0
    try:
        return verify_pointer(pointer, profile, keys).sequence
    except SignatureError:
        return 0


def flip_pointer(store: Store, profile: str, pointer: Pointer, etag: str | None) -> None:
    """Replace ``current.json`` (read at ``etag``) with ``pointer``. A write whose outcome is
    unknown is settled by reading the pointer back: ours, it committed; changed to anything else,
    another publisher won; unchanged, it never happened and is tried again."""
    written = pointer.as_dict()
    data = json.dumps(written, indent=2).encode()
    version = pointer.version
    for attempt in range(store.retries + 1):
        try:
            store.put_if(pointer_path(profile), data, etag, POINTER_CACHE_CONTROL)
            return
        except (PreconditionFailedError, TransientStoreError) as error:
            failure: Exception = error
        found, now = read_pointer(store, profile)
        if found is not None and found.as_dict() == written:
            log.warning(
                "%s: the pointer write committed; its response was lost (%s)", profile, failure
            )
            return
        if now != etag:
            raise PublishConflictError(
                f"{profile}: another publisher flipped current.json first; {version} was not "
                f"published ({failure})"
            )
        time.sleep(backoff_s(attempt))
    raise failure


def _is_live(store: Store, profile: str, version: str) -> bool:
    """Whether the pointer names ``version``; when that cannot be read, assume it might."""
    try:
        pointer, _ = read_pointer(store, profile)
    except Exception:
        log.warning("could not read the pointer; keeping the upload of %s", version, exc_info=True)
        return True
    return pointer is not None and pointer.version == version


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
    protected = {pointer.version, pointer.parent} if pointer else set()
    versions = list_versions(store, profile)
    doomed = [v for v in versions[: max(len(versions) - keep, 0)] if v not in protected]

    def run_of(version: str) -> str | None:
        try:
            return read_manifest(store, profile, version)[0].run_id
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
