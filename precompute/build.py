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
from collections.abc import Callable
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
from base.proofs import leaf, tree
from base.release import (
    object_path,
    row_schema,
    serialize_index,
    sha256_hex,
    shard_paths,
)
from edge_index.guard import Guard
from edge_index.query_encoder import encode_many
from policy.answers import answer_problem, checks_passed
from precompute.calibration import HeldBack, calibrate_rows, semantic_decision
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


def build_index(vectors: np.ndarray, factory: str, config: BuildConfig) -> faiss.Index:
    import faiss

    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    inner = faiss.downcast_index(index)
    if hasattr(inner, "hnsw"):
        inner.hnsw.efConstruction = config.ef_construction
        inner.hnsw.efSearch = config.ef_search
    if hasattr(inner, "nprobe"):
        inner.nprobe = config.nprobe
    if not index.is_trained:
        # k-means on at most 64 points per list: enough for the centroids, minutes faster
        nlist = getattr(inner, "nlist", 1)
        sample = vectors
        if len(vectors) > 64 * nlist:
            chosen = np.random.default_rng(0).choice(len(vectors), 64 * nlist, replace=False)
            sample = vectors[np.sort(chosen)]
        index = _train(index, sample)
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


def content_sha256(rows: list[dict[str, Any]]) -> str:
    """What a release answers (each phrasing's key, answer and cluster), hashed: the version's
    suffix."""
    content = hashlib.sha256()
    for row in rows:
        content.update(canonical_json([row["key"], row["answer"], row["cluster"]]))
    return content.hexdigest()


def write_release_files(
    staging: Path,
    rows: list[dict[str, Any]],
    vectors: np.ndarray,
    version: str,
    profile: str,
    config: BuildConfig,
) -> tuple[list[ShardEntry], str]:
    """The answer objects (with their proofs) and the FAISS and Parquet shards of ``rows``
    (``vectors``: their embeddings, row for row) under ``staging``; (the manifest's shard
    entries, the answers root). Fills each row's ``object_sha256``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    staging.mkdir(parents=True, exist_ok=True)
    answers_root, proofs = tree([leaf(answer_fields(row, version, profile)) for row in rows])
    for row, proof in zip(rows, proofs, strict=True):
        data = answer_object(row, version, profile, proof)
        row["object_sha256"] = sha256_hex(data)
        target = staging / object_path(row["key"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    shards = []
    per_shard = shard_rows_for(config, vectors.shape[1] if vectors.ndim == 2 else 0)
    for shard, start in enumerate(range(0, len(rows), per_shard)):
        chunk = rows[start : start + per_shard]
        index = build_index(
            vectors[start : start + per_shard], factory_for(config, len(chunk)), config
        )
        index_path, rows_path = shard_paths(shard)
        index_bytes = serialize_index(index)
        (staging / index_path).parent.mkdir(parents=True, exist_ok=True)
        (staging / index_path).write_bytes(index_bytes)
        table = pa.Table.from_pylist(
            [{**r, "id": i} for i, r in enumerate(chunk)], schema=row_schema()
        )
        pq.write_table(table, staging / rows_path, compression="zstd")
        rows_bytes = (staging / rows_path).read_bytes()
        shards.append(
            ShardEntry.of(
                {
                    "id": shard,
                    "count": len(chunk),
                    "index": {
                        "path": index_path,
                        "bytes": len(index_bytes),
                        "sha256": sha256_hex(index_bytes),
                    },
                    "rows": {
                        "path": rows_path,
                        "bytes": len(rows_bytes),
                        "sha256": sha256_hex(rows_bytes),
                    },
                }
            )
        )
    return shards, answers_root


def release_version(now: datetime, content_sha256: str) -> str:
    """Sortable by time; the suffix tells two releases of the same second apart."""
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{content_sha256[:8]}"


def build_release(
    staging: Path,
    hot: list[HotQuestion],
    answers: dict[str, dict[str, Any]],
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

    ``answers``: generated rows by the cluster's canonical key (``answer``, ``flag``,
    ``generated_at``, ``finish_reason`` when known). Clusters whose answer is missing, flagged, or
    degenerate (``policy.answers``) are left out and counted as ``not_generated`` or
    ``answer_<flag>``; every row records the checks it passed (``checks``).
    ``embedder_dir``: a (fine-tuned) sentence-transformers folder to ship inside the release under
    ``embedder/`` -- the edge then embeds queries with it; ``embedder_info``: how it was tuned.
    """
    import time

    started = time.perf_counter()
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    report = BuildReport()
    rows: list[dict[str, Any]] = []
    for cluster in hot:
        generated = answers.get(cluster.key)
        if generated is None:
            reason = "not_generated"
        else:
            # checked again: a partition generated before a check existed is held to it too.
            # Links are judged here, where an answer is published, not at generation; an
            # operator's curated answer is trusted content (its links are the operator's)
            allow_links = config.allow_links or generated.get("reused_from") == CURATED
            stored = "" if generated["flag"] == "link" else generated["flag"]
            flag = stored or answer_problem(
                cluster.question, generated["answer"], generated.get("finish_reason"), allow_links
            )
            reason = f"answer_{flag}" if flag else ""
        if reason:
            report.excluded_clusters[reason] = report.excluded_clusters.get(reason, 0) + 1
            continue
        assert generated is not None
        report.clusters += 1
        generated_at = generated["generated_at"]
        for phrasing in cluster.phrasings:
            ttl = timedelta(days=config.ttl_days * (1 + config.ttl_jitter * _jitter(phrasing.key)))
            rows.append(
                {
                    "id": len(rows),
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
    content = content_sha256(rows)
    version = release_version(now, content)
    dim = int(embedder.get_embedding_dimension() or 0)
    all_vectors = encode_many(embedder, [r["normalized"] for r in rows]).reshape(len(rows), dim)
    held_back = HeldBack.of(hot, {r["cluster"] for r in rows}, embedder, config.calibration_rows)
    calibration = calibrate_rows(rows, all_vectors, config, held_back)
    embedder_entry = EmbedderEntry.of(
        {
            "name": embedder_name,
            "dim": dim,
            **({"finetuned": embedder_info} if embedder_info is not None else {}),
            **({"files": _copy_embedder(embedder_dir, staging)} if embedder_dir else {}),
        }
    )
    manifest = write_release(
        staging,
        rows,
        all_vectors,
        version,
        ProfileEntry(name=profile, inputs=profile_inputs),
        embedder_entry,
        semantic_decision(calibration, config),
        config,
        {
            "counts": {"clusters": report.clusters, "rows": len(rows)},
            "excluded_clusters": dict(sorted(report.excluded_clusters.items())),
            "content_sha256": content,
            "created_at": now.isoformat(),
            **(extra or {}),
        },
    )
    report.rows = len(rows)
    report.shards = len(manifest.shards)
    report.seconds = time.perf_counter() - started
    return manifest, report


def write_release(
    staging: Path,
    rows: list[dict[str, Any]],
    vectors: np.ndarray,
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
    shards, answers_root = write_release_files(
        staging, rows, vectors, version, profile.name, config
    )
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
                    config, min(len(rows), shard_rows_for(config, vectors.shape[1]))
                ),
                "ef_construction": config.ef_construction,
                "ef_search": config.ef_search,
                "nprobe": config.nprobe,
            },
            "threshold": threshold,
            "guard": Guard().as_dict(),
            "shards": shards,
            "objects": {"prefix": "a/", "count": len(rows), "integrity": "rows.object_sha256"},
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
    shards, answers_root = write_release_files(staging, rows, matrix, version, profile, config)
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
