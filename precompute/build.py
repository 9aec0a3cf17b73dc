"""Release building: mined clusters + generated answers -> a complete release in a local folder.

One row per published phrasing (every phrasing of a cluster is indexed under the cluster's
answer, so each has its own exact-tier object and its own vector). Embeddings are computed in
batches; rows are cut into shards of ``shard_rows`` (fewer when a shard's index would near the
1 GiB readers accept: ``shard_rows_for``) and each shard gets its own FAISS index
(``factory``: ``auto`` picks HNSW32 with efConstruction >= 200 below ``ivf_rows`` rows, and above
an IVF index trained on a sample of 64 points per list; any FAISS factory string works). IVF
training runs on a GPU through faiss-gpu when one is present. The semantic tier's decision is
calibrated on the release's own phrasings (``edge_index.matcher``). Expiry: ``generated_at +
ttl_days``, stretched by a jitter of up to ``ttl_jitter`` derived from the key, so entries do not
all expire at once and a rebuild from the same answers is identical.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.answer_objects import answer_fields, answer_object, canonical_json
from base.manifest import (
    FORMAT,
    MAX_SHARD_FILE_BYTES,
    EmbedderEntry,
    Finetuned,
    Manifest,
    ProfileEntry,
    ShardEntry,
    Threshold,
)
from base.proofs import MerkleTree, leaf
from base.release import (
    object_path,
    row_schema,
    sha256_hex,
    shard_paths,
)
from edge_index.guard import Guard
from edge_index.query_encoder import encode_many
from policy.answers import answer_problem, checks_passed
from precompute.calibration import HeldBack, calibrate_release, semantic_decision
from precompute.config import BuildConfig
from precompute.curated import CURATED

if TYPE_CHECKING:
    import faiss

    from base.release import LoadedRelease
    from edge_index.embedder import Embedder
    from precompute.questions import HotQuestion


@dataclass
class BuildReport:
    clusters: int = 0
    rows: int = 0
    shards: int = 0
    excluded_clusters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds": round(self.seconds, 2)}


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


def _jitter(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


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


def _copy_embedder(folder: Path, staging: Path) -> list[dict[str, Any]]:
    """The files of ``folder`` copied under ``staging/embedder/``: their manifest entries."""
    import shutil

    entries = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        relative = f"embedder/{path.relative_to(folder).as_posix()}"
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        data = target.read_bytes()
        entries.append({"path": relative, "bytes": len(data), "sha256": sha256_hex(data)})
    return entries


def finetuned_embedder(
    embedder: Embedder, base_name: str, hot: list[HotQuestion], steps: int, folder: Path
) -> tuple[Embedder, Path | None, Finetuned | None]:
    """The embedder tuned on the clusters' phrasings (label = cluster), saved to ``folder``, and
    how it was tuned (the manifest's ``embedder.finetuned``); the base embedder (None, None) when
    too few clusters have two phrasings."""
    from edge_index.embedder import trainable
    from edge_index.finetune import finetune, model_digest

    if sum(1 for h in hot if len(h.phrasings) >= 2) < 2:
        return embedder, None, None
    # published wordings only: the tuned weights ship in the release, and a held-back wording
    # (a token fewer than k people typed) must not leave the work area through them
    texts = [p.normalized for h in hot for p in h.phrasings]
    labels = [h.key for h in hot for p in h.phrasings]
    tuned = finetune(trainable(embedder), texts, labels, steps=steps)
    tuned.save(str(folder))
    info = Finetuned(base=base_name, steps=steps, examples=len(texts), sha256=model_digest(folder))
    return tuned, folder, info


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


def release_version(now: datetime, content_sha256: str) -> str:
    """Sortable by time; the suffix tells two releases of the same second apart."""
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{content_sha256[:8]}"


class _Spill:
    """A release's rows and their vectors written to a local folder as they are made, read back
    a part at a time (``source``): the build holds one part, never the release. Parts are cut
    every ``PART_ROWS`` rows of the release, a multiple of the embedder's chunk, so each row's
    vector is the one embedding every row at once gives."""

    def __init__(self, folder: Path, embedder: Embedder) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.embedder = folder, embedder
        self.dim = int(embedder.get_embedding_dimension() or 0)
        self.count = 0
        self._parts: list[int] = []  # rows of each part written
        self._waiting: list[dict[str, Any]] = []
        self._content = hashlib.sha256()

    def add(self, row: dict[str, Any]) -> None:
        row["id"] = self.count + len(self._waiting)
        self._content.update(canonical_json([row["key"], row["answer"], row["cluster"]]))
        self._waiting.append(row)
        if len(self._waiting) == PART_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows, self._waiting = self._waiting, []
        vectors = encode_many(self.embedder, [r["normalized"] for r in rows])
        part = len(self._parts)
        table = pa.Table.from_pylist(rows, schema=row_schema())
        pq.write_table(table, self.folder / f"{part:05d}.parquet")
        np.save(self.folder / f"{part:05d}.npy", vectors.reshape(len(rows), self.dim))
        self._parts.append(len(rows))
        self.count += len(rows)

    def content_sha256(self) -> str:
        return self._content.hexdigest()

    def source(self) -> ReleaseRows:
        """The rows added, in order (what waits for a whole part written first)."""
        import pyarrow.parquet as pq

        if self._waiting:
            self._flush()
        folder, count = self.folder, len(self._parts)

        def parts() -> Iterator[tuple[list[dict[str, Any]], np.ndarray]]:
            for part in range(count):
                rows = pq.read_table(folder / f"{part:05d}.parquet").to_pylist()
                yield rows, np.load(folder / f"{part:05d}.npy")

        return ReleaseRows(self.count, self.dim, parts)


Answered = Callable[[], Iterator[tuple["HotQuestion", dict[str, Any] | None]]]


def answered(hot: list[HotQuestion], answers: Mapping[str, dict[str, Any]]) -> Answered:
    """Mined questions and their answers (by the cluster's key) held in memory, as
    ``build_release`` reads them."""
    return lambda: ((cluster, answers.get(cluster.key)) for cluster in hot)


def build_release(
    staging: Path,
    clusters: Answered,
    embedder: Embedder,
    embedder_name: str,
    profile: str,
    profile_inputs: dict[str, Any],
    config: BuildConfig,
    extra: dict[str, Any] | None = None,
    now: datetime | None = None,
    embedder_dir: Path | None = None,
    embedder_info: Finetuned | None = None,
) -> tuple[Manifest, BuildReport]:
    """Write a complete release under ``staging``; returns its manifest.

    ``clusters``: a fresh iterator, each call, of the mined questions in rank order, each with
    its generated row (``answer``, ``flag``, ``generated_at``, ``finish_reason`` when known;
    None: not generated), read twice (the rows, then the held-back wordings calibration
    samples), so a build from the work area holds a part of it at a time. Clusters whose answer
    is missing, flagged, or degenerate (``policy.answers``) are left out and counted as
    ``not_generated`` or ``answer_<flag>``; every row records the checks it passed
    (``checks``). The rows and their vectors wait in a local folder (``_Spill``) until the
    release is written from it (``write_release``).
    ``embedder_dir``: a (fine-tuned) sentence-transformers folder to ship inside the release under
    ``embedder/`` -- the edge then embeds queries with it; ``embedder_info``: how it was tuned.
    """
    import tempfile
    import time

    started = time.perf_counter()
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    report = BuildReport()
    built: set[str] = set()
    held_back = 0  # the built clusters' held-back wordings
    with tempfile.TemporaryDirectory(prefix="edgeqa-rows-") as tmp:
        spill = _Spill(Path(tmp), embedder)
        for cluster, generated in clusters():
            reason = _excluded(cluster, generated, config)
            if reason:
                report.excluded_clusters[reason] = report.excluded_clusters.get(reason, 0) + 1
                continue
            assert generated is not None
            report.clusters += 1
            built.add(cluster.key)
            held_back += len(cluster.held_back)
            allow_links = config.allow_links or generated.get("reused_from") == CURATED
            generated_at = generated["generated_at"]
            for phrasing in cluster.phrasings:
                jitter = 1 + config.ttl_jitter * _jitter(phrasing.key)
                ttl = timedelta(days=config.ttl_days * jitter)
                spill.add(
                    {
                        "key": phrasing.key,
                        "question": phrasing.question,
                        "normalized": phrasing.normalized,
                        "answer": generated["answer"],
                        "users": phrasing.user_count,
                        "hits": phrasing.hits,
                        "generated_at": generated_at,
                        "expires_at": (generated_at + ttl).replace(microsecond=0),
                        "cluster": cluster.key,
                        "canonical": phrasing is cluster.canonical,
                        "object_sha256": "",
                        "checks": checks_passed(allow_links),
                    }
                )
        source = spill.source()
        content = spill.content_sha256()
        version = release_version(now, content)
        wordings = HeldBack.sampled(
            (c for c, _ in clusters()), built, held_back, embedder, config.calibration_rows
        )
        calibration = calibrate_release(source, config, wordings)
        embedder_entry = EmbedderEntry.of(
            {
                "name": embedder_name,
                "dim": source.dim,
                **({"finetuned": embedder_info} if embedder_info is not None else {}),
                **({"files": _copy_embedder(embedder_dir, staging)} if embedder_dir else {}),
            }
        )
        manifest = write_release(
            staging,
            source,
            version,
            ProfileEntry(name=profile, inputs=profile_inputs),
            embedder_entry,
            semantic_decision(calibration, config),
            config,
            {
                "counts": {"clusters": report.clusters, "rows": source.count},
                "excluded_clusters": dict(sorted(report.excluded_clusters.items())),
                "content_sha256": content,
                "created_at": now.isoformat(),
                **(extra or {}),
            },
        )
    report.rows = source.count
    report.shards = len(manifest.shards)
    report.seconds = time.perf_counter() - started
    return manifest, report


def _excluded(cluster: HotQuestion, generated: dict[str, Any] | None, config: BuildConfig) -> str:
    """Why ``cluster`` is left out of the release ("" when it is not)."""
    if generated is None:
        return "not_generated"
    # checked again: a partition generated before a check existed is held to it too. Links are
    # judged here, where an answer is published, not at generation; an operator's curated
    # answer is trusted content (its links are the operator's)
    allow_links = config.allow_links or generated.get("reused_from") == CURATED
    stored = "" if generated["flag"] == "link" else generated["flag"]
    flag = stored or answer_problem(
        cluster.question, generated["answer"], generated.get("finish_reason"), allow_links
    )
    return f"answer_{flag}" if flag else ""


def write_release(
    staging: Path,
    source: ReleaseRows,
    version: str,
    profile: ProfileEntry,
    embedder: EmbedderEntry,
    threshold: Threshold,
    config: BuildConfig,
    extra: dict[str, Any],
) -> Manifest:
    """The release files (``write_release_files``) and its ``manifest.json`` under ``staging``:
    ``profile`` (name, inputs), ``embedder`` and ``threshold`` entries, ``extra`` fields
    (counts, content digest, dates, lineage: ``Manifest``'s) on top; the manifest."""
    shards, answers_root = write_release_files(staging, source, version, profile.name, config)
    manifest = Manifest.of(
        {
            "format": FORMAT,
            "version": version,
            "profile": profile,
            "embedder": embedder,
            "metric": "inner_product",
            "index": {
                # the largest shard's (every shard but the last is that large)
                "factory": factory_for(
                    config, min(source.count, shard_rows_for(config, source.dim))
                ),
                "ef_construction": config.ef_construction,
                "ef_search": config.ef_search,
                "nprobe": config.nprobe,
            },
            "threshold": threshold,
            "guard": Guard().as_dict(),
            "shards": shards,
            "objects": {
                "prefix": "a/",
                "count": source.count,
                "integrity": "rows.object_sha256",
            },
            "expiry": {"ttl_days": config.ttl_days, "jitter": config.ttl_jitter},
            "answers_root": answers_root,
            **extra,
        }
    )
    (staging / "manifest.json").write_bytes(manifest.to_json())
    return manifest


def derive_release(
    staging: Path,
    parent: LoadedRelease,
    drop: Callable[[dict[str, Any]], bool],
    extra: dict[str, Any],
    now: datetime | None = None,
) -> Manifest:
    """Write under ``staging`` a release like ``parent`` without the rows ``drop`` picks: the
    same answers, expiry, embedder and calibrated decision, the index rebuilt from the parent's
    own vectors (nothing is embedded or generated again); returns its manifest. ``extra`` (why,
    and what was dropped) is added to the manifest."""
    import faiss

    now = (now or datetime.now(UTC)).replace(microsecond=0)
    manifest = parent.manifest
    profile = manifest.profile.name
    rows: list[dict[str, Any]] = []
    kept_vectors = []
    for shard in parent.shards:
        ivf = faiss.try_extract_index_ivf(shard.index)
        if ivf is not None:
            ivf.make_direct_map()  # IVF lists do not map ids to vectors until asked
        vectors = shard.index.reconstruct_n(0, shard.index.ntotal)
        for row, vector in zip(shard.rows.to_pylist(), vectors, strict=True):
            if not drop(row):
                rows.append(row)
                kept_vectors.append(vector)
    index = manifest.index
    config = BuildConfig(
        factory=index.factory,
        ef_construction=index.ef_construction,
        ef_search=index.ef_search,
        nprobe=index.nprobe,
    )
    content = content_sha256(rows)
    version = release_version(now, content)
    dim = manifest.embedder.dim
    matrix = np.asarray(kept_vectors, dtype=np.float32).reshape(len(rows), dim)
    shards, answers_root = write_release_files(
        staging, ReleaseRows.in_memory(rows, matrix), version, profile, config
    )
    for path, data in parent.embedder_files.items():  # the same bytes the manifest lists
        target = staging / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    dropped_clusters = len(_clusters(parent) - {r["cluster"] for r in rows})
    excluded = dict(manifest.excluded_clusters)
    excluded["revoked"] = excluded.get("revoked", 0) + dropped_clusters
    derived = Manifest.of(
        {
            **manifest.as_dict(),  # the parent's, every field it has kept as it is
            "version": version,
            "parent": parent.version,
            "shards": shards,
            "objects": {"prefix": "a/", "count": len(rows), "integrity": "rows.object_sha256"},
            "counts": {"clusters": len({r["cluster"] for r in rows}), "rows": len(rows)},
            "excluded_clusters": dict(sorted(excluded.items())),
            "content_sha256": content,
            "answers_root": answers_root,
            "created_at": now.isoformat(),
            **extra,
        }
    )
    (staging / "manifest.json").write_bytes(derived.to_json())
    return derived


def _clusters(release: LoadedRelease) -> set[str]:
    return {c for shard in release.shards for c in shard.rows.column("cluster").to_pylist()}
