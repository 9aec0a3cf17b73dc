"""What a night's run takes from the release it builds on (the parent, the current one of its
profile): the evidence its run mined (``hot/``, carried forward by mining) and the answers
its run flagged (never generated again)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

from base.highwater import HighWater, checked_sequence
from base.manifest import Manifest
from base.release import (
    LoadedRelease,
    ReleaseError,
    load_release,
    read_pointer,
    release_prefix,
)
from base.signing import verifying_keys
from base.store import ObjectNotFoundError, Store
from precompute.config import PrecomputeSettings
from precompute.generate import left_out, read_partitions
from precompute.questions import HotQuestion, Phrasing
from precompute.workarea import WorkArea

log = logging.getLogger(__name__)


def current_release(
    store: Store,
    profile: str,
    public_keys: tuple[str, ...] = (),
    high_water: HighWater | None = None,
) -> LoadedRelease | None:
    """The release a run builds on: the current one, its pointer and manifest verified with
    ``public_keys`` (the readers' and the signer's); None before the first, or when it does not
    load (the run then carries and reuses nothing, and may replace it). ``HighWaterError`` when
    ``high_water`` holds a mark and the pointer is below it, unverified or missing: the night
    stops before it builds on (and would sign) a store a bucket writer rolled back."""
    try:
        pointer, _ = read_pointer(store, profile)
    except ReleaseError as error:  # refused below once a mark is recorded
        log.warning("the pointer of %s is unreadable (%s); nothing is carried", profile, error)
        pointer = None
    checked_sequence(pointer, profile, public_keys, high_water)
    if pointer is None:
        return None
    try:
        return load_release(
            store, profile, pointer.version, pointer.manifest_sha256 or "", public_keys
        )
    except ReleaseError as error:
        log.warning("the current release of %s does not load (%s); nothing carried", profile, error)
        return None


def night_parent(store: Store, profile: str, settings: PrecomputeSettings) -> LoadedRelease | None:
    """``current_release`` as a night reads it: verified with the readers' keys and the
    signer's, its pointer checked against ``EDGEQA_HIGH_WATER_URI``'s mark."""
    keys = verifying_keys(settings.signer(), settings.public_keys)
    return current_release(store, profile, keys, settings.high_water())


def _parent_work(store: Store, parent: LoadedRelease | None) -> WorkArea | None:
    """The work area of the run that built ``parent`` (a derived release names its source's)."""
    if parent is None or parent.manifest.run_id is None:
        return None
    return WorkArea(store, parent.manifest.profile.name, parent.manifest.run_id)


def parent_phrasings(store: Store, parent: LoadedRelease | None) -> Iterator[Phrasing]:
    """What the parent release's run mined (its work area's ``hot/``, never published): the
    wordings of its clusters, published or held back, with their hashed users and networks and
    the time of each one's latest ask, read a part at a time. None when the run's work area is
    gone (pruned, or a release made elsewhere). A run mined before ``hot/`` was Parquet left
    ``hot.json``: read once, the night after the upgrade."""
    work = _parent_work(store, parent)
    if work is None:
        return
    try:
        parts = work.hot_tables()
        first = next(parts)  # raises when the run has no ``hot/``
    except ObjectNotFoundError:
        try:
            items = work.get_json("hot.json")
        except ObjectNotFoundError:
            return
        for item in items:
            yield from HotQuestion.from_dict(item).wordings
        return
    for table in itertools.chain([first], parts):
        for row in table.to_pylist():
            yield from HotQuestion.from_row(row).wordings


def parent_flagged(store: Store, parent: LoadedRelease | None) -> list[dict[str, Any]]:
    """The answers the parent release's run generated and left out (``generate.left_out``:
    flagged, or sending the reader elsewhere), never published."""
    work = _parent_work(store, parent)
    return [row for row in read_partitions(work) if left_out(row)] if work else []


def parent_rows(work: WorkArea, parent: str | None) -> int | None:
    """The rows of release ``parent`` of the work area's profile (None: none, or gone)."""
    if not parent:
        return None
    try:
        data = work.store.get(f"{release_prefix(work.profile, parent)}/manifest.json")
    except ObjectNotFoundError:
        return None
    return Manifest.from_json(data).counts.rows
