"""Clustering the night's wordings into questions (mining's rule 5, ``mining.py``): near-duplicates
grouped greedily, most asked first, at the embedder's cluster threshold.

The greedy rule: taking the wordings most asked first, each one not yet in a cluster opens one
and takes every wording not yet in a cluster at cosine >= threshold whose numbers match.

What it costs grows ``n log n``, not ``n²``:

- Embedding: every wording once, in batches through the embedder's fast path
  (``edge_index.query_encoder.encode_many``: fp32, texts grouped by token length; ``encode`` on
  a GPU).
- Neighbours: a wording's neighbours at the threshold come from a range search. Up to
  ``exact_rows`` wordings the index is exact (``IndexFlatIP``); past it, an inverted file whose
  lists hold ~``list_rows`` wordings each, the coarse centroids in an HNSW graph
  (``IVF<n/list_rows>_HNSW32,SQfp16``: assigning a vector costs ``log`` of the lists), searched in
  the ``nprobe`` nearest lists: each query scans ``nprobe × list_rows`` vectors. The lists hold
  the vectors in fp16 (``SQfp16``): half the memory of fp32, whose lists, grown one vector at a
  time, hold ~1.4× their vectors (402,732 wordings: 830 MB in fp32 lists, 416 MB in fp16); a
  cosine moves by at most 2⁻¹¹ (~10⁻⁵ typically) against fp32, and the recall measured below
  counts it. SemDeDup's design
  (k-means partitions, pairs searched only in a partition and its nearest ones) as FAISS builds
  it. Every night measures its recall against an exact search on sampled wordings and probes
  more lists until it reaches ``recall`` (``neighbour_index``); ``benchmarks/scale.py`` reports
  the clusters found again against the exact search.
- The greedy pass asks for neighbours a batch of unclustered wordings at a time, in order, and
  removes every wording it clusters from the index: a query returns unclustered neighbours only,
  so what a range search returns stays bounded by what the pass then takes (a hot question's
  thousands of one-off wordings come back once, to the query that takes them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import faiss
    from sentence_transformers import SentenceTransformer

CLUSTER_Z = 6.8  # all-MiniLM-L6-v2 on banking77: median 0.21 + 6.8 x MAD 0.10 = its 0.9
QUERY_BATCH = 4096  # wordings whose neighbours one range search asks for


@dataclass
class ClusterStats:
    """How the night's wordings were clustered: the index searched and its probes, the
    threshold, and the seconds and rate of each step."""

    wordings: int = 0
    index: str = ""
    nprobe: int | None = None
    threshold: float | None = None
    embed_s: float = 0.0
    cluster_s: float = 0.0
    neighbours: int = 0  # (query, neighbour) pairs the range searches returned
    # of the neighbours an exact search finds for ``RECALL_PROBES`` random wordings, the share
    # the inverted file finds too (None: the search was exact)
    neighbour_recall: float | None = None

    @property
    def wordings_per_s(self) -> float | None:
        return round(self.wordings / self.embed_s, 1) if self.embed_s > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "wordings": self.wordings,
            "index": self.index,
            "nprobe": self.nprobe,
            "threshold": self.threshold,
            "embed_s": round(self.embed_s, 2),
            "cluster_s": round(self.cluster_s, 2),
            "embed_wordings_per_s": self.wordings_per_s,
            "neighbours": self.neighbours,
            "neighbour_recall": self.neighbour_recall,
        }


def estimated_cluster_threshold(vectors: Any, sample: int = 2000) -> float:
    """For an embedder without a measured scale (a folder): the night's pairwise cosines'
    median plus ``CLUSTER_Z`` robust deviations (MAD), clipped to [0.85, 0.99] — most pairs are
    different questions, so this sits where only their far tail reaches."""
    picked = vectors[:: max(1, len(vectors) // sample)][:sample]
    if len(picked) < 8:
        return 0.99
    scores = (picked @ picked.T)[np.triu_indices(len(picked), 1)]
    median = float(np.median(scores))
    spread = float(np.median(np.abs(scores - median)))
    return float(min(0.99, max(0.85, median + CLUSTER_Z * spread)))


def embed(
    texts: Sequence[str], embedder: SentenceTransformer, progress: bool = False
) -> list[np.ndarray]:
    """Unit-length fp32 vectors of ``texts``, row for row, in chunks (``neighbour_index`` moves
    them into the index a chunk at a time: the night's vectors are held once)."""
    from edge_index.query_encoder import encode_chunks

    return list(encode_chunks(embedder, texts, progress=progress))


def sample_rows(chunks: Sequence[np.ndarray], rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` vectors drawn at random (all when there are fewer), in row order."""
    n = sum(len(c) for c in chunks)
    chosen = np.arange(n) if n <= rows else np.random.default_rng(seed).choice(n, rows, False)
    return _rows_of(chunks, np.sort(chosen))


def neighbour_index(
    chunks: list[np.ndarray],
    exact_rows: int,
    list_rows: int,
    nprobe: int,
    threshold: float = 0.9,
    stats: ClusterStats | None = None,
    recall: float = 0.99,
) -> tuple[faiss.Index, str, int | None]:
    """The index the greedy pass searches (ids = row numbers; vectors read back by id), its
    factory string and probes. Consumes ``chunks``: each one moves into the index.

    An inverted file's probes are chosen per night: from ``nprobe``, doubled until the
    neighbours at ``threshold`` it finds for ``RECALL_PROBES`` random wordings hold ``recall``
    of those an exact search finds (``stats.neighbour_recall``: the share reached). The lists
    a near-duplicate falls into spread as the night grows (437,551 wordings, 256 a list: 16
    probes find 0.955 of the neighbours, 32 find 0.996), so a fixed number would lose recall
    with size."""
    import faiss

    n, dim = sum(len(c) for c in chunks), chunks[0].shape[1]
    if n <= exact_rows:
        flat = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))  # ids survive removals
        _add(flat, chunks)
        return flat, "Flat", None
    nlist = max(1, n // list_rows)
    factory = f"IVF{nlist}_HNSW32,SQfp16"
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    # k-means on 64 points per list (FAISS warns below 39): linear in the night's size
    index.train(sample_rows(chunks, 64 * nlist))
    ivf = faiss.extract_index_ivf(index)
    hashtable = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]
    ivf.set_direct_map_type(hashtable)  # vectors read back by id, and removable
    probes_at, exact = _exact_neighbours(chunks, threshold, RECALL_PROBES)
    probe_vectors = _rows_of(chunks, probes_at)
    _add(index, chunks)
    wanted = sum(len(e) for e in exact)
    ivf.nprobe = min(nprobe, nlist)
    while True:
        lims, _, ids = index.range_search(probe_vectors, threshold)
        found = sum(
            len(exact[i] & set(ids[lims[i] : lims[i + 1]].tolist())) for i in range(len(exact))
        )
        reached = found / wanted if wanted else 1.0
        if reached >= recall or ivf.nprobe >= nlist:
            break
        ivf.nprobe = min(2 * ivf.nprobe, nlist)
    if stats is not None:
        stats.neighbour_recall = round(reached, 4)
    return index, factory, int(ivf.nprobe)


def _add(index: faiss.Index, chunks: list[np.ndarray]) -> None:
    """Move the chunks into ``index``, ids = row numbers."""
    start = 0
    while chunks:
        chunk = chunks.pop(0)
        index.add_with_ids(chunk, np.arange(start, start + len(chunk), dtype=np.int64))
        start += len(chunk)


RECALL_PROBES = 500  # wordings whose neighbours are searched exactly too, to measure recall


def _rows_of(chunks: Sequence[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The vectors at ``rows`` (ascending) of the chunks, in that order."""
    dim = chunks[0].shape[1] if chunks else 0
    picked, start = [], 0
    for chunk in chunks:
        inside = rows[(rows >= start) & (rows < start + len(chunk))] - start
        picked.append(chunk[inside])
        start += len(chunk)
    return np.concatenate(picked) if picked else np.zeros((0, dim), dtype=np.float32)


def _exact_neighbours(
    chunks: Sequence[np.ndarray], threshold: float, probes: int
) -> tuple[np.ndarray, list[set[int]]]:
    """``probes`` random rows, and each one's rows at ``threshold`` or above, found exactly
    (a product with every chunk: ``probes × n`` scores, a chunk at a time)."""
    n = sum(len(c) for c in chunks)
    rows = np.sort(np.random.default_rng(1).choice(n, min(probes, n), replace=False))
    asked = _rows_of(chunks, rows)
    exact: list[set[int]] = [set() for _ in rows]
    start = 0
    for chunk in chunks:
        hit_probe, hit_row = np.nonzero(asked @ chunk.T >= threshold)
        for probe, row in zip(hit_probe.tolist(), (hit_row + start).tolist(), strict=True):
            if row != rows[probe]:  # itself is no neighbour
                exact[probe].add(row)
        start += len(chunk)
    return rows, exact


def greedy_clusters(
    chunks: list[np.ndarray],
    threshold: float,
    numbers_of: Callable[[int], Any],
    exact_rows: int = 20_000,
    list_rows: int = 256,
    nprobe: int = 16,
    stats: ClusterStats | None = None,
    progress: bool = False,
    recall: float = 0.99,
) -> list[list[int]]:
    """Rows of the vectors in ``chunks`` (unit length, in the greedy order: most asked first;
    consumed) grouped: each cluster's rows, its head first, the others ascending.
    ``numbers_of(row)``: what must match for two rows to join (``edge_index.guard.numbers`` of
    the wording)."""
    import faiss

    stats = stats if stats is not None else ClusterStats()
    started = time.perf_counter()
    n = sum(len(c) for c in chunks)
    stats.threshold = threshold
    if n == 0:
        return []
    index, stats.index, stats.nprobe = neighbour_index(
        chunks, exact_rows, list_rows, nprobe, threshold, stats, recall
    )
    numbers: dict[int, Any] = {}

    def numbers_at(row: int) -> Any:
        if row not in numbers:
            numbers[row] = numbers_of(row)
        return numbers[row]

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc="clustering", unit="wording", leave=False)
    assigned = np.zeros(n, dtype=bool)
    clusters: list[list[int]] = []
    position = 0
    while position < n:
        queries: list[int] = []
        while position < n and len(queries) < QUERY_BATCH:
            if not assigned[position]:
                queries.append(position)
            position += 1
        if not queries:
            break
        asked = index.reconstruct_batch(np.asarray(queries, dtype=np.int64))
        lims, _scores, ids = index.range_search(asked, threshold)
        stats.neighbours += len(ids)
        taken: list[int] = []
        for r, head in enumerate(queries):
            if assigned[head]:
                continue  # an earlier query of this batch took it
            assigned[head] = True
            members = [head]
            found = ids[lims[r] : lims[r + 1]]
            found = np.sort(found[(found != head) & ~assigned[found]])
            if len(found):
                head_numbers = numbers_at(head)
                for row in found.tolist():
                    if numbers_at(row) == head_numbers:
                        assigned[row] = True
                        members.append(row)
            clusters.append(members)
            taken += members
        gone = np.asarray(taken, dtype=np.int64)
        index.remove_ids(faiss.IDSelectorArray(len(gone), faiss.swig_ptr(gone)))
        if bar is not None:
            bar.update(len(taken))
    if bar is not None:
        bar.close()
    stats.cluster_s += time.perf_counter() - started
    return clusters
