"""The release format: an immutable folder of FAISS shards, Parquet rows and answer objects,
described completely by ``manifest.json``, and the mutable pointer ``current.json``.

```
<profile>/releases/<version>/manifest.json
<profile>/releases/<version>/shards/<nnnnn>.faiss     one FAISS index per shard
<profile>/releases/<version>/shards/<nnnnn>.parquet   rows aligned with the index ids
<profile>/releases/<version>/a/<key>.json             exact-tier answer objects for the CDN
<profile>/current.json                                {"version", "manifest_sha256", ...}
```

Integrity is a chain: the pointer holds the manifest's sha256, the manifest holds the sha256 of
every shard file, and every row holds the sha256 of its answer object (``object_sha256``), so one
hash at the top covers every byte of a release without a manifest line per answer object.
Readers (``load_release``) verify the chain and refuse a release that breaks it. Whoever can write
the store can still write a manifest, so before anything is fetched or parsed its paths are held to
the layout above (plain names under ``shards/`` and ``embedder/``, only data formats: never a
pickle) and its sizes to the caps below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_index.errors import EdgeQAError
from edge_index.proofs import proves
from edge_index.signing import MAX_SIGNATURE_BYTES, SIGNATURE, SignatureError, verify_statement
from edge_index.store import (
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

FORMAT = 2
POINTER = "current.json"

# the most a release object may claim (and be) before it is fetched, parsed or deserialized
MAX_POINTER_BYTES = 64 << 10
MAX_MANIFEST_BYTES = 16 << 20
MAX_SHARD_FILE_BYTES = 1 << 30
MAX_EMBEDDER_FILE_BYTES = 512 << 20
MAX_ANSWER_OBJECT_BYTES = 1 << 20
MAX_RELEASE_FILES = 4096  # shard and embedder files a manifest may list (each once)
MAX_RELEASE_BYTES = 64 << 30
# what each folder of a release may hold: data formats only (an embedder never ships pickles)
_SUFFIXES = {
    "shards": (".faiss", ".parquet"),
    "embedder": (".json", ".safetensors", ".txt", ".model", ".md"),
}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class ReleaseError(EdgeQAError, RuntimeError):
    """A release is missing, incomplete or corrupt."""


def release_prefix(profile: str, version: str) -> str:
    return f"{profile}/releases/{version}"


def pointer_path(profile: str) -> str:
    return f"{profile}/{POINTER}"


def shard_paths(shard: int) -> tuple[str, str]:
    return f"shards/{shard:05d}.faiss", f"shards/{shard:05d}.parquet"


def object_path(key: str) -> str:
    return f"a/{key}.json"


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
            # the checks the entry passed, comma-separated (``edge_index.answers.CHECKS``)
            ("checks", pa.string()),
        ]
    )


def serialize_index(index: faiss.Index) -> bytes:
    import faiss

    return faiss.serialize_index(index).tobytes()


def deserialize_index(data: bytes) -> faiss.Index:
    import faiss
    import numpy as np

    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


def read_pointer(store: Store, profile: str) -> tuple[dict[str, Any] | None, str | None]:
    """The current pointer and its ETag, or (None, None) before the first publish."""
    try:
        data, etag = store.get_with_etag(pointer_path(profile), max_bytes=MAX_POINTER_BYTES)
    except ObjectNotFoundError:
        return None, None
    except ObjectTooLargeError:
        raise ReleaseError(f"{pointer_path(profile)} is over {MAX_POINTER_BYTES} bytes") from None
    try:
        pointer = json.loads(data)
        if not isinstance(pointer, dict) or "version" not in pointer:
            raise ValueError("no version")
    except (ValueError, RecursionError) as error:
        raise ReleaseError(f"{pointer_path(profile)} is not a valid pointer: {error}") from None
    return pointer, etag


def list_versions(store: Store, profile: str) -> list[str]:
    """Versions that have a manifest (complete uploads), oldest first."""
    prefix = f"{profile}/releases"
    versions = set()
    for path in store.list(prefix):
        parts = path[len(prefix) + 1 :].split("/")
        if len(parts) == 2 and parts[1] == "manifest.json":
            versions.add(parts[0])
    return sorted(versions)


@dataclass
class Shard:
    index: faiss.Index
    rows: pa.Table


@dataclass
class LoadedRelease:
    manifest: dict[str, Any]
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
        return str(self.manifest["version"])


def read_manifest(store: Store, profile: str, version: str) -> tuple[dict[str, Any], str]:
    """The manifest and its sha256."""
    manifest, data = _manifest(store, profile, version)
    return manifest, sha256_hex(data)


def _manifest(store: Store, profile: str, version: str) -> tuple[dict[str, Any], bytes]:
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
        manifest = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise ReleaseError(f"release {profile}/{version}: manifest.json: {error}") from None
    if not isinstance(manifest, dict) or (manifest.get("format"), manifest.get("version")) != (
        FORMAT,
        version,
    ):
        raise ReleaseError(f"release {profile}/{version}: unexpected manifest format or version")
    named = manifest.get("profile")
    if not isinstance(named, dict) or named.get("name") != profile:
        # a signed release of another profile, copied here, is still not this profile's
        raise ReleaseError(f"release {profile}/{version}: the manifest is another profile's")
    return manifest, data


def _check_signature(
    store: Store,
    profile: str,
    version: str,
    manifest: dict[str, Any],
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
        "answers_root": manifest.get("answers_root"),
    }
    for name, value in expected.items():
        if signed.get(name) != value:
            raise ReleaseError(f"release {profile}/{version}: the signature is for another {name}")


def member(entry: Any) -> str:
    """A manifest file entry's path, once it is a plain file of its folder with an allowed type
    and a size under the folder's cap; ``ReleaseError`` otherwise (before anything is fetched)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise ReleaseError(f"manifest file entry {entry!r:.200} has no path")
    path = entry["path"]
    folder, _, rest = path.partition("/")
    suffixes = _SUFFIXES.get(folder, ())
    names = rest.split("/")
    if not suffixes or not all(_PLAIN_NAME.fullmatch(n) for n in names):
        raise ReleaseError(
            f"manifest path {path!r:.200} is not a plain file under {' or '.join(_SUFFIXES)}/"
        )
    if not path.endswith(suffixes):
        raise ReleaseError(
            f"manifest path {path!r:.200}: {folder}/ holds only {', '.join(suffixes)}"
        )
    size, digest = entry.get("bytes"), entry.get("sha256")
    cap = MAX_SHARD_FILE_BYTES if folder == "shards" else MAX_EMBEDDER_FILE_BYTES
    if type(size) is not int or not 0 <= size <= cap:
        raise ReleaseError(f"manifest path {path!r}: size {size!r:.40} is not within 0..{cap}")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ReleaseError(f"manifest path {path!r}: sha256 {digest!r:.80} is not a sha256")
    return path


def _entries(manifest: dict[str, Any], name: str) -> tuple[list[Any], list[Any]]:
    """The manifest's shard and embedder entries, every path and size checked (before any fetch)."""
    shards, embedder = manifest.get("shards"), manifest.get("embedder") or {}
    files = embedder.get("files", []) if isinstance(embedder, dict) else None
    if not isinstance(shards, list) or not isinstance(files, list):
        raise ReleaseError(f"release {name}: the manifest's shards or embedder files are not lists")
    paths = []
    for entry in shards:
        if not isinstance(entry, dict) or type(entry.get("count")) is not int:
            raise ReleaseError(f"release {name}: shard entry {entry!r:.200} is malformed")
        entry.setdefault("id", "?")
        paths += [member(entry.get("index")), member(entry.get("rows"))]
    paths += [member(entry) for entry in files]
    total = sum(e["bytes"] for s in shards for e in (s["index"], s["rows"]))
    total += sum(e["bytes"] for e in files)
    if len(paths) != len(set(paths)) or len(paths) > MAX_RELEASE_FILES:
        raise ReleaseError(f"release {name}: files listed twice, or more than {MAX_RELEASE_FILES}")
    if total > MAX_RELEASE_BYTES:
        raise ReleaseError(f"release {name}: {total} bytes listed, over {MAX_RELEASE_BYTES}")
    return shards, files


def _checked(store: Store, prefix: str, entry: Any) -> bytes:
    path = f"{prefix}/{member(entry)}"
    try:
        data = store.get(path, max_bytes=entry["bytes"])
    except ObjectNotFoundError:
        raise ReleaseError(f"{path} is missing") from None
    except ObjectTooLargeError:
        raise ReleaseError(f"{path} is larger than the manifest says") from None
    if len(data) != entry["bytes"] or sha256_hex(data) != entry["sha256"]:
        raise ReleaseError(f"{path} does not match its sha256 in the manifest")
    return data


def verified_manifest(
    store: Store,
    profile: str,
    version: str | None = None,
    expected_manifest_sha256: str | None = None,
    public_keys: Iterable[str] = (),
) -> tuple[dict[str, Any], str]:
    """A release's manifest (the pointer's when ``version`` is None) and its sha256, checked
    against the pointer and, given ``public_keys``, against its signature: what may be trusted
    before anything the manifest names is fetched."""
    if version is None:
        pointer, _ = read_pointer(store, profile)
        if pointer is None:
            raise ReleaseError(f"nothing published yet for profile {profile!r}")
        version = str(pointer["version"])
        expected_manifest_sha256 = pointer.get("manifest_sha256")
        if not isinstance(expected_manifest_sha256, str):
            raise ReleaseError(f"{pointer_path(profile)} names no manifest_sha256")
    if not _PLAIN_NAME.fullmatch(version):
        raise ReleaseError(f"release version {version!r:.200} is not a plain name")
    manifest, manifest_bytes = _manifest(store, profile, version)
    manifest_sha = sha256_hex(manifest_bytes)
    if expected_manifest_sha256 is not None and manifest_sha != expected_manifest_sha256:
        raise ReleaseError(f"release {profile}/{version}: manifest.json does not match the pointer")
    if public_keys:
        _check_signature(store, profile, version, manifest, manifest_sha, tuple(public_keys))
    return manifest, manifest_sha


OBJECT_WORKERS = 16  # answer objects fetched at once when a release is checked whole


def _check_objects(store: Store, prefix: str, rows: pa.Table, root: str) -> None:
    """Fetch every answer object of ``rows`` (``OBJECT_WORKERS`` at a time: a release of a
    million objects is a million round trips) and check it against its row's sha256 and the
    answers root; ``ReleaseError`` names the first bad one in row order."""
    from concurrent.futures import ThreadPoolExecutor

    def problem(item: tuple[str, str]) -> str | None:
        key, digest = item
        path = f"{prefix}/{object_path(key)}"
        try:
            data = store.get(path, max_bytes=MAX_ANSWER_OBJECT_BYTES)
        except ObjectNotFoundError:
            return f"{path} is missing"
        except ObjectTooLargeError:
            return f"{path} is over {MAX_ANSWER_OBJECT_BYTES} bytes"
        if sha256_hex(data) != digest:
            return f"{path} does not match its row's object_sha256"
        if not proves(json.loads(data), root):
            return f"{path}: its proof does not lead to the answers root"
        return None

    items = list(
        zip(rows.column("key").to_pylist(), rows.column("object_sha256").to_pylist(), strict=True)
    )
    with ThreadPoolExecutor(max_workers=OBJECT_WORKERS) as pool:
        for start in range(0, len(items), 64 * OBJECT_WORKERS):  # a bounded number in flight
            batch = items[start : start + 64 * OBJECT_WORKERS]
            for found in pool.map(problem, batch):  # in order; a store error is raised as is
                if found is not None:
                    raise ReleaseError(found)


def load_release(
    store: Store,
    profile: str,
    version: str | None = None,
    expected_manifest_sha256: str | None = None,
    check_objects: bool = False,
    public_keys: Iterable[str] = (),
) -> LoadedRelease:
    """Load and verify a release (the pointer's when ``version`` is None).

    Every shard file is checked against the manifest, and the manifest against the pointer's
    ``manifest_sha256`` and, given ``public_keys``, against its signature (``signing.py``: an
    unsigned release is then refused too); ``check_objects`` also fetches and checks every answer
    object.
    """

    manifest, manifest_sha = verified_manifest(
        store, profile, version, expected_manifest_sha256, public_keys
    )
    version = str(manifest["version"])
    prefix = release_prefix(profile, version)
    root = manifest.get("answers_root")
    if not isinstance(root, str):
        raise ReleaseError(f"release {profile}/{version}: the manifest names no answers_root")
    shards = []
    shard_entries, embedder_entries = _entries(manifest, f"{profile}/{version}")
    for entry in shard_entries:
        try:
            index = deserialize_index(_checked(store, prefix, entry["index"]))
            rows = parquet_table(_checked(store, prefix, entry["rows"]))
        except (RuntimeError, OSError, ValueError) as error:  # faiss / arrow refusing the bytes
            if isinstance(error, ReleaseError | StoreError):
                raise
            raise ReleaseError(f"{prefix}: shard {entry['id']} does not parse: {error}") from None
        if index.ntotal != rows.num_rows or rows.num_rows != entry["count"]:
            raise ReleaseError(f"{prefix}: shard {entry['id']} index and rows disagree")
        shards.append(Shard(index, rows))
        if check_objects:
            _check_objects(store, prefix, rows, root)
    embedder_files = {entry["path"]: _checked(store, prefix, entry) for entry in embedder_entries}
    return LoadedRelease(manifest, manifest_sha, shards, embedder_files)
