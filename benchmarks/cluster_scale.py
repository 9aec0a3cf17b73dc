"""The night's clustering at growing sizes: seconds per wording and neighbour recall.

``precompute/clustering.py: greedy_clusters`` — what the mine stage runs after embedding — on
``--sizes`` wordings (default 300,000 and 3,000,000) with the mine stage's defaults (an exact
index up to 20,000 wordings, past it ``IVF<n/256>_HNSW32,SQfp16``, probes doubled until 99 % of
the neighbours an exact search finds for 500 sampled wordings are found; threshold 0.9).

The vectors are synthetic, built on real ones so that the night's geometry holds at every size:
the embedder's vectors of 5,000 real questions (``../shared/data``, read by path) are mixed into
``n / 8`` topics (one question's vector, half of another's and a shared random direction), and
each wording is a topic's vector moved by noise of its own size (cosine 0.93 to 0.995 to its
topic: two wordings of a topic from ~0.99 apart to below the threshold), rows in random topic
order. So a wording has as many neighbours at the
threshold at every size (reported: ``neighbours_per_wording``, ~1 here; the synthetic logs'
nights have ~5 at 100,000 and at 1,000,000 rows): growth in wordings is growth in questions, not
the same questions asked in ever more ways. Vectors are made a chunk at a time, as embedding
hands them over, never all held.

Per size: wordings, the index and its probes, the measured neighbour recall, clustering seconds
(the wait for vectors excluded) and microseconds per wording, clusters, neighbours per wording,
peak RSS of the child process; then the growth of seconds per wording from the first size to
the last.

Prints one JSON object: {"config", "sizes": {"<n>": {...}}, "s_per_wording_ratio"}.

Run: .venv/bin/python benchmarks/cluster_scale.py [--sizes 300000,3000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import DATA_DIR, ROOT
from benchmarks.synthetic_logs import real_questions

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

CHUNK = 4096  # the embedder's chunk (semantic.batch.TOKENIZE_CHUNK)
PER_TOPIC = 8  # wordings a topic, on average
DIRECTIONS = 1024  # shared random directions the topics mix in


def _bases() -> np.ndarray:
    from semantic.batch import encode_many
    from semantic.loading import load_embedder

    return encode_many(load_embedder("embedded"), real_questions(DATA_DIR, 5000))


def chunks(n: int, bases: np.ndarray, seed: int = 0) -> Iterator[np.ndarray]:
    """``n`` unit wordings' vectors, ``CHUNK`` at a time (deterministic)."""
    import numpy as np

    dim = bases.shape[1]
    directions = np.random.default_rng(seed).standard_normal((DIRECTIONS, dim), dtype=np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    topics = max(1, n // PER_TOPIC)
    for start in range(0, n, CHUNK):
        rng = np.random.default_rng([seed, start])
        size = min(CHUNK, n - start)
        topic = rng.integers(0, topics, size)
        first, second = topic % len(bases), (topic // len(bases) * 7919 + topic) % len(bases)
        mixed = bases[first] + 0.5 * bases[second] + 0.6 * directions[topic % DIRECTIONS]
        mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
        noise = rng.standard_normal((size, dim), dtype=np.float32)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        # each wording its own distance from its topic: two wordings of a topic from ~0.98
        # apart to below the threshold, as a night's paraphrases spread (not all at 0.9)
        wording = mixed + rng.uniform(0.1, 0.4, (size, 1)).astype(np.float32) * noise
        yield (wording / np.linalg.norm(wording, axis=1, keepdims=True)).astype(np.float32)


def child(n: int) -> dict[str, Any]:
    import numpy as np

    from base.config import peak_rss_mb
    from precompute.clustering import ClusterStats, greedy_clusters
    from precompute.config import MiningConfig

    config = MiningConfig()
    bases = _bases()
    stats = ClusterStats(wordings=n)
    began = time.perf_counter()
    clusters = greedy_clusters(
        chunks(n, bases),
        0.9,
        lambda row: (),
        exact_rows=config.exact_cluster_rows,
        list_rows=config.cluster_list_rows,
        nprobe=config.cluster_nprobe,
        stats=stats,
        recall=config.cluster_recall,
        order=np.arange(n, dtype=np.int64),  # rows already in random topic order
    )
    wall = time.perf_counter() - began
    return {
        "wordings": n,
        "index": stats.index,
        "nprobe": stats.nprobe,
        "neighbour_recall": stats.neighbour_recall,
        "cluster_s": round(stats.cluster_s, 2),
        "us_per_wording": round(1e6 * stats.cluster_s / n, 1),
        "making_vectors_s": round(wall - stats.cluster_s, 2),
        "clusters": len(clusters),
        "neighbours_per_wording": round(stats.neighbours / n, 2),
        "index_bytes_per_wording": round(stats.index_bytes / n, 1),
        "peak_rss_mb": peak_rss_mb(),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="300000,3000000")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results: dict[str, Any] = {}
    for n in sizes:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(n)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode or not lines:
            results[str(n)] = {"error": done.stderr.strip().splitlines()[-3:]}
            continue
        results[str(n)] = json.loads(lines[-1])
    out: dict[str, Any] = {"config": {"sizes": sizes, "per_topic": PER_TOPIC}, "sizes": results}
    ends = [results[str(sizes[0])], results[str(sizes[-1])]] if len(sizes) >= 2 else []
    if ends and all("error" not in end for end in ends):
        out["s_per_wording_ratio"] = round(ends[1]["us_per_wording"] / ends[0]["us_per_wording"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
