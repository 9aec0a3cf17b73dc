"""The tier cascade, defined once, for every service that answers from a release.

    exact     the release's key map: the normalized question was published as is
    (caller)  an exact tier of the caller's own, by key: the origin's online cache
    semantic  the release's FAISS shards, the calibrated decision and the guard

The edge service calls it without a tier of its own; the origin with its online cache. The
caller has normalized and keyed the question (the key spec, ``base/keys.py``) and hands both in:
no tier computes them again. The semantic tier embeds the question (milliseconds of CPU), so
``lookup`` runs it in a worker thread and keeps the event loop free; the exact tiers are dict
lookups and run inline.

A client that has just missed at the edge says so to the origin (``base/missed.py``): when the
origin serves that very release for the question, it runs the cascade with ``release=False``,
its own tier only: the edge has just looked the question up in both of the release's tiers.
"""

from __future__ import annotations

from collections.abc import Callable

from anyio import to_thread

from edge_index.lookup import Hit, Miss, ReleaseIndex

ExactTier = Callable[[str], Hit | None]  # a key -> a hit, or None


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
    release: bool = True,
) -> Hit | Miss:
    """Every tier in order (``key`` is ``normalized``'s), from an event loop: the semantic tier
    runs in a worker thread. ``release=False``: the caller's own tier only (a miss past it has
    the reason ``skipped``), for a question this release's tiers have just missed."""
    hit = exact(index if release else None, key, own)
    if hit is not None:
        return hit
    if index is None:
        return Miss("no_release", None)
    if not release:
        return Miss("skipped", index.version)
    return await to_thread.run_sync(index.lookup_semantic, query, normalized, key)
