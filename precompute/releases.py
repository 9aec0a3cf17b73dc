"""Operating published releases: list, show, diff and roll back (``edgeqa release ...``).

What is read is verified as the edge verifies it (``load_release``: the hash chain, and the
signature when public keys are given). A rollback is a pointer write like a publish's flip
(``publish.flip_pointer``: conditional on the pointer read, settled by reading back when its
outcome is unknown) to a version that is still kept, signed again under a new, higher sequence
(``base/pointers.py``): readers refuse an old pointer put back, never an operator's
rollback. ``renew`` re-signs the current pointer with a fresh expiry (nothing else changes).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import StrictStr, TypeAdapter

from base.errors import EdgeQAError
from base.highwater import HighWater, HighWaterError, checked_sequence
from base.manifest import Document, EmbedderEntry
from base.pointers import DEFAULT_EXPIRES_S, new_pointer
from base.release import (
    LoadedRelease,
    ReleaseError,
    list_versions,
    load_release,
    read_manifest,
    read_pointer,
    release_prefix,
    verified_manifest,
)
from base.signing import MAX_SIGNATURE_BYTES, SIGNATURE, SignatureError, Signer, writer_keys
from base.store import ObjectNotFoundError, Store
from precompute.prune import REFUSED, is_checked
from precompute.publish import flip_pointer
from precompute.views import (
    ROW_FIELDS,
    CalibrationChange,
    ChangedCluster,
    ClusterBrief,
    ClusterPhrasing,
    DiffCounts,
    Excluded,
    ReleaseCounts,
    ReleaseDiff,
    ReleaseSummary,
    ReleaseView,
    Row,
    TopCluster,
    TopQuestion,
)

log = logging.getLogger(__name__)


class RollbackError(EdgeQAError, ValueError):
    """The version cannot be made current: it is not kept (pruned, or never published), or the
    pointer cannot be signed (readers check signatures, and no signing key is set)."""


class _Signature(Document):
    """``manifest.sig`` (``base/signing.py``), for the id of the key that signed it."""

    key_id: StrictStr | None = None


def _signed_by(store: Store, profile: str, version: str) -> str | None:
    """The id of the key that signed ``version``, None when it is not signed."""
    try:
        data = store.get(f"{release_prefix(profile, version)}/{SIGNATURE}", MAX_SIGNATURE_BYTES)
    except ObjectNotFoundError:
        return None
    found = json.loads(data)
    return _Signature.of(found).key_id if isinstance(found, dict) else None


def list_releases(store: Store, profile: str) -> list[ReleaseSummary]:
    """Every kept version, oldest first: created, parent, entries, calibration (whether the
    semantic tier serves first), current."""
    pointer, _ = read_pointer(store, profile)
    current = pointer.version if pointer else None
    listed = []
    for version in list_versions(store, profile):
        manifest, _ = read_manifest(store, profile, version)
        signed_by = _signed_by(store, profile, version)
        listed.append(ReleaseSummary.of(manifest, version == current, signed_by))
    return listed


_ROWS = TypeAdapter(list[Row])


def _rows(release: LoadedRelease) -> list[Row]:
    rows: list[Row] = []
    for shard in release.shards:
        rows.extend(_ROWS.validate_python(shard.rows.select(list(ROW_FIELDS)).to_pylist()))
    return rows


def _load(
    store: Store, profile: str, version: str | None, public_keys: Iterable[str]
) -> LoadedRelease:
    if version is None:
        pointer, _ = read_pointer(store, profile)
        if pointer is None:
            raise ReleaseError(f"nothing published yet for profile {profile!r}")
        version = pointer.version
    return load_release(store, profile, version, public_keys=tuple(public_keys))


def show_release(
    store: Store,
    profile: str,
    version: str | None = None,
    public_keys: Iterable[str] = (),
    top: int = 20,
    now: datetime | None = None,
) -> ReleaseView:
    """One release (the current one when ``version`` is None): what went in and what was left
    out at each stage, its calibration, its most asked questions, its profile."""
    release = _load(store, profile, version, public_keys)
    manifest = release.manifest
    rows = _rows(release)
    now = now or datetime.now(UTC)
    pointer, _ = read_pointer(store, profile)
    asked = sorted(rows, key=lambda r: (-r.hits, r.key))[:top]
    counts = manifest.counts.as_dict()
    return ReleaseView(
        version=release.version,
        current=pointer is not None and pointer.version == release.version,
        created_at=manifest.created_at,
        parent=manifest.parent,
        derived=manifest.derived,
        runner=manifest.runner,
        log_range=manifest.log_range,
        counts=ReleaseCounts.of({**counts, "expired": sum(r.expires_at <= now for r in rows)}),
        excluded=Excluded(
            rows=manifest.excluded_rows,  # mining (logs -> hot questions)
            clusters=manifest.excluded_clusters,  # generation and build
        ),
        calibration=manifest.threshold,
        profile=manifest.profile,
        embedder=EmbedderEntry.of(manifest.embedder.as_dict(exclude={"files"})),
        index=manifest.index,
        expiry=manifest.expiry,
        signed_by=_signed_by(store, profile, release.version),
        top_questions=[TopQuestion.model_validate(r, from_attributes=True) for r in asked],
        top_clusters=_top_clusters(rows, top),
    )


def _top_clusters(rows: list[Row], top: int) -> list[TopCluster]:
    """The most asked clusters: their answer and every phrasing, most asked first."""
    by_cluster: dict[str, list[Row]] = {}
    for row in rows:
        by_cluster.setdefault(row.cluster, []).append(row)
    ranked = sorted(by_cluster.items(), key=lambda c: (-sum(r.hits for r in c[1]), c[0]))
    return [
        TopCluster(
            cluster=cluster,
            hits=sum(r.hits for r in members),
            answer=members[0].answer,
            phrasings=[
                ClusterPhrasing.model_validate(r, from_attributes=True)
                for r in sorted(members, key=lambda r: (-r.hits, r.key))
            ],
        )
        for cluster, members in ranked[:top]
    ]


@dataclass
class _Cluster:
    """A cluster of a release, to compare: its answer, its canonical question, its keys."""

    answer: str
    question: str
    keys: set[str] = field(default_factory=set)

    def brief(self, cluster: str) -> ClusterBrief:
        return ClusterBrief(cluster=cluster, question=self.question, phrasings=len(self.keys))

    def changed(self, cluster: str, old: _Cluster) -> ChangedCluster:
        """This cluster, whose answer was ``old``'s."""
        return ChangedCluster(
            cluster=cluster,
            question=self.question,
            phrasings=len(self.keys),
            old_answer=old.answer,
            new_answer=self.answer,
        )


def _clusters(rows: list[Row]) -> dict[str, _Cluster]:
    clusters: dict[str, _Cluster] = {}
    for row in rows:
        entry = clusters.setdefault(row.cluster, _Cluster(row.answer, row.question))
        entry.keys.add(row.key)
        if row.canonical:
            entry.question = row.question
    return clusters


def diff_releases(
    store: Store,
    profile: str,
    old: str,
    new: str,
    public_keys: Iterable[str] = (),
    limit: int = 50,
) -> ReleaseDiff:
    """What changed from ``old`` to ``new``, by cluster: added, dropped, answer changed, and
    phrasings gained or lost by the clusters in both; the calibration before and after."""
    before, after = (_load(store, profile, v, public_keys) for v in (old, new))
    a, b = _clusters(_rows(before)), _clusters(_rows(after))
    # a cluster is the same one when its id is (its canonical phrasing) or, its canonical
    # having changed, when it shares phrasings with it
    owner = {k: c for c, entry in a.items() for k in entry.keys}
    pairs: dict[str, str] = {}  # new cluster -> the old one
    for c, entry in b.items():
        shared = Counter(owner[k] for k in entry.keys if k in owner)
        if c in a or shared:
            pairs[c] = c if c in a else shared.most_common(1)[0][0]
    added = sorted(set(b) - set(pairs))
    dropped = sorted(set(a) - set(pairs.values()))
    changed = [c for c in sorted(pairs) if a[pairs[c]].answer != b[c].answer]
    return ReleaseDiff(
        old=old,
        new=new,
        counts=DiffCounts(
            added=len(added),
            dropped=len(dropped),
            changed=len(changed),
            unchanged=len(pairs) - len(changed),
            phrasings_gained=sum(len(b[c].keys - a[o].keys) for c, o in pairs.items()),
            phrasings_lost=sum(len(a[o].keys - b[c].keys) for c, o in pairs.items()),
        ),
        added=[b[c].brief(c) for c in added[:limit]],
        dropped=[a[c].brief(c) for c in dropped[:limit]],
        changed=[b[c].changed(c, a[pairs[c]]) for c in changed[:limit]],
        calibration=CalibrationChange(old=before.manifest.threshold, new=after.manifest.threshold),
    )


def _signing(signer: Signer | None, public_keys: tuple[str, ...]) -> tuple[str, ...]:
    """``signing.writer_keys``: ``RollbackError`` when readers check signatures and nothing
    can sign the pointer."""
    try:
        return writer_keys(signer, public_keys, "current.json")
    except SignatureError as error:
        raise RollbackError(str(error)) from None


def rollback(
    store: Store,
    profile: str,
    version: str,
    public_keys: Iterable[str] = (),
    signer: Signer | None = None,
    expires_s: float = DEFAULT_EXPIRES_S,
    high_water: HighWater | None = None,
) -> dict[str, Any]:
    """Make ``version`` (a kept release) current again: its manifest and shards verified, the
    pointer signed by ``signer`` under a sequence above the current one and above
    ``high_water``'s mark (raised to it), and flipped by a conditional write. ``RollbackError``
    for a version that is not kept.

    The one signer that does not refuse a store pointer below the mark: it builds on nothing
    the store says but ``version``'s own verified release, so it is how an operator who holds
    the signing key puts a rolled-back store right (the pointer it signs is above the mark)."""
    keys = _signing(signer, tuple(public_keys))
    pointer, etag = read_pointer(store, profile)
    current = pointer.version if pointer else None
    try:
        previous = checked_sequence(pointer, profile, keys, high_water)
    except HighWaterError as error:
        assert high_water is not None
        previous = high_water.read(profile).pointer
        log.warning("%s; signing %s/%s above the mark", error, profile, version)
    if version not in list_versions(store, profile):
        raise RollbackError(
            f"{profile}/{version} is not a kept release (pruned, or never published); "
            f"kept: {', '.join(list_versions(store, profile)) or 'none'}"
        )
    prefix = release_prefix(profile, version)
    if store.exists(f"{prefix}/{REFUSED}"):
        raise RollbackError(f"{profile}/{version} was refused by the quality gate: never served")
    release = load_release(store, profile, version, public_keys=tuple(public_keys))
    signed = store.exists(f"{prefix}/{SIGNATURE}")
    if not signed and not is_checked(store, profile, version, release.manifest_sha256):
        raise RollbackError(f"{profile}/{version} was never checked nor published: not kept")
    if version == current:
        return {"version": version, "previous": current, "status": "already_current"}
    rolled = new_pointer(
        signer,
        profile,
        version,
        release.manifest_sha256,
        release.manifest.answers_root,
        previous,
        expires_s=expires_s,
        parent=release.manifest.parent,
        rolled_back_from=current,
    )
    flip_pointer(store, profile, rolled, etag, high_water)
    return {
        "version": version,
        "previous": current,
        "status": "rolled_back",
        "sequence": rolled.sequence,
    }


def renew(
    store: Store,
    profile: str,
    signer: Signer | None,
    public_keys: Iterable[str] = (),
    expires_s: float = DEFAULT_EXPIRES_S,
    high_water: HighWater | None = None,
) -> dict[str, Any]:
    """Sign the current pointer again, unchanged but for a higher sequence and an expiry
    ``expires_s`` from now (TUF's timestamp role): what keeps readers from reporting it stale
    when no release is published for a while. A pointer below ``high_water``'s mark is never
    renewed (``HighWaterError``): that would sign a bucket writer's rollback afresh."""
    keys = _signing(signer, tuple(public_keys))
    pointer, etag = read_pointer(store, profile)
    if pointer is None:
        raise RollbackError(f"nothing published yet for profile {profile!r}")
    previous = checked_sequence(pointer, profile, keys, high_water)
    manifest, sha = verified_manifest(
        store, profile, pointer.version, pointer.manifest_sha256 or "", tuple(public_keys)
    )
    kept = pointer.as_dict(include={"parent", "rolled_back_from"})
    renewed = new_pointer(
        signer,
        profile,
        manifest.version,
        sha,
        manifest.answers_root,
        previous,
        expires_s=expires_s,
        **kept,
    )
    flip_pointer(store, profile, renewed, etag, high_water)
    return {
        "version": manifest.version,
        "sequence": renewed.sequence,
        "not_after": renewed.not_after,
    }
