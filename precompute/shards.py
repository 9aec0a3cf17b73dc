"""Writing a release's files: the answer objects with their proofs, and the FAISS and Parquet
shards, from rows and vectors read a part at a time (``ReleaseRows``), holding one shard and the
Merkle tree's nodes, never the release (``build.py`` builds what it writes)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.answer_objects import answer_fields, answer_object, canonical_json
from base.manifest import MAX_SHARD_FILE_BYTES, ShardEntry
from base.proofs import MerkleTree, leaf
from base.release import object_path, row_schema, sha256_hex, shard_paths
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


def write_release_files(
    staging: Path, source: ReleaseRows, version: str, profile: str, config: BuildConfig
) -> tuple[list[ShardEntry], str]:
    """The answer objects (with their proofs) and the FAISS and Parquet shards of ``source``'s
    rows under ``staging``; (the manifest's shard entries, the answers root). Each row's
    ``object_sha256`` is its object's digest. Two passes over the rows (the proofs' leaves, then
    the files) and one over a shard's vectors to train its index: what is held is the Merkle
    tree's nodes and one shard, whatever the release's size."""
    staging.mkdir(parents=True, exist_ok=True)
    merkle = MerkleTree(leaf(answer_fields(row, version, profile)) for row in source.rows())
    if len(merkle) != source.count:
        raise ValueError(f"the release has {len(merkle)} rows, not the {source.count} stated")
    per_shard = shard_rows_for(config, source.dim)
    shards: list[ShardEntry] = []
    shard: _ShardWriter | None = None
    position = 0
    for rows, vectors in source.parts():
        if len(rows) != len(vectors):
            raise ValueError(f"a part of {len(rows)} rows came with {len(vectors)} vectors")
        for offset, row in enumerate(rows):
            data = answer_object(row, version, profile, merkle.proof(position + offset))
            row["object_sha256"] = sha256_hex(data)
            target = staging / object_path(row["key"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
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
    return shards, merkle.root
