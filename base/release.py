"""The release format: an immutable folder of FAISS shards, Parquet rows and answer objects,
described completely by ``manifest.json``, and the mutable pointer ``current.json``.

```
<profile>/releases/<version>/manifest.json
<profile>/releases/<version>/shards/<nnnnn>.faiss     one FAISS index per shard
<profile>/releases/<version>/shards/<nnnnn>.parquet   rows aligned with the index ids
<profile>/releases/<version>/objects/digests.parquet  every answer object's sha256, sorted
<profile>/releases/<version>/k/<bbb>.json             the key index for the CDN (answer_objects.py)
<profile>/a/<hh>/<sha256>.json                        answer objects, by content, shared by releases
<profile>/current.json                                {"version", "manifest_sha256", ...}
```

Integrity is a chain: the pointer holds the manifest's sha256, the manifest holds the sha256 of
every shard file, and every row holds the sha256 of its answer object (``object_sha256``: its
name), so one hash at the top covers every byte of a release without a manifest line per
answer object. ``release_check.py`` checks a release whole where it is served.
Readers (``load_release``) verify the chain and refuse a release that breaks it. Whoever can write
the store can still write a manifest, so it is read into ``Manifest`` (``manifest.py``), which
holds its paths to the layout above (plain names under ``shards/`` and ``embedder/``, only data
formats: never a pickle) and its sizes to caps, before anything it names is fetched or parsed;
the pointer is read into ``Pointer`` (``pointers.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from base.errors import EdgeQAError
from base.manifest import PLAIN_NAME, FileEntry, FormatError, Manifest, ShardEntry
from base.pointers import Pointer
from base.signing import MAX_SIGNATURE_BYTES, SIGNATURE, SignatureError, verify_statement
from base.store import (
    ObjectNotFoundError,
    ObjectTooLargeError,
    Store,
    StoreError,
    parquet_table,
    sha256_hex,
)

if TYPE_CHECKING:
    import faiss
    import pyarrow as pa

POINTER = "current.json"
# How a browser may reuse a fetched ``current.json``: never without asking again (a conditional
# GET, which the CDN answers from its own copy for 30 s: ``s-maxage``). Without it a browser
# caches the pointer by heuristic (a tenth of its age: hours for a day-old pointer), so a
# revocation, a rollback or a new release would not reach it; a client's own pointer TTL spaces
# its asks.
POINTER_CACHE_CONTROL = "public, max-age=0, must-revalidate, s-maxage=30"

# the most a release object may be before it is fetched and parsed (its files' caps:
# ``manifest.py``)
MAX_POINTER_BYTES = 64 << 10
MAX_MANIFEST_BYTES = 16 << 20
MAX_ANSWER_OBJECT_BYTES = 1 << 20


class ReleaseError(EdgeQAError, RuntimeError):
    """A release is missing, incomplete or corrupt."""


def release_prefix(profile: str, version: str) -> str:
    return f"{profile}/releases/{version}"


def pointer_path(profile: str) -> str:
    return f"{profile}/{POINTER}"


def shard_paths(shard: int) -> tuple[str, str]:
    return f"shards/{shard:05d}.faiss", f"shards/{shard:05d}.parquet"


def row_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.int64()),
            ("key", pa.string()),
            ("question", pa.string()),
            ("normalized", pa.string()),
            ("answer", pa.string()),
            ("users", pa.int32()),
            ("hits", pa.int32()),
            ("generated_at", pa.timestamp("s", tz="UTC")),
            ("expires_at", pa.timestamp("s", tz="UTC")),
            ("cluster", pa.string()),  # key of the cluster's canonical phrasing
            ("canonical", pa.bool_()),
            ("object_sha256", pa.string()),
            # the checks the entry passed, comma-separated (``policy.answers.CHECKS``)
            ("checks", pa.string()),
        ]
    )


def serialize_index(index: faiss.Index) -> bytes:
    import faiss

    return faiss.serialize_index(index).tobytes()


def read_pointer(store: Store, profile: str) -> tuple[Pointer | None, str | None]:
    """The current pointer (validated: ``Pointer``) and its ETag, or (None, None) before the
    first publish."""
    try:
        data, etag = store.get_with_etag(pointer_path(profile), max_bytes=MAX_POINTER_BYTES)
    except ObjectNotFoundError:
        return None, None
    except ObjectTooLargeError:
        raise ReleaseError(f"{pointer_path(profile)} is over {MAX_POINTER_BYTES} bytes") from None
    try:
        return Pointer.from_json(data), etag
    except FormatError as error:
        raise ReleaseError(f"{pointer_path(profile)} is not a valid pointer: {error}") from None


def list_versions(store: Store, profile: str) -> list[str]:
    """Versions that have a manifest (complete uploads), oldest first: the release folders (one
    delimited listing), each asked for its manifest (``concurrency`` at once), never a listing
    of every object of every release."""
    from base.store import bounded_map

    prefix = f"{profile}/releases"
    folders = store.folders(prefix)
    complete = bounded_map(
        lambda v: store.exists(f"{prefix}/{v}/manifest.json"), folders, store.concurrency
    )
    return [v for v, whole in zip(folders, complete, strict=True) if whole]


@dataclass
class Shard:
    index: faiss.Index
    rows: pa.Table


@dataclass
class LoadedRelease:
    manifest: Manifest
    manifest_sha256: str
    shards: list[Shard]
    embedder_files: dict[str, bytes] = field(default_factory=dict)  # path -> verified bytes

    def write_embedder(self, folder: Path) -> Path | None:
        """The release's own (fine-tuned) embedder written to ``folder``; None if it has none."""
        if not self.embedder_files:
            return None
        root = folder.resolve()
        for path, data in self.embedder_files.items():
            target = (root / path.removeprefix("embedder/")).resolve()
            if not target.is_relative_to(root):  # member() refused it already; never write out
                raise ReleaseError(f"embedder file {path!r} leaves its folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return folder

    @property
    def version(self) -> str:
        return self.manifest.version


def read_manifest(store: Store, profile: str, version: str) -> tuple[Manifest, str]:
    """The manifest (validated: ``Manifest``) and its sha256."""
    manifest, data = _manifest(store, profile, version)
    return manifest, sha256_hex(data)


def _manifest(store: Store, profile: str, version: str) -> tuple[Manifest, bytes]:
    try:
        data = store.get(
            f"{release_prefix(profile, version)}/manifest.json", max_bytes=MAX_MANIFEST_BYTES
        )
    except ObjectNotFoundError:
        raise ReleaseError(f"release {profile}/{version} has no manifest.json") from None
    except ObjectTooLargeError:
        raise ReleaseError(
            f"release {profile}/{version}: manifest.json is over the {MAX_MANIFEST_BYTES} byte cap"
        ) from None
    try:
        manifest = Manifest.from_json(data)
    except FormatError as error:
        raise ReleaseError(f"release {profile}/{version}: manifest.json: {error}") from None
    if manifest.version != version:
        raise ReleaseError(f"release {profile}/{version}: the manifest is another version's")
    if manifest.profile.name != profile:
        # a signed release of another profile, copied here, is still not this profile's
        raise ReleaseError(f"release {profile}/{version}: the manifest is another profile's")
    return manifest, data


def _check_signature(
    store: Store,
    profile: str,
    version: str,
    manifest: Manifest,
    manifest_sha256: str,
    public_keys: tuple[str, ...],
) -> None:
    """``ReleaseError`` unless ``manifest.sig`` is one of the keys' signature of this release's
    statement (``signing.py``): this profile, this version, this manifest, its answers root."""
    path = f"{release_prefix(profile, version)}/{SIGNATURE}"
    try:
        signature: bytes | None = store.get(path, max_bytes=MAX_SIGNATURE_BYTES)
    except ObjectNotFoundError:
        signature = None
    except ObjectTooLargeError:
        raise ReleaseError(f"{path} is over {MAX_SIGNATURE_BYTES} bytes") from None
    try:
        signed = verify_statement(signature, public_keys)
    except SignatureError as error:
        raise ReleaseError(f"release {profile}/{version}: {error}") from None
    expected = {
        "profile": profile,
        "version": version,
        "manifest_sha256": manifest_sha256,
        "answers_root": manifest.answers_root,
    }
    for name, value in expected.items():
        if signed.get(name) != value:
            raise ReleaseError(f"release {profile}/{version}: the signature is for another {name}")


def _checked(store: Store, prefix: str, entry: FileEntry) -> bytes:
    """The bytes of ``entry`` (held to the layout when the manifest was read), never read past
    the size the manifest claims; ``ReleaseError`` unless they match its size and sha256."""
    path = f"{prefix}/{entry.path}"
    with _fetching(path):
        data = store.get(path, max_bytes=entry.size_bytes)
    _check_digest(path, entry, len(data), sha256_hex(data))
    return data


def _checked_index(store: Store, prefix: str, entry: FileEntry, mapped: bool) -> faiss.Index:
    """The index file ``entry`` names, as ``_checked`` checks it, read from the store into a
    private temporary file (mode 0700, removed at once) a chunk at a time and parsed from it
    only once its size and sha256 match: neither its bytes nor a copy of them is held (FAISS's
    ``deserialize_index`` copies the bytes it is handed into a vector first: a 733 MB shard
    was held three times). ``mapped``: an inverted file's lists are mapped from the file, not
    read (to check that it parses and how many rows it holds)."""
    import tempfile

    import faiss

    with tempfile.TemporaryDirectory(prefix="edgeqa-index-") as folder:
        local = Path(folder) / "index.faiss"
        _checked_file(store, prefix, entry, local)
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mapped else 0
        return faiss.read_index(str(local), flags)  # a mapping outlives the file's name


def _checked_file(store: Store, prefix: str, entry: FileEntry, local: Path) -> None:
    """``entry`` written to ``local`` a chunk at a time (``Store.get_file``), never past the size
    the manifest claims; ``ReleaseError`` unless it matches its size and sha256."""
    import hashlib

    path = f"{prefix}/{entry.path}"
    with _fetching(path):
        size = store.get_file(path, local, max_bytes=entry.size_bytes)
    with local.open("rb") as f:
        _check_digest(path, entry, size, hashlib.file_digest(f, "sha256").hexdigest())


@contextmanager
def _fetching(path: str) -> Iterator[None]:
    """A release file read from the store: missing, or larger than the manifest says, is a
    ``ReleaseError`` naming it."""
    try:
        yield
    except ObjectNotFoundError:
        raise ReleaseError(f"{path} is missing") from None
    except ObjectTooLargeError:
        raise ReleaseError(f"{path} is larger than the manifest says") from None


def _check_digest(path: str, entry: FileEntry, size: int, sha256: str) -> None:
    if size != entry.size_bytes or sha256 != entry.sha256:
        raise ReleaseError(f"{path} does not match its sha256 in the manifest")


def verified_manifest(
    store: Store,
    profile: str,
    version: str | None = None,
    expected_manifest_sha256: str | None = None,
    public_keys: Iterable[str] = (),
) -> tuple[Manifest, str]:
    """A release's manifest (the pointer's when ``version`` is None) and its sha256, checked
    against the pointer and, given ``public_keys``, against its signature: what may be trusted
    before anything the manifest names is fetched."""
    if version is None:
        pointer, _ = read_pointer(store, profile)
        if pointer is None:
            raise ReleaseError(f"nothing published yet for profile {profile!r}")
        version = pointer.version
        expected_manifest_sha256 = pointer.manifest_sha256
        if expected_manifest_sha256 is None:
            raise ReleaseError(f"{pointer_path(profile)} names no manifest_sha256")
    if not PLAIN_NAME.fullmatch(version):
        raise ReleaseError(f"release version {version!r:.200} is not a plain name")
    manifest, manifest_bytes = _manifest(store, profile, version)
    manifest_sha = sha256_hex(manifest_bytes)
    if expected_manifest_sha256 is not None and manifest_sha != expected_manifest_sha256:
        raise ReleaseError(f"release {profile}/{version}: manifest.json does not match the pointer")
    if public_keys:
        _check_signature(store, profile, version, manifest, manifest_sha, tuple(public_keys))
    return manifest, manifest_sha


def load_release(
    store: Store,
    profile: str,
    version: str | None = None,
    expected_manifest_sha256: str | None = None,
    public_keys: Iterable[str] = (),
) -> LoadedRelease:
    """Load and verify a release (the pointer's when ``version`` is None).

    Every shard file is checked against the manifest, and the manifest against the pointer's
    ``manifest_sha256`` and, given ``public_keys``, against its signature (``signing.py``: an
    unsigned release is then refused too). The answer objects are not fetched
    (``release_check.check_release`` checks them).
    """
    manifest, manifest_sha = verified_manifest(
        store, profile, version, expected_manifest_sha256, public_keys
    )
    prefix = release_prefix(profile, manifest.version)
    shards = [_shard(store, prefix, entry) for entry in manifest.shards]
    embedder_files = {e.path: _checked(store, prefix, e) for e in manifest.embedder.files}
    return LoadedRelease(manifest, manifest_sha, shards, embedder_files)


def _shard(store: Store, prefix: str, entry: ShardEntry) -> Shard:
    """Shard ``entry`` read and checked (its files against the manifest, index against rows)."""
    try:
        index = _checked_index(store, prefix, entry.index, mapped=False)
        rows = parquet_table(_checked(store, prefix, entry.rows))
    except (RuntimeError, OSError, ValueError) as error:  # faiss / arrow refusing the bytes
        if isinstance(error, ReleaseError | StoreError):
            raise
        raise ReleaseError(f"{prefix}: shard {_label(entry)} does not parse: {error}") from None
    if index.ntotal != rows.num_rows or rows.num_rows != entry.count:
        raise ReleaseError(f"{prefix}: shard {_label(entry)} index and rows disagree")
    return Shard(index, rows)


def _label(entry: ShardEntry) -> str:
    return "?" if entry.id is None else str(entry.id)
