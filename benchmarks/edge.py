"""Edge lookup latency: exact and semantic tiers, in process and over HTTP on loopback.

Two releases: 10k entries of real questions (banking77 and CLINC150 phrasings) built with the
real build code (HNSW32), and 1M entries for scale: the 10k real embeddings plus perturbed copies
of them (synthetic vectors around real ones), indexed the way the build code indexes a release
that large (IVF, nprobe 16). Lookups use the real ``ReleaseIndex`` and edge service; semantic
latency includes embedding the query. Queries are real questions not in the release (banking77
and CLINC150 test phrasings) for the semantic tier, and published phrasings with other casing
and punctuation for the exact tier.

Prints one JSON object: {"config": {...}, "results": [{"entries", "tier", "mode", "p50_ms",
"p99_ms", "hit_rate"}, ...], "index_bytes": {"<entries>": n}, "build_s": {...}}

Run: .venv/bin/python benchmarks/edge.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA_DIR

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edge_index.lookup import ReleaseIndex


def real_questions() -> tuple[list[str], list[str]]:
    """(entries, held-out queries): train phrasings to index, test phrasings to look up."""
    entries, queries = [], []
    with (DATA_DIR / "banking77" / "train.csv").open(encoding="utf-8") as f:
        entries += [r["text"] for r in csv.DictReader(f)]
    with (DATA_DIR / "banking77" / "test.csv").open(encoding="utf-8") as f:
        queries += [r["text"] for r in csv.DictReader(f)]
    with (DATA_DIR / "clinc150" / "clinc150_full_flat.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            (entries if r["split"] == "train" else queries).append(r["text"])
    return entries, queries


def build_real(texts: list[str], embedder: Any, tmp: Path) -> ReleaseIndex:
    from base.keys import key, normalize
    from base.release import load_release
    from base.store import FileStore
    from edge_index.lookup import ReleaseIndex
    from precompute.build import answered, build_release
    from precompute.config import BuildConfig
    from precompute.publish import publish
    from precompute.questions import HotQuestion, Phrasing

    now = datetime.now(UTC).replace(microsecond=0)
    seen, hot, answers = set(), [], {}
    for text in texts:
        normalized = normalize(text)
        k = key(text)
        if k in seen:
            continue
        seen.add(k)
        phrasing = Phrasing(k, normalized, text, set(), 1, {})
        hot.append(HotQuestion(phrasing, [phrasing], 1, 1, 0.0))
        answers[k] = {"answer": f"answer {len(answers)}", "flag": "", "generated_at": now}
    store = FileStore(tmp / "store")
    build_release(
        tmp / "r",
        answered(hot, answers),
        embedder,
        "embedded",
        "bench",
        {},
        # one phrasing per question leaves calibration nothing to measure precision on (it turns
        # the semantic tier off, and the lookups would time a Miss): this measures latency, so
        # the tier is served uncalibrated
        BuildConfig(semantic_uncalibrated=True),
        extra={"parent": None},
        now=now,
    )
    publish(store, tmp / "r")
    return ReleaseIndex(load_release(store, "bench"), embedder)


def build_synthetic(base: ReleaseIndex, entries: int, seed: int = 0) -> ReleaseIndex:
    """``entries`` rows: the base release's vectors plus noisy copies of them."""
    import numpy as np
    import pyarrow as pa

    from base.manifest import Manifest
    from base.release import LoadedRelease, Shard, row_schema
    from edge_index.lookup import ReleaseIndex
    from precompute.config import BuildConfig
    from precompute.shards import build_index, factory_for

    rng = np.random.default_rng(seed)
    shard = base.release.shards[0]
    real = shard.index.reconstruct_n(0, shard.index.ntotal)
    picks = rng.integers(0, len(real), entries - len(real))
    noise = rng.normal(0, 0.08, (len(picks), real.shape[1])).astype(np.float32)
    synthetic = real[picks] + noise
    synthetic /= np.linalg.norm(synthetic, axis=1, keepdims=True)
    vectors = np.concatenate([real, synthetic]).astype(np.float32)
    config = BuildConfig()
    index = build_index(vectors, factory_for(config, entries), config)
    base_rows = shard.rows.to_pydict()
    n_extra = entries - len(real)
    extra_keys = [f"{i:064x}" for i in range(n_extra)]

    def filler(name: str) -> list[Any]:
        if name in ("key", "cluster", "object_sha256"):
            return extra_keys
        if name in ("question", "normalized", "answer"):
            return [f"synthetic {i}" for i in range(n_extra)]
        if name == "canonical":
            return [False] * n_extra
        if name in ("users", "hits"):
            return [1] * n_extra
        if name in ("generated_at", "expires_at", "checks"):
            return [base_rows[name][0]] * n_extra
        return list(range(len(real), entries))  # id

    columns = {name: base_rows[name] + filler(name) for name in row_schema().names}
    rows = pa.table(columns, schema=row_schema())
    manifest = Manifest.of(
        {
            **base.manifest.as_dict(),
            "version": f"synthetic-{entries}",
            "index": {
                **base.manifest.index.as_dict(),
                "factory": factory_for(config, entries),
                "nprobe": config.nprobe,
            },
        }
    )
    release = LoadedRelease(manifest, "synthetic", [Shard(index, rows)])
    return ReleaseIndex(release, base.embedder, base.decision, base.guard)


def exact_queries(index: ReleaseIndex, n: int, rng: random.Random) -> list[str]:
    """Published phrasings written differently (case, spacing, trailing punctuation)."""
    real = [q for q in index.questions if not q.startswith("synthetic")]
    return [f"  {q.upper()} ?? " if i % 2 else q.lower() for i, q in enumerate(rng.sample(real, n))]


def measure_inprocess(index: ReleaseIndex, queries: list[str], tier: str) -> dict[str, Any]:
    from base.keys import key, normalize
    from edge_index.lookup import Hit

    times, hits = [], 0
    for q in queries:
        started = time.perf_counter()
        normalized = normalize(q)
        if tier == "exact":
            result = index.lookup_exact(key(q))
        else:
            result = index.lookup_semantic(q, normalized)
        times.append(time.perf_counter() - started)
        hits += isinstance(result, Hit)
    return {
        "p50_ms": _p50(times),
        "p99_ms": _p99(times),
        "hit_rate": hits / len(queries),
    }


def _p50(values: list[float]) -> float:
    ms = sorted(v * 1000 for v in values)
    return round(ms[len(ms) // 2], 3)


def _p99(values: list[float]) -> float:
    ms = sorted(v * 1000 for v in values)
    return round(ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))], 3)


def measure_http(index: ReleaseIndex, queries: list[str]) -> dict[str, Any]:
    import httpx

    from base.store import FileStore
    from edge_index.server.app import create_app
    from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
    from edgeqa.local import LocalServer

    watcher = ReleaseWatcher(
        FileStore(tempfile.mkdtemp()), "bench", index.embedder, 3600, metrics_prefix=EDGE_METRICS
    )
    watcher.index = index
    times, hits = [], 0
    with LocalServer(create_app(watcher)) as server, httpx.Client(base_url=server.url) as client:
        client.get("/health")
        for q in queries:
            started = time.perf_counter()
            response = client.get("/v1/lookup", params={"q": q})
            times.append(time.perf_counter() - started)
            hits += response.status_code == 200
    return {
        "p50_ms": _p50(times),
        "p99_ms": _p99(times),
        "hit_rate": hits / len(queries),
    }


def measure_all(
    index: ReleaseIndex,
    held_out: list[str],
    lookups: int,
    rng: random.Random,
    index_bytes: dict[str, int],
) -> list[dict[str, Any]]:
    import faiss

    index_bytes[str(len(index))] = int(
        sum(faiss.serialize_index(i).nbytes for i, _ in index.shards)
    )
    semantic = rng.sample(held_out, lookups)
    exact = exact_queries(index, lookups, rng)
    # steady state: right after a 1.5 GB index is built the kernel keeps settling its pages for
    # ~10 s (bursts of 20-200 ms stalls every ~2.5 s, measured), which a serving edge has long
    # left behind; warm up with as many lookups as are measured
    for q in held_out[-lookups:]:
        index.lookup_semantic(q)
    gc.collect()
    gc.freeze()  # as the edge service does after loading a release
    rows = []
    for tier, queries in (("exact", exact), ("semantic", semantic)):
        for mode in ("inprocess", "http"):
            measured = (
                measure_inprocess(index, queries, tier)
                if mode == "inprocess"
                else measure_http(index, queries)
            )
            row = {"entries": len(index), "tier": tier, "mode": mode, **measured}
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    return rows


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 lookups per measurement")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--scale", type=int, default=1_000_000)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import faiss

    from semantic.loading import load_embedder

    if args.quick:
        args.lookups = 1000
    rng = random.Random(0)
    faiss.omp_set_num_threads(1)  # as the edge service: one query per search, no thread pool
    embedder = load_embedder("embedded", device="cpu")
    entries, held_out = real_questions()
    rng.shuffle(entries)
    results, index_bytes, build_s = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        small = build_real(entries[:10_000], embedder, Path(tmp))
        build_s["10000"] = round(time.perf_counter() - started, 1)
        results += measure_all(small, held_out, args.lookups, rng, index_bytes)
        started = time.perf_counter()
        large = build_synthetic(small, args.scale)
        build_s[str(args.scale)] = round(time.perf_counter() - started, 1)
        results += measure_all(large, held_out, args.lookups, rng, index_bytes)
    print(
        json.dumps(
            {
                "config": {
                    "lookups": args.lookups,
                    "threads": _threads(),
                    "factories": {
                        str(len(small)): small.manifest.index.factory,
                        str(len(large)): large.manifest.index.factory,
                    },
                    "semantic_includes_embedding": True,
                },
                "results": results,
                "index_bytes": index_bytes,
                "build_s": build_s,
            }
        )
    )


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
