"""The tier cascade, defined once, for every service that answers from a release.

    exact     the release's key map: the normalized question was published as is
    (caller)  an exact tier of the caller's own, by key: the origin's online cache
    semantic  the release's FAISS shards, the calibrated decision and the guard

The edge service calls it without a tier of its own; the origin with its online cache. The
semantic tier embeds the question (milliseconds of CPU), so ``lookup`` runs it in a worker thread
and keeps the event loop free; the exact tiers are dict lookups and run inline.

A client that has just missed at the edge says so to the origin (``MISSED_HEADER``): the release
it missed against, ``<profile>/<version>`` (``missed_hint``, from the edge's miss body). When the
origin serves that very release for the question, it runs the cascade with ``semantic=False``:
the edge has embedded and searched it already. The value is untrusted (``parse_missed`` checks
its form): it can only make the origin skip that search, never serve what it would not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from anyio import to_thread

from edge_index.lookup import Hit, Miss, ReleaseIndex

ExactTier = Callable[[str], Hit | None]  # a key -> a hit, or None

MISSED_HEADER = "x-edgeqa-missed"
# a profile and a version are plain names, as the store's paths are (release.py)
_MISSED = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})/([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})")


@dataclass(frozen=True)
class Missed:
    """The release a client's lookup at the edge has just missed in."""

    profile: str
    version: str

    def __str__(self) -> str:
        return f"{self.profile}/{self.version}"


def missed_hint(profile: object, version: object) -> str | None:
    """The ``MISSED_HEADER`` value for an edge miss in ``profile``'s ``version`` (the miss body's
    fields), or None when they do not make one: no release was searched, or a name that is not
    plain (the origin would refuse it)."""
    if not isinstance(profile, str) or not isinstance(version, str):
        return None
    hint = f"{profile}/{version}"
    return hint if _MISSED.fullmatch(hint) else None


def parse_missed(value: str) -> Missed:
    """``<profile>/<version>``, each a plain name of at most 128 characters; ``ValueError``
    saying what is wrong otherwise."""
    found = _MISSED.fullmatch(value)
    if found is None:
        raise ValueError(
            f"{MISSED_HEADER} must be <profile>/<version> (each [A-Za-z0-9_][A-Za-z0-9_.-]*, at "
            f"most 128 characters), got {value[:80]!r}"
        )
    return Missed(found[1], found[2])


def exact(index: ReleaseIndex | None, key: str, own: ExactTier | None = None) -> Hit | None:
    """The exact tiers: the release's, then the caller's own."""
    hit = index.lookup_exact(key) if index is not None else None
    if hit is None and own is not None:
        hit = own(key)
    return hit


async def lookup(
    index: ReleaseIndex | None,
    query: str,
    normalized: str,
    key: str,
    own: ExactTier | None = None,
    semantic: bool = True,
) -> Hit | Miss:
    """Every tier in order (``key`` is ``normalized``'s), from an event loop: the semantic tier
    runs in a worker thread. ``semantic=False``: the exact tiers only (a miss past them has the
    reason ``skipped``), for a question this release's semantic tier has just missed."""
    hit = exact(index, key, own)
    if hit is not None:
        return hit
    if index is None:
        return Miss("no_release", None)
    if not semantic:
        return Miss("skipped", index.version)
    return await to_thread.run_sync(index.lookup_semantic, query, normalized)
