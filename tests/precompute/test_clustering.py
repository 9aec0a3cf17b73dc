"""Clustering the night's wordings: the greedy rule, an exact or an approximate neighbour search
(its recall measured), the same clusters either way."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.synthetic_logs import synthetic_tables
from precompute.clustering import ClusterStats, greedy_clusters
from precompute.config import MiningConfig
from precompute.mining import mine
from precompute.samplelogs import INTENTS


def _groups(n_groups: int, size: int, spread: float, seed: int = 0) -> np.ndarray:
    """Unit vectors around ``n_groups`` random centres: near-duplicates, and unrelated ones."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_groups, 64)).astype(np.float32)
    points = np.repeat(centres, size, axis=0)
    points += spread * rng.standard_normal(points.shape).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points[rng.permutation(len(points))]


def _all_pairs(vectors: np.ndarray, threshold: float, numbers: Any) -> list[list[int]]:
    """The greedy rule as it was first written: every pair scored, most asked (first) first."""
    scores = vectors @ vectors.T
    assigned = [False] * len(vectors)
    clusters = []
    for i in range(len(vectors)):
        if assigned[i]:
            continue
        assigned[i] = True
        members = [i]
        for j in np.flatnonzero(scores[i] >= threshold).tolist():
            if j != i and not assigned[j] and numbers(j) == numbers(i):
                assigned[j] = True
                members.append(j)
        clusters.append(members)
    return clusters


def _chunks(vectors: np.ndarray, rows: int = 500) -> list[np.ndarray]:
    return [vectors[i : i + rows].copy() for i in range(0, len(vectors), rows)]


def test_the_greedy_pass_in_batches_is_the_all_pairs_greedy_rule() -> None:
    vectors = _groups(300, 8, 0.12)

    def numbers(row: int) -> int:
        return int(row % 11 == 0)  # every 11th wording holds another number: never merged

    expected = _all_pairs(vectors, 0.9, numbers)
    found = greedy_clusters(_chunks(vectors), 0.9, numbers, exact_rows=10**6)
    assert found == expected
    assert max(len(c) for c in found) > 3 and len(found) < len(vectors) / 2  # groups were found


def test_an_inverted_file_finds_the_same_clusters_and_reports_its_recall() -> None:
    vectors = _groups(400, 10, 0.12, seed=1)
    exact_stats, approximate_stats = ClusterStats(), ClusterStats()
    exact = greedy_clusters(_chunks(vectors), 0.9, lambda r: 0, exact_rows=10**6, stats=exact_stats)
    approximate = greedy_clusters(
        _chunks(vectors), 0.9, lambda r: 0, exact_rows=100, list_rows=32, nprobe=16,
        stats=approximate_stats,
    )  # fmt: skip
    assert exact_stats.index == "Flat" and exact_stats.neighbour_recall is None
    assert approximate_stats.index.startswith("IVF") and approximate_stats.nprobe == 16
    assert approximate_stats.neighbour_recall is not None
    assert approximate_stats.neighbour_recall >= 0.99
    same = {tuple(c) for c in exact} & {tuple(c) for c in approximate}
    assert len(same) >= 0.99 * len(exact)
    # lists of 8 wordings, one probed: near neighbours fall in lists not searched, and the
    # report says so; more probes find them again
    recall, probes = {}, {}
    for wanted in (0.5, 0.99):
        stats = ClusterStats()
        greedy_clusters(
            _chunks(vectors), 0.9, lambda r: 0, exact_rows=100, list_rows=8, nprobe=1,
            stats=stats, recall=wanted,
        )  # fmt: skip
        recall[wanted], probes[wanted] = stats.neighbour_recall, stats.nprobe
    assert probes[0.5] == 1 and recall[0.5] is not None and 0.5 <= recall[0.5] < 0.95
    assert probes[0.99] is not None and probes[0.99] > 1  # probed more lists until ...
    assert recall[0.99] is not None and recall[0.99] >= 0.99  # ... the recall was reached


def test_mining_with_the_approximate_search_finds_the_exact_search_s_qualifying_clusters(
    embedder: Any, tmp_path: Path
) -> None:
    """Synthetic logs shaped like a large product's (a Zipf head, a long tail of one-off
    wordings): forced onto the inverted file, mining finds >= 99 % of the clusters the exact
    search finds."""
    questions = [wording for intent in INTENTS for wording in intent]
    tables = [t for _, t in synthetic_tables(6000, questions, date(2026, 11, 28), seed=3)]
    now = datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC)

    def qualifying(config: MiningConfig) -> tuple[set[tuple[str, ...]], Any]:
        hot, report = mine(tables, embedder, config, now)
        clusters = {tuple(sorted(p.key for p in [*h.phrasings, *h.held_back])) for h in hot}
        return clusters, report

    exact, exact_report = qualifying(MiningConfig(cluster_threshold=0.9))
    approximate, report = qualifying(
        MiningConfig(cluster_threshold=0.9, exact_cluster_rows=100, cluster_list_rows=64)
    )
    assert exact_report.clustering["index"] == "Flat"
    assert report.clustering["index"].startswith("IVF")
    assert report.clustering["neighbour_recall"] >= 0.99
    assert len(exact) >= 20
    assert len(exact & approximate) >= 0.99 * len(exact)
    assert report.clustering["embed_wordings_per_s"] > 0
