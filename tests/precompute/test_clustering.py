"""Clustering the night's wordings: the greedy rule, an exact or an approximate neighbour search
(its recall measured), the same clusters either way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.synthetic_logs import synthetic_tables
from precompute.clustering import (
    TRAIN_ROWS_PER_LIST,
    Clusters,
    ClusterStats,
    Texts,
    _Assigned,
    embedding_order,
    greedy_clusters,
    local_encoder,
    neighbour_index,
)
from precompute.config import MiningConfig
from precompute.mining import mine
from precompute.samplelogs import INTENTS


def _groups(n_groups: int, size: int, spread: float, seed: int = 0, dim: int = 64) -> np.ndarray:
    """Unit vectors around ``n_groups`` random centres: near-duplicates, and unrelated ones."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_groups, dim)).astype(np.float32)
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
    assert list(found) == expected
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


def test_many_lists_are_trained_in_two_levels_and_find_the_same_clusters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``TWO_LEVEL_LISTS`` lists their centroids come from two-level k-means (one level's
    cost grows with the square of the night): the lists still find the exact search's
    clusters, at the recall asked for."""
    import precompute.clustering as clustering

    vectors = _groups(400, 10, 0.12, seed=2)
    exact = greedy_clusters(_chunks(vectors), 0.9, lambda r: 0, exact_rows=10**6)
    trained: list[int] = []
    two_level = clustering.train_lists

    def counted(ivf: Any, sample: Any) -> None:
        trained.append(ivf.nlist)
        two_level(ivf, sample)

    monkeypatch.setattr(clustering, "TWO_LEVEL_LISTS", 16)
    monkeypatch.setattr(clustering, "train_lists", counted)
    stats = ClusterStats()
    lists = greedy_clusters(
        _chunks(vectors), 0.9, lambda r: 0, exact_rows=100, list_rows=32, nprobe=4, stats=stats
    )
    assert trained == [len(vectors) // 32] and trained[0] >= 16
    assert stats.neighbour_recall is not None and stats.neighbour_recall >= 0.99
    same = {tuple(c) for c in exact} & {tuple(c) for c in lists}
    assert len(same) >= 0.99 * len(exact)


def test_probes_stop_doubling_when_more_lists_find_nothing_more() -> None:
    """Pairs a hair above the threshold: the fp16 codes round some of them below it, so no
    number of lists finds them. The probes stop doubling once twice as many find nothing more
    (searching every list would make the night all pairs), and the recall reached is
    reported."""
    rng = np.random.default_rng(3)
    first = rng.standard_normal((2000, 32)).astype(np.float32)
    first /= np.linalg.norm(first, axis=1, keepdims=True)
    away = rng.standard_normal((2000, 32)).astype(np.float32)
    away -= (away * first).sum(axis=1, keepdims=True) * first  # orthogonal to its pair's first
    away /= np.linalg.norm(away, axis=1, keepdims=True)
    cosine = 0.9 + 2e-5
    second = cosine * first + np.sqrt(1 - cosine**2) * away
    vectors = np.empty((4000, 32), dtype=np.float32)
    vectors[0::2], vectors[1::2] = first, second
    stats = ClusterStats()
    greedy_clusters(
        _chunks(vectors), 0.9, lambda r: 0, exact_rows=100, list_rows=32, nprobe=1, stats=stats
    )
    assert stats.neighbour_recall is not None and stats.neighbour_recall < 0.99
    assert stats.nprobe is not None and stats.nprobe < len(vectors) // 32


def test_vectors_coming_in_any_order_and_any_chunks_find_the_exact_search_s_clusters() -> None:
    """The night's vectors embedded in a random order (``embedding_order``), in chunks of any
    size: the clusters an exact search finds; the seconds spent waiting for chunks are the
    embedder's, the rest the clustering's."""
    vectors = _groups(400, 10, 0.12, seed=2)
    order = embedding_order(len(vectors), exact_rows=100)
    assert sorted(order.tolist()) == list(range(len(vectors)))
    assert order[:5].tolist() != [0, 1, 2, 3, 4]  # drawn at random
    assert embedding_order(50, exact_rows=100).tolist() == list(range(50))  # exact: as they are
    exact = greedy_clusters(_chunks(vectors), 0.9, lambda r: 0, exact_rows=10**6)
    sizes = [97, 250, 31, 400, 1]  # smaller than the recall probes, larger, uneven

    def chunks() -> Any:
        start, i = 0, 0
        while start < len(order):
            time.sleep(0.02)  # the embedder's time
            size = sizes[i % len(sizes)]
            yield vectors[order[start : start + size]]
            start, i = start + size, i + 1

    stats = ClusterStats()
    streamed = greedy_clusters(
        chunks(), 0.9, lambda r: 0, exact_rows=100, list_rows=256, stats=stats, order=order
    )
    same = {tuple(c) for c in exact} & {tuple(c) for c in streamed}
    assert len(same) >= 0.99 * len(exact) and len(streamed) < len(vectors) / 2
    assert stats.index.startswith("IVF") and stats.neighbour_recall is not None
    assert stats.neighbour_recall >= 0.99
    assert stats.embed_s >= 0.02 * len(order) / sum(sizes) * len(sizes) * 0.9
    assert 0 < stats.cluster_s and stats.embed_s > 0.5 * stats.cluster_s  # the sleeps counted


def test_past_the_rows_the_inverted_file_trains_on_no_chunk_waits_for_the_index() -> None:
    """Each chunk goes into the index as it comes: once the next one is asked for, no chunk
    past those trained on is held (not even as a copy), so what the build holds is the
    training rows and a chunk, not the night's vectors."""
    import tracemalloc
    import weakref

    vectors = _groups(1000, 10, 0.12, seed=4, dim=256)  # 10,000 rows: 10 MB of fp32
    order = embedding_order(len(vectors), exact_rows=100)
    handed: list[weakref.ref[np.ndarray]] = []
    alive_when_asked: list[int] = []

    def chunks() -> Any:
        for start in range(0, len(order), 250):
            alive_when_asked.append(sum(ref() is not None for ref in handed))
            chunk = vectors[order[start : start + 250]]
            handed.append(weakref.ref(chunk))
            yield chunk
            del chunk  # this generator's own reference

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        neighbour_index(chunks(), order, 100, 256, 16, 0.9)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    trained_on = -(-TRAIN_ROWS_PER_LIST * (len(vectors) // 256) // 250)  # chunks, rounded up
    assert len(alive_when_asked) == 40 and trained_on == 10
    assert max(alive_when_asked[trained_on + 1 :]) == 0, alive_when_asked
    assert peak < 0.6 * vectors.nbytes, (peak, vectors.nbytes)  # all of them held: > 1.0


def test_texts_held_as_arrow_read_as_python_strings() -> None:
    """What the encoders are handed: a slice, an item, every text in turn, the texts at some
    rows, from a list, an Arrow array or a chunked one alike."""
    import pyarrow as pa

    words = [f"wording {i} é" for i in range(10_000)]
    for held in (words, pa.array(words), pa.chunked_array([words[:3], words[3:]])):
        texts = Texts(held)
        assert len(texts) == len(words) and texts[-1] == words[-1] and texts[2] == words[2]
        assert texts[4095:4100] == words[4095:4100] and texts[9_998:20_000] == words[9_998:]
        assert texts[::3000] == words[::3000] and list(texts) == words
        assert list(texts.take(np.array([7, 1, 7]))) == [words[7], words[1], words[7]]
    with pytest.raises(IndexError):
        Texts(words)[10_000]


def test_clusters_held_flat_read_back_as_lists() -> None:
    """The greedy pass's clusters, kept as two flat arrays: each one read back as the list it
    was, by place (from the end too), in order, and every row in turn."""
    made = [[4, 1, 2], [0], [], [3, 9]]
    clusters = Clusters()
    for members in made:
        clusters.append(members)
    assert len(clusters) == 4 and list(clusters) == made
    assert clusters[0] == made[0] and clusters[-1] == made[-1] and clusters[2] == []
    assert clusters[1:3] == made[1:3] and clusters.rows().tolist() == [4, 1, 2, 0, 3, 9]
    with pytest.raises(IndexError):
        clusters[4]
    assert list(Clusters.singletons(3)) == [[0], [1], [2]] and not Clusters().rows().size


def test_lists_sized_once_hold_what_adding_each_chunk_would() -> None:
    """The vectors kept on disk until all came, then added to lists sized for them: the same
    lists, in the same order, as ``add_with_ids`` a chunk at a time (codes, ids, read back by
    id, removable); the temporary folder is gone after, and after a failure too."""
    import faiss

    vectors = _groups(300, 10, 0.1, seed=5, dim=32)
    rows = np.random.default_rng(2).permutation(len(vectors)).astype(np.int64)

    def trained() -> Any:
        index = faiss.index_factory(32, "IVF20_HNSW32,SQfp16", faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.extract_index_ivf(index)
        ivf.train(vectors[:1000])
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        return index, ivf

    grown, _ = trained()
    for start in range(0, len(rows), 700):
        grown.add_with_ids(vectors[start : start + 700], rows[start : start + 700])
    sized, ivf = trained()
    with _Assigned(ivf) as assigned:
        folder = Path(assigned._folder.name)
        for start in range(0, len(rows), 700):
            assigned.add(rows[start : start + 700], vectors[start : start + 700])
        assigned.fill(batch=256)
    assert not folder.exists()
    assert assigned.counts.sum() == sized.ntotal == grown.ntotal == len(vectors)
    for number in range(20):
        grown_lists, sized_lists = (faiss.extract_index_ivf(i).invlists for i in (grown, sized))
        size = grown_lists.list_size(number)
        assert sized_lists.list_size(number) == size == assigned.counts[number]
        for get, width in (("get_ids", 1), ("get_codes", ivf.code_size)):  # elements
            a, b = (
                faiss.rev_swig_ptr(getattr(lists, get)(number), size * width).tobytes()
                for lists in (grown_lists, sized_lists)
            )
            assert a == b
    picked = rows[:50]
    assert np.array_equal(sized.reconstruct_batch(picked), grown.reconstruct_batch(picked))
    sized.remove_ids(faiss.IDSelectorArray(len(picked), faiss.swig_ptr(picked)))
    assert sized.ntotal == len(vectors) - 50
    with pytest.raises(ValueError), _Assigned(ivf) as failing:
        folder = Path(failing._folder.name)
        failing.add(rows[:10], vectors[:10])
        raise ValueError("the embedding job failed")
    assert not folder.exists()


def test_mining_with_the_approximate_search_finds_the_exact_search_s_qualifying_clusters(
    embedder: Any, tmp_path: Path
) -> None:
    """Synthetic logs shaped like a large product's (a Zipf head, a long tail of one-off
    wordings): forced onto the inverted file, mining finds >= 99 % of the clusters the exact
    search finds."""
    questions = [wording for intent in INTENTS for wording in intent]
    tables = [t for _, t in synthetic_tables(6000, questions, date(2026, 11, 28), seed=3)]
    now = datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC)

    # each wording embedded once for both runs (the same vectors: only the search differs)
    vectors: dict[str, np.ndarray] = {}
    encode = local_encoder(embedder)

    def remembered(texts: list[str], progress: bool = False) -> Iterator[np.ndarray]:
        missing = [t for t in dict.fromkeys(texts) if t not in vectors]
        if missing:
            vectors.update(zip(missing, np.concatenate(list(encode(missing))), strict=True))
        yield np.stack([vectors[t] for t in texts])

    def qualifying(config: MiningConfig) -> tuple[set[tuple[str, ...]], Any]:
        hot, report = mine(tables, None, config, now, encoder=lambda: remembered)
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
