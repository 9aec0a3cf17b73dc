"""Publishing a built release: written once where it is served, checked there, then pointed to.

Steps, in order (``STAGES``): ``objects`` (the answer objects the parent release does not hold
already, to the profile's shared ``a/``: by content, so an unchanged answer is never written
again), ``shards`` (the release's own files under ``releases/<version>/``: shards, key index,
digests, embedder), ``manifest`` (last: a version folder without one is an incomplete upload no
reader looks at) -- together ``upload_release``, the build stage's last step -- then ``verify``
(``release_check.check_release``: the validate stage's), ``flip`` (``current.json``, signed under
the next sequence with a fresh expiry (``base/pointers.py``), replaced by a conditional write on
the ETag read at the start -- S3 ``If-Match`` / ``If-None-Match``; the release's own signature
``manifest.sig`` written just before) and ``prune`` (``prune.py``) -- ``publish_uploaded``.

Every write is conditional (``Store.put_new``: an object that exists is never overwritten) and
bulk (``Store.put_many``: ``EDGEQA_S3_CONCURRENCY`` requests in flight). A failure or kill
before ``flip`` leaves readers on the previous release; the flip is one atomic object write.
Two publishers racing from the same parent: the first flip wins, the other gets
``PublishConflictError``.

The flip's outcome can be unknown (the write committed but its response was lost): it is settled
by reading the pointer back, never by writing again blindly, and no version the pointer names is
ever removed. Uploading a release again is idempotent: a version folder holding this manifest is
left as it is; one holding another is never overwritten (``PublishConflictError``); one without a
manifest (an upload that stopped) is cleared and written again. Publishing a release that is
already current is a no-op.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from base.answer_objects import object_path
from base.config import usable_cpus
from base.errors import EdgeQAError
from base.highwater import HighWater, checked_sequence
from base.manifest import Manifest
from base.pointers import DEFAULT_EXPIRES_S, Pointer, new_pointer
from base.release import (
    MAX_MANIFEST_BYTES,
    POINTER_CACHE_CONTROL,
    ReleaseError,
    pointer_path,
    read_manifest,
    read_pointer,
    release_prefix,
    sha256_hex,
    verified_manifest,
)
from base.release_check import check_release, load_digests
from base.signing import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE,
    SignatureError,
    Signer,
    sign_statement,
    statement,
    verify_statement,
    verifying_keys,
)
from base.store import (
    ObjectNotFoundError,
    ObjectTooLargeError,
    PreconditionFailedError,
    Source,
    Store,
    Transfer,
    TransientStoreError,
    backoff_s,
    bounded_map,
    put_files,
)
from precompute.prune import (
    ORPHAN_AGE,
    REFUSED,
    is_checked,
    last_written,
    mark_checked,
    prune,
    remove_release,
)

log = logging.getLogger(__name__)

STAGES = ("objects", "shards", "manifest", "verify", "flip", "prune")
# the answer objects go out on processes from this many (a process's start is then noise), at
# most this many processes (16 × ~500 PUTs a second of client CPU)
PROCESS_OBJECTS = 20_000
UPLOAD_PROCESSES = 16


class PublishConflictError(EdgeQAError, RuntimeError):
    """Another publisher changed ``current.json`` first, or the version folder holds another
    release; this release was not published."""


@dataclass
class UploadReport:
    """What ``upload_release`` wrote: the release's answer objects (``objects``), those written
    (``objects_written``), those the parent release holds and so were not sent
    (``objects_kept``), those found already there (``objects_existed``), the release's own
    files, and the bytes sent."""

    version: str = ""
    parent: str | None = None
    objects: int = 0
    objects_written: int = 0
    objects_kept: int = 0
    objects_existed: int = 0
    files: int = 0
    bytes: int = 0
    already: bool = False  # the version folder held this release whole: nothing was written
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds": round(self.seconds, 2)}


@dataclass
class PublishReport:
    version: str = ""
    parent: str | None = None
    files: int = 0
    bytes: int = 0
    objects_written: int = 0
    objects_kept: int = 0
    pruned: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds": round(self.seconds, 2)}


def _walk(folder: Path) -> Iterator[Path]:
    """The files under ``folder``, a subfolder's names at a time (never all held)."""
    for root, subfolders, names in os.walk(folder):
        subfolders.sort()
        for name in sorted(names):
            yield Path(root) / name


def _kind(path: Path) -> str:
    return "application/json" if path.suffix == ".json" else "application/octet-stream"


def parent_digests(store: Store, profile: str, parent: str | None) -> np.ndarray:
    """The parent release's answer objects' digests (sorted; ``S32``): what need not be written
    again. Empty when there is no parent or its digests cannot be read (every object is then
    written where none is: conditional writes keep that correct, only slower)."""
    empty = np.empty(0, dtype="S32")
    if parent is None:
        return empty
    try:
        manifest, _ = read_manifest(store, profile, parent)
        return load_digests(store, release_prefix(profile, parent), manifest).view("S32").ravel()
    except ReleaseError as error:
        log.warning("the parent release's digests are unreadable (%s): writing every object", error)
        return empty


def upload_release(
    store: Store, staging: Path, on_stage: Callable[[str], None] | None = None, fill: bool = False
) -> UploadReport:
    """Write the release built in ``staging`` where it is served: its digests file first (what
    prune holds while the upload runs), the answer objects the parent release does not hold to
    ``<profile>/a/``, its other files under ``releases/<version>/``, the manifest last; every
    write conditional and ``store.concurrency`` at a time. A file already there (an upload that
    stopped, run again) must be these bytes: another's is a ``PublishConflictError``, unless
    nothing was written there for ``ORPHAN_AGE`` (then the stopped upload is cleared first).
    ``fill``: the folder holds this manifest but does not verify: write what is missing."""
    started = time.perf_counter()
    stage = on_stage or (lambda name: None)
    manifest_bytes = (staging / "manifest.json").read_bytes()
    manifest = Manifest.from_json(manifest_bytes)
    profile, version = manifest.profile.name, manifest.version
    prefix = release_prefix(profile, version)
    report = UploadReport(version=version, parent=manifest.parent, objects=manifest.objects.count)
    if not fill and _holds(store, prefix, sha256_hex(manifest_bytes)):
        report.already = True
        report.seconds = time.perf_counter() - started
        return report
    held = parent_digests(store, profile, manifest.parent)
    rows = held.view(np.uint8).reshape(-1, 32)  # held[i] as bytes drops trailing zero bytes

    def objects() -> Iterator[tuple[str, Path, str | None]]:
        for path in _walk(staging / "a"):
            raw = bytes.fromhex(path.stem)
            at = int(np.searchsorted(held, raw))
            if at < len(held) and rows[at].tobytes() == raw:
                report.objects_kept += 1
                continue
            yield f"{profile}/{object_path(path.stem)}", path, "application/json"

    def files(folders: tuple[str, ...]) -> Iterator[tuple[str, Source, str | None]]:
        for folder in folders:
            for path in _walk(staging / folder):
                yield f"{prefix}/{path.relative_to(staging).as_posix()}", path, _kind(path)

    stage("objects")
    own = _put_own(store, prefix, files(("objects",)), fill)  # the digests: held from now on
    # the answer objects on processes past a few thousand: a PUT's client CPU (~2 ms) holds
    # one process to ~500 a second (1.63M a night: 55 min on one, under 4 on 16)
    processes = min(UPLOAD_PROCESSES, usable_cpus()) if report.objects >= PROCESS_OBJECTS else 1
    sent = put_files(store, objects(), processes)
    report.objects_written, report.objects_existed = sent.written, sent.existed
    stage("shards")
    own.add(_put_own(store, prefix, files(("shards", "k", "embedder")), fill))
    stage("manifest")
    if not store.put_new(f"{prefix}/manifest.json", manifest_bytes, "application/json"):
        _holds(store, prefix, sha256_hex(manifest_bytes))  # another's: a conflict; ours: done
    report.files = own.written + own.existed + 1
    report.bytes = sent.bytes + own.bytes + len(manifest_bytes)
    report.seconds = time.perf_counter() - started
    return report


def _put_own(
    store: Store, prefix: str, items: Iterator[tuple[str, Source, str | None]], fill: bool
) -> Transfer:
    """The release's own files written where none is; one already there must hold the same
    bytes (this upload, run again), or be left from an upload that stopped ``ORPHAN_AGE`` ago
    (cleared, then written), or it is another publisher's (``PublishConflictError``)."""
    done = Transfer()

    def one(item: tuple[str, Source, str | None]) -> tuple[str, Source, bool]:
        path, local, kind = item
        return path, local, store.put_new(path, local, kind)

    for path, local, written in bounded_map(one, items, store.concurrency):
        size = len(local) if isinstance(local, bytes) else Path(local).stat().st_size
        done.add(Transfer(int(written), int(not written), size if written else 0))
        if written or _same_bytes(store, path, local):
            continue
        if fill or last_written(store, prefix) >= time.time() - ORPHAN_AGE.total_seconds():
            raise PublishConflictError(f"{path} holds other bytes: {prefix} is another upload's")
        log.warning("%s: an upload that stopped long ago left other bytes: cleared", prefix)
        store.delete(path)
        store.put_new(path, local)
    return done


def _same_bytes(store: Store, path: str, local: Source) -> bool:
    """Whether the object at ``path`` holds ``local``'s bytes (read to a temporary file)."""
    import hashlib
    import tempfile

    def digest(file: Path) -> str:
        with file.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    with tempfile.TemporaryDirectory(prefix="edgeqa-compare-") as tmp:
        there = Path(tmp) / "there"
        store.get_file(path, there)
        found = digest(there)
    return found == (sha256_hex(local) if isinstance(local, bytes) else digest(Path(local)))


def _holds(store: Store, prefix: str, manifest_sha: str) -> bool:
    """True when ``prefix`` holds this release's manifest; ``PublishConflictError`` when it holds
    another (releases are immutable); False when it holds none."""
    try:
        existing = store.get(f"{prefix}/manifest.json", max_bytes=MAX_MANIFEST_BYTES)
    except ObjectNotFoundError:
        return False
    except ObjectTooLargeError:
        existing = b""
    if sha256_hex(existing) != manifest_sha:
        raise PublishConflictError(f"{prefix} holds a different release (releases are immutable)")
    return True


def same_release(store: Store, manifest: Manifest) -> str:
    """The sha256 of the manifest already at ``manifest``'s version when it holds the same
    answers (a night run again, by another runner or after it was published: the version is
    the answers and their instant), so a run goes on with it; ``PublishConflictError`` when it
    does not."""
    profile, version = manifest.profile.name, manifest.version
    found, sha = read_manifest(store, profile, version)
    if found.content_sha256 != manifest.content_sha256:
        raise PublishConflictError(f"{profile}/{version} holds another release (immutable)")
    log.info("%s/%s was built by run %s: going on with it", profile, version, found.run_id)
    return sha


def publish_uploaded(
    store: Store,
    profile: str,
    version: str,
    manifest_sha: str,
    keep: int = 5,
    signer: Signer | None = None,
    expires_s: float = DEFAULT_EXPIRES_S,
    on_stage: Callable[[str], None] | None = None,
    *,
    public_keys: tuple[str, ...] = (),
    high_water: HighWater | None = None,
) -> PublishReport:
    """Point ``current.json`` at the uploaded (and checked) release ``version``: its signature
    (``manifest.sig``, ``signer``'s; None = unsigned, which readers holding public keys refuse)
    written beside its manifest, the pointer signed under the next sequence, fresh for
    ``expires_s``, then older releases pruned (``keep``). A release the quality gate refused is
    never pointed to. The pointer replaced is verified with ``public_keys`` and the signer's
    key; with ``high_water``, one below its mark (or unverified once a mark is recorded) is
    refused (``HighWaterError``: nothing signed) and the mark is raised to the new pointer's."""
    if keep < 2:
        raise ValueError("keep must be at least 2 (the current release and one to roll back to)")
    started = time.perf_counter()
    stage = on_stage or (lambda name: None)
    pointer, etag = read_pointer(store, profile)
    manifest, _ = verified_manifest(store, profile, version, manifest_sha)
    report = PublishReport(version=version, parent=manifest.parent)
    if _names(pointer, version, manifest_sha):
        log.info("%s/%s is already the current release", profile, version)
        report.seconds = time.perf_counter() - started
        return report
    prefix = release_prefix(profile, version)
    if store.exists(f"{prefix}/{REFUSED}"):
        raise PublishConflictError(f"{prefix} was refused by the quality gate: never published")
    if not is_checked(store, profile, version, manifest_sha):
        raise PublishConflictError(f"{prefix} has not been checked where it is: validate it first")
    _built_on_current(pointer, manifest)
    previous = checked_sequence(pointer, profile, verifying_keys(signer, public_keys), high_water)
    if signer:
        _sign(
            store, prefix, signer, statement(profile, version, manifest_sha, manifest.answers_root)
        )
    stage("flip")
    flip_pointer(
        store,
        profile,
        new_pointer(
            signer,
            profile,
            version,
            manifest_sha,
            manifest.answers_root,
            previous,
            expires_s=expires_s,
            parent=manifest.parent,
        ),
        etag,
        high_water,
    )
    stage("prune")
    report.pruned = prune(store, profile, keep)
    report.seconds = time.perf_counter() - started
    return report


def _sign(store: Store, prefix: str, signer: Signer, signed: bytes) -> None:
    """``manifest.sig``: ``signer``'s signature of the release's statement, written once; one
    already there must be a signature of this statement by this signer's key."""
    path = f"{prefix}/{SIGNATURE}"
    if store.put_new(path, sign_statement(signed, signer), "application/json"):
        return
    try:
        found = verify_statement(
            store.get(path, max_bytes=MAX_SIGNATURE_BYTES), (signer.public_key,)
        )
    except (SignatureError, ObjectTooLargeError) as error:
        raise PublishConflictError(f"{path} is not this signer's signature: {error}") from None
    if found != json.loads(signed):
        raise PublishConflictError(f"{path} signs another statement")


def publish(
    store: Store,
    staging: Path,
    keep: int = 5,
    on_stage: Callable[[str], None] | None = None,
    signer: Signer | None = None,
    expires_s: float = DEFAULT_EXPIRES_S,
    *,
    public_keys: tuple[str, ...] = (),
    high_water: HighWater | None = None,
) -> PublishReport:
    """Upload the release built in ``staging`` (``upload_release``), check it where it is
    (``check_release``: every object present, a sample read back) and point to it
    (``publish_uploaded``): what the nightly's build, validate and publish stages do, in one
    call. A failure before the flip removes the new version's folder (never one the pointer
    names); objects it wrote and no release holds go with the next prune. ``public_keys`` and
    ``high_water``: as ``publish_uploaded``'s (checked before anything is uploaded too)."""
    if keep < 2:
        raise ValueError("keep must be at least 2 (the current release and one to roll back to)")
    started = time.perf_counter()
    manifest_bytes = (staging / "manifest.json").read_bytes()
    manifest = Manifest.from_json(manifest_bytes)
    profile, version = manifest.profile.name, manifest.version
    manifest_sha = sha256_hex(manifest_bytes)
    pointer, _ = read_pointer(store, profile)
    if _names(pointer, version, manifest_sha):
        log.info("%s/%s is already the current release", profile, version)
        return PublishReport(version=version, parent=manifest.parent)
    _built_on_current(pointer, manifest)
    checked_sequence(pointer, profile, verifying_keys(signer, public_keys), high_water)
    stage = on_stage or (lambda name: None)
    uploaded = flipping = wrote = False
    try:

        def upload_stage(name: str) -> None:
            nonlocal uploaded
            uploaded = True  # called once writing has begun: never for a folder already whole
            stage(name)

        upload = upload_release(store, staging, upload_stage)
        wrote = not upload.already  # the manifest there is this call's
        stage("verify")
        try:
            check_release(store, profile, version, manifest_sha)
        except ReleaseError as error:
            if not upload.already:
                raise
            log.warning(
                "%s/%s does not verify (%s): writing what is missing", profile, version, error
            )
            upload = upload_release(store, staging, upload_stage, fill=True)
            check_release(store, profile, version, manifest_sha)
        mark_checked(store, profile, version, manifest_sha)

        def flip_stage(name: str) -> None:
            nonlocal flipping
            if name != "prune":
                stage(name)
            flipping = flipping or name == "flip"

        report = publish_uploaded(
            store,
            profile,
            version,
            manifest_sha,
            keep,
            signer,
            expires_s,
            flip_stage,
            public_keys=public_keys,
            high_water=high_water,
        )
    except BaseException as error:
        # once the pointer write has been sent its outcome may land later (a timed-out write
        # still in flight at S3): only a lost race is sure never to name this version
        sure = not flipping or isinstance(error, PublishConflictError)
        prefix = release_prefix(profile, version)
        ours = wrote or not store.exists(f"{prefix}/manifest.json")  # never another's release
        if uploaded and sure and ours and not _is_live(store, profile, version):
            _remove_quietly(store, prefix)
        raise
    stage("prune")
    report.files, report.bytes = upload.files, upload.bytes
    report.objects_written, report.objects_kept = upload.objects_written, upload.objects_kept
    report.seconds = time.perf_counter() - started
    return report


def _built_on_current(pointer: Pointer | None, manifest: Manifest) -> None:
    """``PublishConflictError`` unless ``manifest``'s release was built on the current one."""
    current = pointer.version if pointer else None
    if current != manifest.parent:
        raise PublishConflictError(
            f"{manifest.profile.name}: current release is {current}, but {manifest.version} was "
            f"built on {manifest.parent}; rebuild on the current release"
        )


def _names(pointer: Pointer | None, version: str, manifest_sha: str) -> bool:
    return pointer is not None and (pointer.version, pointer.manifest_sha256) == (
        version,
        manifest_sha,
    )


def flip_pointer(
    store: Store,
    profile: str,
    pointer: Pointer,
    etag: str | None,
    high_water: HighWater | None = None,
) -> None:
    """Replace ``current.json`` (read at ``etag``) with ``pointer``, then raise ``high_water``'s
    mark to its sequence. A write whose outcome is unknown is settled by reading the pointer
    back: ours, it committed; changed to anything else, another publisher won; unchanged, it
    never happened and is tried again."""
    written = pointer.as_dict()
    data = json.dumps(written, indent=2).encode()
    version = pointer.version

    def landed() -> None:
        if high_water is not None and pointer.sequence:
            high_water.raise_to(profile, "pointer", pointer.sequence)

    for attempt in range(store.retries + 1):
        try:
            store.put_if(pointer_path(profile), data, etag, POINTER_CACHE_CONTROL)
            landed()
            return
        except (PreconditionFailedError, TransientStoreError) as error:
            failure: Exception = error
        found, now = read_pointer(store, profile)
        if found is not None and found.as_dict() == written:
            log.warning(
                "%s: the pointer write committed; its response was lost (%s)", profile, failure
            )
            landed()
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
        remove_release(store, prefix)
    except Exception:  # best effort: prune removes what is left
        log.warning("could not remove the unpublished upload %s", prefix, exc_info=True)
