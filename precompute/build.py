"""Release building: mined clusters + generated answers -> a complete release in a local folder.

One row per published phrasing (every phrasing of a cluster is indexed under the cluster's
answer, so each has its own exact-tier object and its own vector). Embeddings are computed in
batches; rows are cut into shards of ``shard_rows`` (fewer when a shard's index would near the
1 GiB readers accept: ``shard_rows_for``) and each shard gets its own FAISS index
(``factory``: ``auto`` picks HNSW32 with efConstruction >= 200 below ``ivf_rows`` rows, and above
an IVF index trained on a sample of 64 points per list; any FAISS factory string works). IVF
training runs on a GPU through faiss-gpu when one is present. The semantic tier's decision is
calibrated on the release's own phrasings (``semantic.matcher``). The phrasings are embedded in
one pass once every row is written, by the build's own embedder or, on a cluster whose Ray actors
have GPUs, on them (``fleet.embedding.release_encoder``: the generation pool, still up when the
build starts). Expiry: ``generated_at +
ttl_days``, stretched by a jitter of up to ``ttl_jitter`` derived from the key, so entries do not
all expire at once and a rebuild from the same answers is identical.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.answer_objects import canonical_json
from base.manifest import (
    FORMAT,
    EmbedderEntry,
    Finetuned,
    Manifest,
    ProfileEntry,
    Threshold,
)
from base.release import (
    row_schema,
    sha256_hex,
)
from policy.answers import answer_problem, checks_passed
from precompute.calibration import HeldBack, calibrate_release, semantic_decision
from precompute.clustering import Texts, local_encoder
from precompute.config import BuildConfig
from precompute.curated import CURATED
from precompute.shards import (
    PART_ROWS,
    ReleaseRows,
    content_sha256,
    factory_for,
    shard_rows_for,
    write_release_files,
)
from semantic.guard import Guard

if TYPE_CHECKING:
    from base.release import LoadedRelease
    from precompute.clustering import Encoder
    from precompute.questions import HotQuestion
    from semantic.embedder import Embedder


@dataclass
class BuildReport:
    clusters: int = 0
    rows: int = 0
    shards: int = 0
    excluded_clusters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    embedded_on: str = "here"  # what embedded the rows: this process, or the fleet's workers
    # each step's wall and process CPU seconds (CPU over wall: the cores it kept busy)
    steps: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds": round(self.seconds, 2)}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.steps[name] = {
            "s": round(time.perf_counter() - wall, 2),
            "cpu_s": round(time.process_time() - cpu, 2),
        }


def _jitter(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


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
    from precompute.finetune import finetune, model_digest
    from semantic.loading import trainable

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


def release_version(now: datetime, content_sha256: str) -> str:
    """Sortable by time; the suffix tells two releases of the same second apart. The same
    answers as of the same instant are the same version, written once: a run that builds a
    version already there goes on with it (``publish.same_release``)."""
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{content_sha256[:8]}"


class _Spill:
    """A release's rows written to a local folder as they are made, then their vectors, read
    back a part at a time (``source``): the build holds one part, never the release. Parts are
    cut every ``PART_ROWS`` rows of the release; the vectors come from one pass of ``encode``
    over every row's text (``embed``), a job the fleet spreads over its GPUs, in the embedder's
    chunks, so each row's vector is the one embedding every row at once gives."""

    def __init__(self, folder: Path, dim: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.dim = folder, dim
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
        part = len(self._parts)
        table = pa.Table.from_pylist(rows, schema=row_schema())
        pq.write_table(table, self.folder / f"{part:05d}.parquet")
        self._parts.append(len(rows))
        self.count += len(rows)

    def embed(self, encode: Encoder) -> None:
        """Every row's vector (its ``normalized`` text by ``encode``, in row order), written
        beside its part: the texts read back as Arrow (no Python string a row held), the
        vectors a part at a time as they come."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._waiting:
            self._flush()
        parts = [self.folder / f"{part:05d}" for part in range(len(self._parts))]
        # no row: the encoder is still called (one that asked for GPUs ahead hands them back)
        texts = Texts(
            pa.concat_arrays(
                [
                    pq.read_table(f"{part}.parquet", columns=["normalized"])
                    .column(0)
                    .combine_chunks()
                    .cast(pa.large_string())  # past 2 GB of text, as at ten times the plan
                    for part in parts
                ]
                or [pa.array([], pa.large_string())]
            )
        )
        waiting: list[np.ndarray] = []  # vectors come in the encoder's chunks, not by part
        held = at = 0  # vectors waiting; the part they go to
        for vectors in encode(texts):
            if vectors.ndim != 2 or vectors.shape[1] != self.dim:
                raise ValueError(
                    f"the embedder gave vectors of shape {vectors.shape}, the release's have "
                    f"{self.dim} dimensions"
                )
            waiting.append(np.asarray(vectors, dtype=np.float32))
            held += len(vectors)
            while at < len(parts) and held >= self._parts[at]:
                block, size = np.concatenate(waiting), self._parts[at]
                np.save(f"{parts[at]}.npy", block[:size])
                waiting, held, at = [block[size:]], held - size, at + 1
        if at < len(parts) or held:
            came = sum(self._parts[:at]) + held
            raise ValueError(f"the embedder gave {came} vectors for {self.count} rows")

    def content_sha256(self) -> str:
        return self._content.hexdigest()

    def source(self) -> ReleaseRows:
        """The rows added, in order, with their vectors (``embed`` first)."""
        import pyarrow.parquet as pq

        assert not self._waiting, "the rows are embedded before they are read"
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
    encode: Encoder | None = None,
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
    ``encode``: what embeds the rows, the same model as ``embedder`` elsewhere (the fleet's GPUs:
    ``fleet.embedding.release_encoder``); None: ``embedder`` in this process.
    """
    import tempfile

    started = time.perf_counter()
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    report = BuildReport()
    built = bytearray()  # 1: the cluster at that place in ``clusters()`` is in the release
    with tempfile.TemporaryDirectory(prefix="edgeqa-rows-") as tmp:
        spill = _Spill(Path(tmp), int(embedder.get_embedding_dimension() or 0))
        with report.step("rows"):
            held_back = _rows(spill, clusters, config, report, built)
        with report.step("embed"):
            spill.embed(encode or local_encoder(embedder))
        report.embedded_on = getattr(encode, "where", "") or "here"
        source = spill.source()
        content = spill.content_sha256()
        version = release_version(now, content)
        with report.step("calibrate"):
            wordings = HeldBack.sampled(
                (c for (c, _), b in zip(clusters(), built, strict=True) if b),
                held_back,
                embedder,
                config.calibration_rows,
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
        with report.step("write"):
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


def _rows(
    spill: _Spill, clusters: Answered, config: BuildConfig, report: BuildReport, built: bytearray
) -> int:
    """Every phrasing of ``clusters()`` that the release publishes a row of ``spill`` (a byte
    of ``built`` a cluster, 1 where it is in the release); the built clusters' held-back
    wordings, counted."""
    held_back = 0
    for cluster, generated in clusters():
        reason = _excluded(cluster, generated, config)
        built.append(not reason)
        if reason:
            report.excluded_clusters[reason] = report.excluded_clusters.get(reason, 0) + 1
            continue
        assert generated is not None
        report.clusters += 1
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
    return held_back


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
    shards, objects, answers_root = write_release_files(
        staging, source, version, profile.name, config
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
                    config, min(source.count, shard_rows_for(config, source.dim))
                ),
                "ef_construction": config.ef_construction,
                "ef_search": config.ef_search,
                "nprobe": config.nprobe,
            },
            "threshold": threshold,
            "guard": Guard().as_dict(),
            "shards": shards,
            "objects": objects,
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
    shards, objects, answers_root = write_release_files(
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
            "objects": objects,
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
