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
Readers (``load_release``) verify the chain and refuse a release that breaks it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_index.errors import EdgeQAError
from edge_index.store import ObjectNotFoundError, Store, sha256_hex

if TYPE_CHECKING:
    import faiss
    import pyarrow as pa

FORMAT = 1
POINTER = "current.json"


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
        ]
    )


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def answer_object(row: dict[str, Any], version: str, profile: str) -> bytes:
    """The exact-tier object served by the CDN for one phrasing's key."""
    return canonical_json(
        {
            "key": row["key"],
            "question": row["question"],
            "answer": row["answer"],
            "version": version,
            "profile": profile,
            "generated_at": row["generated_at"].isoformat(),
            "expires_at": row["expires_at"].isoformat(),
        }
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
        data, etag = store.get_with_etag(pointer_path(profile))
    except ObjectNotFoundError:
        return None, None
    try:
        pointer = json.loads(data)
        if not isinstance(pointer, dict) or "version" not in pointer:
            raise ValueError("no version")
    except ValueError as error:
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
        for path, data in self.embedder_files.items():
            target = folder / path.removeprefix("embedder/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return folder

    @property
    def version(self) -> str:
        return str(self.manifest["version"])


def read_manifest(store: Store, profile: str, version: str) -> tuple[dict[str, Any], str]:
    try:
        data = store.get(f"{release_prefix(profile, version)}/manifest.json")
    except ObjectNotFoundError:
        raise ReleaseError(f"release {profile}/{version} has no manifest.json") from None
    try:
        manifest = json.loads(data)
    except ValueError as error:
        raise ReleaseError(f"release {profile}/{version}: manifest.json: {error}") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != version:
        raise ReleaseError(f"release {profile}/{version}: unexpected manifest format or version")
    return manifest, sha256_hex(data)


def _checked(store: Store, path: str, entry: dict[str, Any]) -> bytes:
    try:
        data = store.get(path)
    except ObjectNotFoundError:
        raise ReleaseError(f"{path} is missing") from None
    if len(data) != entry["bytes"] or sha256_hex(data) != entry["sha256"]:
        raise ReleaseError(f"{path} does not match its sha256 in the manifest")
    return data


def load_release(
    store: Store,
    profile: str,
    version: str | None = None,
    expected_manifest_sha256: str | None = None,
    check_objects: bool = False,
) -> LoadedRelease:
    """Load and verify a release (the pointer's when ``version`` is None).

    Every shard file is checked against the manifest, and the manifest against the pointer's
    ``manifest_sha256``; ``check_objects`` also fetches and checks every answer object.
    """
    import pyarrow.parquet as pq

    if version is None:
        pointer, _ = read_pointer(store, profile)
        if pointer is None:
            raise ReleaseError(f"nothing published yet for profile {profile!r}")
        version = str(pointer["version"])
        expected_manifest_sha256 = pointer.get("manifest_sha256")
    manifest, manifest_sha = read_manifest(store, profile, version)
    if expected_manifest_sha256 is not None and manifest_sha != expected_manifest_sha256:
        raise ReleaseError(f"release {profile}/{version}: manifest.json does not match the pointer")
    prefix = release_prefix(profile, version)
    shards = []
    for entry in manifest["shards"]:
        index = deserialize_index(
            _checked(store, f"{prefix}/{entry['index']['path']}", entry["index"])
        )
        rows = pq.read_table(
            io.BytesIO(_checked(store, f"{prefix}/{entry['rows']['path']}", entry["rows"]))
        )
        if index.ntotal != rows.num_rows or rows.num_rows != entry["count"]:
            raise ReleaseError(f"{prefix}: shard {entry['id']} index and rows disagree")
        shards.append(Shard(index, rows))
        if check_objects:
            for key, digest in zip(
                rows.column("key").to_pylist(),
                rows.column("object_sha256").to_pylist(),
                strict=True,
            ):
                path = f"{prefix}/{object_path(key)}"
                try:
                    data = store.get(path)
                except ObjectNotFoundError:
                    raise ReleaseError(f"{path} is missing") from None
                if sha256_hex(data) != digest:
                    raise ReleaseError(f"{path} does not match its row's object_sha256")
    embedder_files = {
        entry["path"]: _checked(store, f"{prefix}/{entry['path']}", entry)
        for entry in manifest.get("embedder", {}).get("files", [])
    }
    return LoadedRelease(manifest, manifest_sha, shards, embedder_files)
