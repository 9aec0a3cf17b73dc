"""Revocations: a published answer taken down everywhere within seconds, and kept down.

``revoke`` first records the revocation durably in the store, ``<profile>/revocations.json``,
by a conditional write (two operators never lose each other's entry), with an audit entry: who,
when, why. It then publishes a release derived from the current one without the revoked cluster
— every phrasing of it and their answer objects (``build.derive_release``: nothing embedded or
generated again) — signed and published like a nightly release. Readers take it up as any new
release: browsers when their cached ``current.json`` expires (30 s on the CDN), the edge and the
origin at their next poll (``EDGEQA_POLL_S``); the origin also drops the revoked keys from its
online cache and never caches them again while the release lists them (its manifest's
``revoked``). Every later nightly build leaves out a cluster holding a revoked phrasing and lists
the revocations in force, until ``unrevoke``, which records the change but republishes nothing:
the next nightly build may publish the question again.

The list is signed by the release signer (``signed``: ``{"format": "edgeqa-revocations/1",
"profile", "sequence", "sha256"}`` over the canonical JSON of ``revoked``, ``audit`` and
``sequence``), and each release records the list's ``sequence`` it was built with (its manifest's
``revoked``). A reader holding public keys refuses a list that is unsigned, signed by another key,
edited after signing, missing, or older than the one the current release was built with: whoever
can write the store can neither drop a revocation nor put an older list back.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from base.errors import EdgeQAError
from base.highwater import HighWater, checked_sequence, list_floor_of
from base.keys import key as key_of
from base.manifest import Manifest, Revoked
from base.pointers import DEFAULT_EXPIRES_S, next_sequence
from base.release import (
    LoadedRelease,
    ReleaseError,
    load_release,
    read_pointer,
    verified_manifest,
)
from base.signing import (
    SignatureError,
    Signer,
    canonical,
    sign_statement,
    verify_statement,
    verifying_keys,
    writer_keys,
)
from base.store import (
    ObjectNotFoundError,
    ObjectTooLargeError,
    PreconditionFailedError,
    Store,
    sha256_hex,
)
from precompute.build import derive_release
from precompute.config import PrecomputeSettings
from precompute.publish import PublishConflictError, publish

log = logging.getLogger(__name__)

MAX_REVOCATIONS_BYTES = 16 << 20
MAX_REASON_CHARS = 500
_ATTEMPTS = 5  # conditional writes (and derived publishes) lost to a concurrent writer


class RevocationError(EdgeQAError, ValueError):
    """What to revoke is not in the current release, or the revocation list is unreadable."""


def revocations_path(profile: str) -> str:
    return f"{profile}/revocations.json"


REVOCATIONS_FORMAT = "edgeqa-revocations/1"


def _body_sha256(document: dict[str, Any]) -> str:
    body = {name: document.get(name) for name in ("revoked", "audit", "sequence")}
    return sha256_hex(canonical(body))


def _statement(profile: str, document: dict[str, Any]) -> bytes:
    body = {
        "format": REVOCATIONS_FORMAT,
        "profile": profile,
        "sequence": document["sequence"],
        "sha256": _body_sha256(document),
    }
    return canonical(body)


def read_revocations(
    store: Store, profile: str, public_keys: tuple[str, ...] = (), floor: int = 0
) -> tuple[dict[str, Any], str | None]:
    """The revocation list (``{"revoked": [...], "audit": [...], "sequence"}``) and its ETag
    (None before the first revocation). With ``public_keys`` it must be signed by one of them
    once ``floor`` (the list sequence the current release was built with) is above 0, and be no
    older than that; ``RevocationError`` otherwise."""
    path = revocations_path(profile)
    try:
        data, etag = store.get_with_etag(path, max_bytes=MAX_REVOCATIONS_BYTES)
    except ObjectNotFoundError:
        if public_keys and floor > 0:
            raise RevocationError(
                f"{path} is missing, but the current release was built with its sequence "
                f"{floor}: refusing to act as if nothing were revoked"
            ) from None
        return {"revoked": [], "audit": [], "sequence": 0}, None
    except ObjectTooLargeError:
        raise RevocationError(f"{path} is over {MAX_REVOCATIONS_BYTES} bytes") from None
    try:
        found = json.loads(data)
        if not isinstance(found.get("revoked"), list) or not isinstance(found.get("audit"), list):
            raise ValueError("no revoked or audit list")
        for entry in found["revoked"]:
            if not isinstance(entry.get("keys"), list) or not isinstance(entry.get("cluster"), str):
                raise ValueError("an entry without keys or cluster")
        found.setdefault("sequence", 0)  # written before lists were signed
        if type(found["sequence"]) is not int or found["sequence"] < 0:
            raise ValueError("its sequence is not a whole number")
    except (ValueError, AttributeError, RecursionError) as error:
        raise RevocationError(f"{path} is not a revocation list: {error}") from None
    if public_keys:
        _check_signed(found, profile, public_keys, floor)
    return found, etag


def _check_signed(
    document: dict[str, Any], profile: str, public_keys: tuple[str, ...], floor: int
) -> None:
    path = revocations_path(profile)
    if "signed" not in document:
        if floor > 0:
            raise RevocationError(
                f"{path} is unsigned, but the current release was built with its signed "
                f"sequence {floor}"
            )
        log.warning("%s is unsigned (written before lists were signed)", path)
        return
    try:
        signed = verify_statement(document.get("signed"), public_keys, (REVOCATIONS_FORMAT,))
    except SignatureError as error:
        raise RevocationError(f"{path}: {error}") from None
    expected = {
        "profile": profile,
        "sequence": document["sequence"],
        "sha256": _body_sha256(document),
    }
    if any(signed.get(name) != value for name, value in expected.items()):
        raise RevocationError(f"{path} was changed after it was signed")
    if document["sequence"] < floor:
        raise RevocationError(
            f"{path} (sequence {document['sequence']}) is older than sequence {floor} (the list "
            "the current release was built with, or the high-water mark): refused as a rollback"
        )


def list_floor(manifest: Manifest | None) -> int:
    """The revocation list sequence the release of ``manifest`` was built with (0: none)."""
    return manifest.revoked.sequence if manifest is not None and manifest.revoked else 0


def in_force(
    store: Store, profile: str, public_keys: tuple[str, ...] = (), floor: int = 0
) -> Revoked:
    """The revocations in force, as a manifest lists them: ids, clusters, phrasing keys and
    the list's sequence (``read_revocations``: verified with ``public_keys``)."""
    document = read_revocations(store, profile, public_keys, floor)[0]
    revoked = document["revoked"]
    return Revoked.of(
        {
            "ids": sorted(r["id"] for r in revoked),
            "clusters": sorted({r["cluster"] for r in revoked}),
            "keys": sorted({k for r in revoked for k in r["keys"]}),
            "sequence": document["sequence"],
        }
    )


def nightly_revocations(
    store: Store, profile: str, settings: PrecomputeSettings, parent: LoadedRelease | None = None
) -> Revoked:
    """``in_force`` as a nightly run reads it: verified with the readers' keys and the signer's,
    and no older than the list the current release (``parent``, else the pointer's) was built
    with, nor than the high-water mark (``EDGEQA_HIGH_WATER_URI``)."""
    if parent is None:
        try:
            manifest: Manifest | None = verified_manifest(store, profile)[0]
        except ReleaseError:  # nothing published, or a release that does not load: replaced
            manifest = None
    else:
        manifest = parent.manifest
    keys = verifying_keys(settings.signer(), settings.public_keys)
    floor = list_floor_of(settings.high_water(), profile, list_floor(manifest))
    return in_force(store, profile, keys, floor)


def _current(
    store: Store,
    profile: str,
    signer: Signer | None,
    public_keys: tuple[str, ...],
    high_water: HighWater | None,
) -> LoadedRelease:
    """The current release, its pointer checked against ``high_water``'s mark first."""
    pointer, _ = read_pointer(store, profile)
    checked_sequence(pointer, profile, verifying_keys(signer, public_keys), high_water)
    if pointer is None:
        raise RevocationError(f"nothing published yet for profile {profile!r}")
    return load_release(
        store, profile, pointer.version, pointer.manifest_sha256 or "", public_keys=public_keys
    )


def is_revoked(revoked: Revoked) -> Callable[[dict[str, Any]], bool]:
    """A test of a row (or a cluster's phrasing keys) against ``in_force``'s lists."""
    keys, clusters = set(revoked.keys), set(revoked.clusters)
    return lambda row: row["key"] in keys or row["cluster"] in clusters


def _update(
    store: Store,
    profile: str,
    change: Callable[[dict[str, Any]], None],
    signer: Signer | None,
    public_keys: tuple[str, ...],
    high_water: HighWater | None = None,
) -> None:
    """Apply ``change`` to the revocation list by a conditional write, signed by ``signer``
    under the next sequence; re-read and re-apply when another writer got there first. With
    ``high_water``, a list below its mark is refused and the mark is raised to the new list's."""
    try:
        keys = writer_keys(signer, public_keys, "the revocation list")
    except SignatureError as error:
        raise RevocationError(str(error)) from None
    floor = list_floor_of(high_water, profile)
    for _ in range(_ATTEMPTS):
        document, etag = read_revocations(store, profile, keys, floor)
        change(document)
        document["sequence"] = next_sequence(document["sequence"], datetime.now(UTC))
        document.pop("signed", None)
        if signer is not None:
            signed = sign_statement(_statement(profile, document), signer)
            document["signed"] = json.loads(signed)
        data = json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False).encode()
        try:
            store.put_if(revocations_path(profile), data, etag)
        except PreconditionFailedError:
            continue
        if high_water is not None:
            high_water.raise_to(profile, "revocations", document["sequence"])
        return
    raise RevocationError(f"{revocations_path(profile)} kept changing under us; try again")


def _target(
    release: LoadedRelease, question: str | None, key: str | None, cluster: str | None
) -> tuple[str, list[str], str]:
    """(cluster, its phrasing keys, its canonical question) of what is to be revoked."""
    if sum(x is not None for x in (question, key, cluster)) != 1:
        raise RevocationError("name exactly one of a question, a key or a cluster")
    if question is not None:
        key = key_of(question)
    columns = ["key", "cluster", "question", "canonical"]
    rows = [r for s in release.shards for r in s.rows.select(columns).to_pylist()]
    if cluster is None:
        found = next((r for r in rows if r["key"] == key), None)
        if found is None:
            raise RevocationError(
                f"the current release ({release.version}) has no phrasing with key {key}; "
                "`edgeqa release explain` shows which phrasing a question matches"
            )
        cluster = found["cluster"]
    members = [r for r in rows if r["cluster"] == cluster]
    if not members:
        raise RevocationError(f"the current release ({release.version}) has no cluster {cluster}")
    canonical = next((r["question"] for r in members if r["canonical"]), members[0]["question"])
    return cluster, sorted(r["key"] for r in members), canonical


def record_revocation(
    store: Store,
    profile: str,
    cluster: str,
    keys: list[str],
    question: str,
    reason: str,
    by: str,
    at: str,
    signer: Signer | None = None,
    public_keys: tuple[str, ...] = (),
    high_water: HighWater | None = None,
) -> str:
    """Add a revocation of ``cluster`` (its phrasing ``keys``) to the list in force, with its
    audit entry, signed by ``signer``; its id. A cluster revoked before keeps its entry, its keys
    widened."""
    entry_id = f"r-{uuid.uuid4().hex[:12]}"

    def record(document: dict[str, Any]) -> None:
        nonlocal entry_id
        same = next((r for r in document["revoked"] if r["cluster"] == cluster), None)
        if same is not None:
            entry_id = same["id"]
            same["keys"] = sorted(set(same["keys"]) | set(keys))
        else:
            entry = {"id": entry_id, "cluster": cluster, "keys": sorted(keys), "question": question}
            document["revoked"].append({**entry, "reason": reason, "by": by, "at": at})
        document["audit"].append(
            {"action": "revoke", "id": entry_id, "reason": reason, "by": by, "at": at}
        )

    _update(store, profile, record, signer, public_keys, high_water)
    return entry_id


def revoke(
    store: Store,
    profile: str,
    reason: str,
    by: str,
    *,
    question: str | None = None,
    key: str | None = None,
    cluster: str | None = None,
    signer: Signer | None = None,
    public_keys: Iterable[str] = (),
    keep: int = 5,
    expires_s: float = DEFAULT_EXPIRES_S,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    high_water: HighWater | None = None,
) -> dict[str, Any]:
    """Revoke the cluster of ``question``, ``key`` or ``cluster`` in the current release: record
    it, then publish a release without it. Returns what was done, with timings. With
    ``high_water``, a current pointer or a list below its mark is refused before anything is
    written (``HighWaterError``, ``RevocationError``)."""
    if not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise RevocationError(f"a reason is required (at most {MAX_REASON_CHARS} characters)")
    started = time.perf_counter()
    keys = tuple(public_keys)
    current = _current(store, profile, signer, keys, high_water)
    target, target_keys, canonical = _target(current, question, key, cluster)
    at = now().isoformat(timespec="seconds")
    entry_id = record_revocation(
        store, profile, target, target_keys, canonical, reason, by, at, signer, keys, high_water
    )
    recorded_s = time.perf_counter() - started
    published = _publish_without(
        store, profile, signer, keys, keep, expires_s, entry_id, now, high_water
    )
    return {
        "id": entry_id,
        "cluster": target,
        "question": canonical,
        "phrasings": len(target_keys),
        "recorded_s": round(recorded_s, 3),
        "seconds": round(time.perf_counter() - started, 3),
        **published,
    }


def _publish_without(
    store: Store,
    profile: str,
    signer: Signer | None,
    public_keys: tuple[str, ...],
    keep: int,
    expires_s: float,
    entry_id: str,
    now: Callable[[], datetime],
    high_water: HighWater | None = None,
) -> dict[str, Any]:
    """Publish the current release less every revocation in force; again from the new current
    release when a nightly publish (or another revocation) flips the pointer first."""
    for _ in range(_ATTEMPTS):
        current = _current(store, profile, signer, public_keys, high_water)
        revoked = in_force(
            store,
            profile,
            verifying_keys(signer, public_keys),
            list_floor_of(high_water, profile, list_floor(current.manifest)),
        )
        drop = is_revoked(revoked)
        with tempfile.TemporaryDirectory(prefix="edgeqa-revoke-") as tmp:
            staging = Path(tmp) / "release"
            extra = {
                "derived": {"from": current.version, "by": entry_id, "runner": "revoke"},
                "revoked": revoked,
            }
            manifest = derive_release(staging, current, drop, extra, now())
            try:
                report = publish(
                    store,
                    staging,
                    keep=keep,
                    signer=signer,
                    expires_s=expires_s,
                    public_keys=public_keys,
                    high_water=high_water,
                )
            except PublishConflictError:
                continue
        rows = manifest.counts.rows
        return {"version": report.version, "parent": current.version, "rows": rows}
    raise RevocationError(
        "the current release kept changing; the revocation is recorded: run revoke again"
    )


def unrevoke(
    store: Store,
    profile: str,
    reason: str,
    by: str,
    *,
    entry: str | None = None,
    key: str | None = None,
    cluster: str | None = None,
    signer: Signer | None = None,
    public_keys: Iterable[str] = (),
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    high_water: HighWater | None = None,
) -> dict[str, Any]:
    """End a revocation (by its id, a phrasing key, or its cluster): recorded (signed by
    ``signer``), nothing republished; the next nightly build may publish the question again."""
    if not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise RevocationError(f"a reason is required (at most {MAX_REASON_CHARS} characters)")
    ended: list[str] = []

    def record(document: dict[str, Any]) -> None:
        ended.clear()
        kept = []
        for r in document["revoked"]:
            if r["id"] == entry or r["cluster"] == cluster or key in r["keys"]:
                ended.append(r["id"])
            else:
                kept.append(r)
        if not ended:
            raise RevocationError("no revocation in force matches")
        document["revoked"] = kept
        at = now().isoformat(timespec="seconds")
        for found in ended:
            document["audit"].append(
                {"action": "unrevoke", "id": found, "reason": reason, "by": by, "at": at}
            )

    _update(store, profile, record, signer, tuple(public_keys), high_water)
    return {"ended": ended}
