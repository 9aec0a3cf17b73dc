"""What ``edgeqa release list``, ``show`` and ``diff`` say of releases (``releases.py``), as typed
models that hold the manifest's own (``base.manifest``: the ``Threshold``, the profile, the
embedder...) as they were read, never turned back into dicts.

``as_json()`` is what ``--json`` prints (scripts read it: its field names are kept): a manifest
model nested in a view is written as the manifest holds it (``Document.as_dict``: the fields it
has, under their JSON names); ``list`` and ``diff`` write the threshold's main fields only
(``CALIBRATION``). ``report.py`` renders its page from the same models.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, PlainSerializer, StrictBool, StrictInt, StrictStr

from base.manifest import (
    Counts,
    Derived,
    Document,
    EmbedderEntry,
    Expiry,
    IndexSettings,
    LogRange,
    Manifest,
    ProfileEntry,
    Threshold,
)

# the threshold's fields ``list`` and ``diff`` show (whether the semantic tier serves first)
CALIBRATION = (
    "semantic",
    "semantic_off_reason",
    "value",
    "margin",
    "agreement",
    "calibrated",
    "precision",
    "hit_rate",
)


def _as_read(document: Document) -> dict[str, Any]:
    return document.as_dict()


def _calibration(threshold: Threshold) -> dict[str, Any]:
    return {name: getattr(threshold, name) for name in CALIBRATION}


# a manifest model in a view, written to JSON as the manifest holds it
AsRead = PlainSerializer(_as_read)
# the threshold, written as ``CALIBRATION``'s fields (with the readers' defaults)
Calibration = Annotated[Threshold, PlainSerializer(_calibration)]


class View(BaseModel):
    """A view of releases: ``as_json`` is what ``--json`` prints."""

    def as_json(self) -> Any:
        return self.model_dump(mode="json")


def as_json(value: Any) -> Any:
    """``value`` as ``--json`` prints it: a view (or a list of views), or any model with an
    ``as_json`` (``edge_index.explain.Explanation``), as its ``as_json``; anything else as it is."""
    if hasattr(value, "as_json"):
        return value.as_json()
    if isinstance(value, list) and all(hasattr(item, "as_json") for item in value):
        return [item.as_json() for item in value]
    return value


def describe_semantic_tier(threshold: Threshold) -> str:
    """Whether a release's semantic tier serves, and why not, as ``release show``, ``release
    list`` and the HTML report say it first: its threshold and precision mean nothing to the
    edge when it is off."""
    if threshold.semantic:
        return "semantic tier: on"
    # the edge reads a manifest without the flag as off, too (``ReleaseIndex``)
    reason = threshold.semantic_off_reason or "the manifest records no reason"
    return f"semantic tier: OFF ({reason})"


class ReleaseSummary(View):
    """A kept release, as ``release list`` lists it."""

    version: StrictStr
    current: StrictBool
    created_at: StrictStr
    parent: StrictStr | None
    entries: StrictInt
    clusters: StrictInt
    calibration: Calibration
    signed_by: StrictStr | None
    derived: Annotated[Derived, AsRead] | None

    @classmethod
    def of(cls, manifest: Manifest, current: bool, signed_by: str | None) -> ReleaseSummary:
        return cls(
            version=manifest.version,
            current=current,
            created_at=manifest.created_at,
            parent=manifest.parent,
            entries=manifest.counts.rows,
            clusters=manifest.counts.clusters,
            calibration=manifest.threshold,
            signed_by=signed_by,
            derived=manifest.derived,
        )


class Row(BaseModel):
    """A published phrasing, as a release's rows hold it (``base.release.row_schema``)."""

    key: StrictStr
    question: StrictStr
    answer: StrictStr
    cluster: StrictStr
    canonical: StrictBool
    hits: StrictInt
    users: StrictInt
    expires_at: datetime


ROW_FIELDS = tuple(Row.model_fields)


class ReleaseCounts(Counts):
    """The manifest's counts, and how many of its rows have expired by now."""

    expired: StrictInt


class Excluded(View):
    """What was left out, by reason: log rows at mining, clusters at generation and build."""

    rows: dict[str, int]
    clusters: dict[str, int]


class TopQuestion(View):
    question: StrictStr
    hits: StrictInt
    users: StrictInt
    cluster: StrictStr
    canonical: StrictBool


class ClusterPhrasing(View):
    question: StrictStr
    hits: StrictInt
    canonical: StrictBool


class TopCluster(View):
    """A most asked cluster: its answer and every phrasing, most asked first."""

    cluster: StrictStr
    hits: StrictInt
    answer: StrictStr
    phrasings: list[ClusterPhrasing]


class ReleaseView(View):
    """One release, as ``release show`` shows it: what went in and what was left out at each
    stage, its calibration (the whole threshold), its profile, its most asked questions."""

    version: StrictStr
    current: StrictBool
    created_at: StrictStr
    parent: StrictStr | None
    derived: Annotated[Derived, AsRead] | None
    runner: StrictStr | None
    log_range: Annotated[LogRange, AsRead] | None
    counts: Annotated[ReleaseCounts, AsRead]
    excluded: Excluded
    calibration: Annotated[Threshold, AsRead]
    profile: Annotated[ProfileEntry, AsRead]
    embedder: Annotated[EmbedderEntry, AsRead]  # its files left out
    index: Annotated[IndexSettings, AsRead]
    expiry: Annotated[Expiry, AsRead]
    signed_by: StrictStr | None
    top_questions: list[TopQuestion]
    top_clusters: list[TopCluster]

    @property
    def answering_model(self) -> str:
        """The model that answered (the profile's input), '' when it names none."""
        return self.profile.model


class DiffCounts(View):
    added: StrictInt
    dropped: StrictInt
    changed: StrictInt
    unchanged: StrictInt
    phrasings_gained: StrictInt
    phrasings_lost: StrictInt


class ClusterBrief(View):
    """A cluster: its canonical question and how many phrasings it has."""

    cluster: StrictStr
    question: StrictStr
    phrasings: StrictInt


class ChangedCluster(ClusterBrief):
    old_answer: StrictStr
    new_answer: StrictStr


class CalibrationChange(View):
    old: Calibration
    new: Calibration


class ReleaseDiff(View):
    """What changed from ``old`` to ``new``, by cluster, as ``release diff`` shows it."""

    old: StrictStr
    new: StrictStr
    counts: DiffCounts
    added: list[ClusterBrief]
    dropped: list[ClusterBrief]
    changed: list[ChangedCluster]
    calibration: CalibrationChange
