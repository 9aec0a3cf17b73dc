"""Release profiles: which one a service serves for a language, and the embedder it is read with.

A profile is one stream of releases (``<store>/<profile>/current.json``). Its language is its
current manifest's ``profile.inputs.language`` (``en`` for a release made before languages);
``resolve_profile`` finds, for a language, the newest profile the store holds (among those
``EDGEQA_PROFILE`` names, when it names some). ``load_index`` loads a profile's release ready for
lookups with ``embedder_for`` its embedder: the one the release ships (fine-tuned), else the
service's, which must be the built-in embedder the release was built with.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from base.errors import EdgeQAError
from base.release import (
    LoadedRelease,
    ReleaseError,
    load_release,
    read_manifest,
    read_pointer,
)
from base.store import ObjectNotFoundError, Store
from edge_index.lookup import ReleaseIndex

if TYPE_CHECKING:
    from semantic.embedder import Embedder


class NoProfileError(EdgeQAError, ValueError):
    """The store holds no profile yet, or several and none was named."""


def load_index(
    store: Store,
    profile: str,
    embedder: Embedder,
    public_keys: tuple[str, ...] = (),
    embedder_spec: str | None = None,
    version: str | None = None,
    manifest_sha256: str | None = None,
) -> ReleaseIndex:
    """A release (the pointer's when ``version`` is None; with ``manifest_sha256``, that
    manifest's), verified and ready for lookups, as the edge and the origin serve it
    (``edgeqa release explain`` uses the same)."""
    release = load_release(store, profile, version, manifest_sha256, public_keys=public_keys)
    return ReleaseIndex(release, embedder_for(release, embedder, embedder_spec))


def embedder_for(release: LoadedRelease, default: Embedder, spec: str | None = None) -> Embedder:
    """The release's own embedder when it ships one (fine-tuned), else ``default`` (what
    ``spec`` names), which must be the one the release was embedded with: the same built-in
    name (``embedded``, ``multilingual``), and in any case vectors of the release's dimension."""
    from semantic.embedder import BUILT_IN
    from semantic.loading import load_embedder

    recorded = release.manifest.embedder
    # the files are read once, at load: the folder goes when the embedder is in memory
    with tempfile.TemporaryDirectory(prefix="edgeqa-embedder-") as scratch:
        folder = release.write_embedder(Path(scratch))
        embedder = load_embedder(str(folder)) if folder else default
    name = recorded.name
    if not folder and spec is not None and name != spec and (name in BUILT_IN or spec in BUILT_IN):
        raise ValueError(
            f"the release was embedded with {name!r}, this service embeds its language's "
            f"questions with {spec!r} (EDGEQA_EMBEDDER)"
        )
    dim = embedder.get_embedding_dimension()
    if dim != recorded.dim:
        raise ValueError(
            f"the release was embedded with {name!r} ({recorded.dim}-d), the edge's embedder "
            f"is {dim}-d"
        )
    return embedder


def store_profiles(store: Store) -> list[str]:
    """The profiles the store holds a pointer for."""
    return sorted({p.split("/", 1)[0] for p in store.list() if p.endswith("/current.json")})


def profile_language(store: Store, profile: str) -> tuple[str, str] | None:
    """The language of ``profile``'s current release (``en`` for a release made before
    languages) and its version; None when it has no pointer. Not verified: this only routes; the
    release is verified when it loads."""
    pointer, _ = read_pointer(store, profile)
    if pointer is None:
        return None
    manifest, _ = read_manifest(store, profile, pointer.version)
    return (manifest.profile.language, pointer.version)


def resolve_profile(
    store: Store,
    profile: str | None,
    language: str | None = None,
    candidates: tuple[str, ...] = (),
) -> str:
    """The profile to serve: ``profile`` when given; else, with ``language``, the newest of that
    language's profiles (among ``candidates`` when given, else all the store holds); without,
    the store's only profile."""
    if profile:
        return profile
    names = list(candidates) or store_profiles(store)
    if language is not None:
        found = []
        for name in names:
            try:
                described = profile_language(store, name)
            except (ReleaseError, ObjectNotFoundError, ValueError):
                continue  # refused when it is served, not here
            if described is not None and described[0] == language:
                found.append((described[1], name))
        if found:
            return max(found)[1]  # versions sort by the time they were built
        raise NoProfileError(
            f"no {language} release published in {store.uri} yet"
            + (f" among {sorted(names)}" if candidates else "")
        )
    if len(names) == 1:
        return names[0]
    if not names:
        raise NoProfileError(
            f"no release published in {store.uri} yet: set EDGEQA_PROFILE (or --profile) to wait "
            "for one"
        )
    raise NoProfileError(
        f"{store.uri} holds several profiles {names}: name one (EDGEQA_PROFILE, --profile) or "
        "its language (--language)"
    )
