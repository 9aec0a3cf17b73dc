"""Writing a release's files: the answer objects (by content), the key index with its proofs,
the FAISS and Parquet shards and the digests file, from rows and vectors read a part at a time
(``ReleaseRows``), holding one shard and the (key, digest) pairs, never the release's text
(``build.py`` builds what it writes)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.answer_objects import (
    KEY_DIGITS,
    answer_object,
    bucket_entries,
    bucket_file,
    bucket_leaf,
    bucket_path,
    canonical_json,
    object_path,
)
from base.manifest import MAX_SHARD_FILE_BYTES, Objects, ShardEntry
from base.proofs import MerkleTree
from base.release import row_schema, sha256_hex, shard_paths
from precompute.config import BuildConfig

if TYPE_CHECKING:
    import faiss


def factory_for(config: BuildConfig, rows: int) -> str:
    if config.factory != "auto":
        return config.factory
    if rows >= config.ivf_rows:
        return f"IVF{min(max(int(4 * math.sqrt(rows)), 256), 4096)},Flat"
    return "HNSW32,Flat"


def shard_rows_for(config: BuildConfig, dim: int) -> int:
    """Rows per shard: ``shard_rows``, and few enough that a shard's index stays well under
    what readers accept (``MAX_SHARD_FILE_BYTES``: a 384-d float vector and its graph links are
    ~2 KB, so ~470,000 rows a shard)."""
    per_row = 4 * max(dim, 1) + 512  # the vector, and an HNSW node's links (M=32) or IVF ids
    return max(1, min(config.shard_rows, int(0.9 * MAX_SHARD_FILE_BYTES) // per_row))


def new_index(dim: int, factory: str, config: BuildConfig) -> faiss.Index:
    """An empty inner-product index of ``factory`` with the build's search settings."""
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    inner = faiss.downcast_index(index)
    if hasattr(inner, "hnsw"):
        inner.hnsw.efConstruction = config.ef_construction
        inner.hnsw.efSearch = config.ef_search
    if hasattr(inner, "nprobe"):
        inner.nprobe = config.nprobe
    return index


def training_positions(index: faiss.Index, rows: int) -> np.ndarray | None:
    """Which of ``rows`` vectors train ``index`` (sorted): at most 64 a list -- enough for the
    centroids, minutes faster; None when it needs no training."""
    import faiss

    if index.is_trained:
        return None
    nlist = getattr(faiss.downcast_index(index), "nlist", 1)
    if rows <= 64 * nlist:
        return np.arange(rows)
    return np.sort(np.random.default_rng(0).choice(rows, 64 * nlist, replace=False))


def build_index(vectors: np.ndarray, factory: str, config: BuildConfig) -> faiss.Index:
    index = new_index(vectors.shape[1], factory, config)
    chosen = training_positions(index, len(vectors))
    if chosen is not None:
        index = _train(index, vectors if len(chosen) == len(vectors) else vectors[chosen])
    index.add(vectors)
    return index


def _train(index: faiss.Index, vectors: np.ndarray) -> faiss.Index:
    import faiss

    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        resources = faiss.StandardGpuResources()
        gpu = faiss.index_cpu_to_gpu(resources, 0, index)
        gpu.train(vectors)
        return faiss.index_gpu_to_cpu(gpu)
    index.train(vectors)
    return index


def content_sha256(rows: Iterable[dict[str, Any]]) -> str:
    """What a release answers (each phrasing's key, answer and cluster), hashed: the version's
    suffix."""
    content = hashlib.sha256()
    for row in rows:
        content.update(canonical_json([row["key"], row["answer"], row["cluster"]]))
    return content.hexdigest()


PART_ROWS = 65_536


@dataclass(frozen=True)
class ReleaseRows:
    """A release's rows (``base.release.row_schema``'s fields) and their vectors, in release
    order, read a part at a time as often as the writer asks (``parts``: a fresh iterator of
    (rows, their vectors) each call). The writer holds one shard's index and rows at most, never
    the release's: rows may come from memory (``in_memory``) or from a store, part by part."""

    count: int
    dim: int
    parts: Callable[[], Iterator[tuple[list[dict[str, Any]], np.ndarray]]]

    @classmethod
    def in_memory(cls, rows: list[dict[str, Any]], vectors: np.ndarray) -> ReleaseRows:
        def parts() -> Iterator[tuple[list[dict[str, Any]], np.ndarray]]:
            for start in range(0, len(rows), PART_ROWS):
                yield rows[start : start + PART_ROWS], vectors[start : start + PART_ROWS]

        return cls(len(rows), int(vectors.shape[1]) if vectors.ndim == 2 else 0, parts)

    def rows(self) -> Iterator[dict[str, Any]]:
        for part, _ in self.parts():
            yield from part

    def content_sha256(self) -> str:
        return content_sha256(self.rows())

    def vectors_at(self, positions: np.ndarray, offset: int = 0) -> np.ndarray:
        """The vectors at ``positions`` (sorted) counted from row ``offset``, in one pass."""
        out = np.empty((len(positions), self.dim), dtype=np.float32)
        wanted = np.asarray(positions, dtype=np.int64) + offset
        start = taken = 0
        for _, vectors in self.parts():
            stop = start + len(vectors)
            upto = int(np.searchsorted(wanted, stop))
            if upto > taken:
                out[taken:upto] = vectors[wanted[taken:upto] - start]
                taken = upto
            start = stop
            if taken == len(wanted):
                break
        if taken != len(wanted):
            raise ValueError(f"the release's rows end at {start}, before row {wanted[taken]}")
        return out


class _ShardWriter:
    """One shard being written: its rows (Arrow batches, ids from 0) and its index, trained on
    its sample first and then filled part by part. An index that needs no training (a graph)
    is filled in one call, as ``build_index`` fills it, so it comes out the same."""

    def __init__(
        self, number: int, start: int, stop: int, source: ReleaseRows, config: BuildConfig
    ) -> None:
        self.number, self.start, self.stop = number, start, stop
        self.index = new_index(source.dim, factory_for(config, stop - start), config)
        chosen = training_positions(self.index, stop - start)
        if chosen is not None:
            self.index = _train(self.index, source.vectors_at(chosen, start))
        self._held: list[np.ndarray] | None = None if chosen is not None else []
        self._batches: list[Any] = []
        self._written = 0

    def add(self, rows: list[dict[str, Any]], vectors: np.ndarray) -> None:
        import pyarrow as pa

        ids = range(self._written, self._written + len(rows))
        self._batches.append(
            pa.RecordBatch.from_pylist(
                [{**r, "id": i} for i, r in zip(ids, rows, strict=True)], schema=row_schema()
            )
        )
        self._written += len(rows)
        if self._held is None:
            self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        else:
            self._held.append(vectors)

    def finish(self, staging: Path) -> ShardEntry:
        import faiss
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._held:
            self.index.add(np.ascontiguousarray(np.concatenate(self._held), dtype=np.float32))
        self._held = None
        index_path, rows_path = shard_paths(self.number)
        (staging / index_path).parent.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(staging / index_path))  # not copied in memory first
        table = pa.Table.from_batches(self._batches, schema=row_schema())
        self._batches = []
        pq.write_table(table, staging / rows_path, compression="zstd")
        return ShardEntry.of(
            {
                "id": self.number,
                "count": self.stop - self.start,
                "index": _file_entry(staging, index_path),
                "rows": _file_entry(staging, rows_path),
            }
        )


def _file_entry(staging: Path, path: str) -> dict[str, Any]:
    with (staging / path).open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"path": path, "bytes": (staging / path).stat().st_size, "sha256": digest}


DIGESTS = "objects/digests.parquet"


def write_release_files(
    staging: Path, source: ReleaseRows, version: str, profile: str, config: BuildConfig
) -> tuple[list[ShardEntry], Objects, str]:
    """The answer objects, the FAISS and Parquet shards, the key index and the digests file of
    ``source``'s rows under ``staging`` (``a/``, ``shards/``, ``k/``, ``objects/``); (the
    manifest's shard entries, its ``objects`` entry, the answers root). Each row's
    ``object_sha256`` is its object's digest and name. One pass over the rows, and one over a
    shard's vectors to train its index: what is held is one shard and the rows' (key, digest)
    pairs (~130 bytes a row as Arrow, twice while they are sorted), whatever the release's size."""
    import pyarrow as pa

    staging.mkdir(parents=True, exist_ok=True)
    per_shard = shard_rows_for(config, source.dim)
    shards: list[ShardEntry] = []
    shard: _ShardWriter | None = None
    position = 0
    pairs: list[pa.RecordBatch] = []
    for rows, vectors in source.parts():
        if len(rows) != len(vectors):
            raise ValueError(f"a part of {len(rows)} rows came with {len(vectors)} vectors")
        for row in rows:
            data = answer_object(row, profile)
            row["object_sha256"] = digest = sha256_hex(data)
            target = staging / object_path(digest)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        pairs.append(
            pa.record_batch(
                [
                    pa.array([r["key"] for r in rows], pa.string()),
                    pa.array([r["object_sha256"] for r in rows], pa.string()),
                ],
                names=["key", "sha256"],
            )
        )
        taken = 0
        while taken < len(rows):
            if shard is None:
                start = position + taken
                shard = _ShardWriter(
                    len(shards), start, min(start + per_shard, source.count), source, config
                )
            upto = min(len(rows), shard.stop - position)
            shard.add(rows[taken:upto], vectors[taken:upto])
            taken = upto
            if position + taken == shard.stop:
                shards.append(shard.finish(staging))
                shard = None
        position += len(rows)
    if position != source.count:
        raise ValueError(f"the release has {position} rows, not the {source.count} stated")
    table = pa.Table.from_batches(
        pairs, schema=pa.schema([("key", pa.string()), ("sha256", pa.string())])
    )
    buckets, root = _write_key_index(staging, table, version, profile)
    _write_digests(staging, table.column("sha256"))
    objects = Objects.of(
        {
            "prefix": "a/",
            "count": source.count,
            "integrity": "rows.object_sha256",
            "index": "k/",
            "buckets": buckets,
            "key_digits": KEY_DIGITS,
            "digests": _file_entry(staging, DIGESTS),
        }
    )
    return shards, objects, root


def _write_key_index(staging: Path, pairs: Any, version: str, profile: str) -> tuple[int, str]:
    """``k/<bucket>.json`` for every bucket the keys fall in, each with its proof to the root
    over them all; (the buckets written, the root). The pairs stay Arrow, sorted by key; a
    bucket's lines are made when it is hashed and again when it is written."""
    import pyarrow.compute as pc

    ordered = pairs.sort_by("key")
    keys, digests = ordered.column("key"), ordered.column("sha256")
    if pc.count_distinct(keys).as_py() != len(keys):
        raise ValueError("a key is in the release twice")
    spans: list[tuple[str, int, int]] = []  # (bucket, first row, row after): a part's keys
    for start in range(0, len(keys), PART_ROWS):  # as strings at a time, never the release's
        for at, key in enumerate(keys.slice(start, PART_ROWS).to_pylist(), start):
            if spans and spans[-1][0] == key[:KEY_DIGITS]:
                spans[-1] = (spans[-1][0], spans[-1][1], at + 1)
            else:
                spans.append((key[:KEY_DIGITS], at, at + 1))

    def entries(first: int, after: int) -> str:
        part = zip(
            keys.slice(first, after - first).to_pylist(),
            digests.slice(first, after - first).to_pylist(),
            strict=True,
        )
        return bucket_entries(part)

    tree = MerkleTree(bucket_leaf(profile, version, b, entries(lo, hi)) for b, lo, hi in spans)
    for position, (bucket, first, after) in enumerate(spans):
        target = staging / bucket_path(bucket)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(
            bucket_file(profile, version, bucket, entries(first, after), tree.proof(position))
        )
    return len(spans), tree.root


def _write_digests(staging: Path, digests: Any) -> None:
    """``objects/digests.parquet``: every object's sha256 as 32 bytes, sorted, once each."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    unique = pc.unique(digests)
    unique = unique.take(pc.sort_indices(unique))
    raw = bytearray()
    for start in range(0, len(unique), PART_ROWS):  # a part's strings at a time
        raw += bytes.fromhex("".join(unique.slice(start, PART_ROWS).to_pylist()))
    column = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(32), len(unique), [None, pa.py_buffer(bytes(raw))]
    )
    (staging / DIGESTS).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"sha256": column}), staging / DIGESTS, compression="none")
