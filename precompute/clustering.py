"""Clustering the night's wordings into questions (mining's rule 5, ``mining.py``): near-duplicates
grouped greedily, most asked first, at the embedder's cluster threshold.

The greedy rule: taking the wordings most asked first, each one not yet in a cluster opens one
and takes every wording not yet in a cluster at cosine >= threshold whose numbers match.

What it costs grows ``n log n``, not ``n²``:

- Embedding: every wording once, in batches through the embedder's fast path
  (``semantic.batch.encode_chunks``: fp32, texts grouped by token length; ``encode``
  on a GPU). Past ``exact_rows`` the wordings are embedded in a random order
  (``embedding_order``): the inverted file trains on the first chunks, a fair sample, and every
  later chunk goes into it as it is embedded, so the night's fp32 vectors are never all held.
- Neighbours: a wording's neighbours at the threshold come from a range search. Up to
  ``exact_rows`` wordings the index is exact (``IndexFlatIP``); past it, an inverted file whose
  lists hold ~``list_rows`` wordings each, the coarse centroids in an HNSW graph
  (``IVF<n/list_rows>_HNSW32,SQfp16``: assigning a vector costs ``log`` of the lists), searched in
  the ``nprobe`` nearest lists: each query scans ``nprobe × list_rows`` vectors. The lists hold
  the vectors in fp16 (``SQfp16``): half the memory of fp32, each list sized once to what it
  holds (``_Assigned``: a list grown a chunk at a time holds ~1.4× its vectors); a cosine
  moves by at most 2⁻¹¹ (~10⁻⁵ typically) against fp32, and the recall measured below counts
  it. SemDeDup's design (k-means partitions, pairs searched only in a partition and its
  nearest ones) as FAISS builds it; past ``TWO_LEVEL_LISTS`` lists the k-means runs in two
  levels (``train_lists``), so its cost per wording stays flat as the night grows. Every night
  measures its recall against an exact search on sampled wordings and probes more lists until
  it reaches ``recall`` (``neighbour_index``); ``benchmarks/scale.py`` reports the clusters
  found again against the exact search.
- The greedy pass asks for neighbours a batch of unclustered wordings at a time, in order, and
  removes every wording it clusters from the index: a query returns unclustered neighbours only,
  so what a range search returns stays bounded by what the pass then takes (a hot question's
  thousands of one-off wordings come back once, to the query that takes them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from precompute.clusters import Clusters

if TYPE_CHECKING:
    import faiss
    import pyarrow as pa

    from semantic.embedder import Embedder

# texts (and whether to show progress) -> their unit-length fp32 vectors, a chunk at a time,
# in order
Encoder = Callable[..., Iterator[np.ndarray]]

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
    index_bytes: int = 0  # the vectors (codes) and ids the index holds once every one is in

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
            "index_bytes": self.index_bytes,
            "index_bytes_per_wording": round(self.index_bytes / self.wordings, 1)
            if self.wordings
            else None,
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


def embedding_order(n: int, exact_rows: int) -> np.ndarray:
    """The order the night's ``n`` wordings are embedded in: as they are, up to ``exact_rows``
    (the exact index holds them all); past it, at random (seeded), so that the first chunks
    embedded are a fair sample to train the inverted file on and every later chunk goes into it
    as it is embedded. Only the rows it trains on wait for the index (a million log rows:
    114,688 of 402,732 wordings, whole chunks of 16,384 as then; 176 MB of fp32 vectors, where
    all of them held 618 MB)."""
    if n <= exact_rows:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(0).permutation(n).astype(np.int64)


class Texts(Sequence[str]):
    """Texts held as one Arrow string array, made Python strings a slice at a time, as an
    encoder reads them: the night's wordings (500,000 of them: ~30 MB as Arrow, ~85 MB as
    Python strings, which clustering held until it was done)."""

    def __init__(self, texts: pa.Array | pa.ChunkedArray | Sequence[str]) -> None:
        import pyarrow as pa

        if isinstance(texts, Texts):
            texts = texts.array
        elif isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        elif not isinstance(texts, pa.Array):
            texts = pa.array(list(texts), pa.string())
        self.array: pa.Array = texts

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, at: int) -> str: ...

    @overload
    def __getitem__(self, at: slice) -> list[str]: ...

    def __getitem__(self, at: int | slice) -> str | list[str]:
        if isinstance(at, slice):
            start, stop, step = at.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self.array.slice(start, max(0, stop - start)).to_pylist()  # type: ignore[no-any-return]
        return self.array[at].as_py()  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), 4096):
            yield from self[start : start + 4096]

    def take(self, rows: np.ndarray) -> Texts:
        """The texts at ``rows``, in that order."""
        import pyarrow as pa

        return Texts(self.array.take(pa.array(rows, pa.int64())))


def embed(
    texts: Sequence[str],
    encode: Encoder,
    order: np.ndarray | None = None,
    progress: bool = False,
) -> Iterator[np.ndarray]:
    """Unit-length fp32 vectors of ``texts[order[0]]``, ``texts[order[1]]``, ... (None: row
    order), a chunk at a time, as ``encode`` makes them: ``local_encoder``'s, or a Ray job's
    (``fleet.embedding.RayEncoder``)."""
    picked = texts if order is None else Texts(texts).take(order)
    return encode(picked, progress)


def local_encoder(embedder: Embedder) -> Encoder:
    """``embedder`` in this process (``encode_chunks``) as an ``Encoder``."""
    from semantic.batch import encode_chunks

    return lambda texts, progress=False: encode_chunks(embedder, texts, progress=progress)


def sample_rows(n: int, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` of ``range(n)`` drawn at random (all when there are fewer), ascending."""
    if n <= rows:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, rows, False)).astype(np.int64)


RECALL_PROBES = 500  # wordings whose neighbours are searched exactly too, to measure recall
PROBE_GAIN = 0.001  # recall twice the probes must add, or the probes stop doubling
QUANTIZER_EF = 64  # candidates the lists' centroid graph is searched with
TRAIN_ROWS_PER_LIST = 64  # k-means points per list (FAISS warns below 39): linear in the night


class _Embedded:
    """The chunks as they come, each with its rows (``order``, in turn); the seconds spent
    waiting for them are the embedder's (``stats.embed_s``)."""

    def __init__(self, chunks: Iterable[np.ndarray], order: np.ndarray, stats: ClusterStats):
        self._chunks, self._order, self._stats, self._start = iter(chunks), order, stats, 0

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        started = time.perf_counter()
        try:
            vectors = next(self._chunks)
        finally:
            self._stats.embed_s += time.perf_counter() - started
        rows = self._order[self._start : self._start + len(vectors)]
        if len(rows) != len(vectors):
            raise ValueError(f"more vectors than the {len(self._order)} rows in order")
        self._start += len(vectors)
        return rows, vectors

    def check_all_came(self) -> None:
        if self._start != len(self._order):
            raise ValueError(f"vectors for {self._start} of the {len(self._order)} rows came")


def neighbour_index(
    chunks: Iterable[np.ndarray],
    order: np.ndarray,
    exact_rows: int,
    list_rows: int,
    nprobe: int,
    threshold: float | None = None,
    stats: ClusterStats | None = None,
    recall: float = 0.99,
    heads: Heads | None = None,
) -> tuple[faiss.Index, str, int | None, float]:
    """The index the greedy pass searches (ids = row numbers; vectors read back by id), its
    factory string, its probes and the threshold (None: estimated from the vectors). Each chunk
    goes into the index as it comes: the vectors of rows ``order[0]``, ``order[1]``, ...

    An inverted file is trained on the first ``TRAIN_ROWS_PER_LIST`` rows a list that come (a
    fair sample: ``embedding_order``; held, as whole chunks, until trained), and its probes are
    chosen per night: from ``nprobe``, doubled until the neighbours at the threshold it finds
    for ``RECALL_PROBES`` random wordings (not trained on, where enough came past those) hold
    ``recall`` of those an exact search finds (``stats.neighbour_recall``: the share reached;
    the exact ones found as the chunks pass, ``probes × n`` scores in all), or until twice the
    probes find fewer than ``PROBE_GAIN`` more of them (the rest is the fp16 codes' rounding at
    the threshold, which no list holds: the fewer probes are kept and their recall reported).
    The lists a near-duplicate falls into spread as the night grows (437,551 wordings, 256 a
    list: 16 probes find 0.955 of the neighbours, 32 find 0.996), so a fixed number would lose
    recall with size. ``heads``: handed an empty index of the same kind, trained (where the
    clusters' heads are kept, when it holds none yet)."""
    import faiss

    stats = stats if stats is not None else ClusterStats()
    n = len(order)
    embedded = _Embedded(chunks, order, stats)
    if n <= exact_rows:
        flat = None
        for rows, vectors in embedded:
            if flat is None:  # ids survive removals
                flat = faiss.IndexIDMap2(faiss.IndexFlatIP(vectors.shape[1]))
                if heads is not None:
                    heads.start(flat)
            flat.add_with_ids(vectors, rows)
        embedded.check_all_came()
        if flat is None:
            raise ValueError("no vectors to index")
        stats.index_bytes = flat.ntotal * (4 * flat.d + 8)  # fp32 vectors and their ids
        if threshold is None:  # exact copies of the vectors, read back by id
            threshold = estimated_cluster_threshold(flat.reconstruct_batch(sample_rows(n, 2000)))
        return flat, "Flat", None, threshold
    nlist = max(1, n // list_rows)
    factory = f"IVF{nlist}_HNSW32,SQfp16"
    wanted = min(n, TRAIN_ROWS_PER_LIST * nlist)
    came, held = _first_rows(embedded, wanted, n)
    if not len(came):
        embedded.check_all_came()
    if threshold is None:
        threshold = estimated_cluster_threshold(came[sample_rows(len(came), 2000)])
    index = faiss.index_factory(came.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    train_lists(ivf, came[:wanted])
    if heads is not None:
        heads.start(index)
    # the graph over the lists' centroids, searched to put each wording in its list: at 16
    # candidates (FAISS's default) a night of 11,718 lists put near-duplicates in lists no
    # number of probes reached together (recall 0.97 at 3,000,000 wordings)
    faiss.downcast_index(ivf.quantizer).hnsw.efSearch = QUANTIZER_EF  # type: ignore[attr-defined]
    hashtable = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]
    ivf.set_direct_map_type(hashtable)  # vectors read back by id, and removable
    # the recall probes: rows the k-means did not train on where enough came past them
    spare = len(came) - wanted >= RECALL_PROBES
    start = wanted if spare else 0
    picked = np.random.default_rng(1).choice(
        len(came) - start, min(RECALL_PROBES, len(came)), False
    )
    asked = start + np.sort(picked)
    probe_vectors = came[asked].copy()
    probe_rows = np.concatenate([r for r, _ in held])[asked]
    del came
    exact: list[set[int]] = [set() for _ in asked]
    with _Assigned(ivf) as assigned:

        def take(rows: np.ndarray, vectors: np.ndarray) -> None:
            hit_probe, hit_at = np.nonzero(probe_vectors @ vectors.T >= threshold)
            for probe, row in zip(hit_probe.tolist(), rows[hit_at].tolist(), strict=True):
                if row != probe_rows[probe]:  # itself is no neighbour
                    exact[probe].add(row)
            assigned.add(rows, vectors)

        while held:
            take(*held.pop(0))
        for rows, vectors in embedded:
            take(rows, vectors)
            del vectors  # on disk now: not held while the next chunk is embedded
        embedded.check_all_came()
        assigned.fill()
    stats.index_bytes = index.ntotal * (ivf.code_size + 8)  # the lists: codes and ids
    wanted = sum(len(e) for e in exact)
    ivf.nprobe = min(nprobe, nlist)
    before: tuple[int, float] | None = None  # the probes tried last and the recall they reached
    while True:
        lims, _, ids = index.range_search(probe_vectors, threshold)
        found = sum(
            len(exact[i] & set(ids[lims[i] : lims[i + 1]].tolist())) for i in range(len(exact))
        )
        reached = found / wanted if wanted else 1.0
        if before is not None and reached - before[1] < PROBE_GAIN:
            # twice the lists found nothing more: what is missed is not in another list (the
            # fp16 codes round a pair at the threshold below it), and probing every list would
            # make the search all pairs
            ivf.nprobe, reached = before
            break
        if reached >= recall or ivf.nprobe >= nlist:
            break
        before = (int(ivf.nprobe), reached)
        ivf.nprobe = min(2 * ivf.nprobe, nlist)
    stats.neighbour_recall = round(reached, 4)
    return index, factory, int(ivf.nprobe), threshold


class _Assigned:
    """The night's vectors, each with its row and the list it falls in, kept in a private
    temporary folder (1.5 KB a wording) until every one has come; ``fill`` then gives each list
    the room it needs before the vectors go in. Grown as the chunks come, a list's room doubles
    whenever it is full: ~1.4× the codes it holds on average (500,000 wordings: ~540 MB for
    370 MB of codes, where sized once the lists take what they hold). The index is the one
    ``add_with_ids`` builds (the same lists, in the same order): the assignment is the
    quantizer's, and ``add_core`` encodes as it does."""

    def __init__(self, ivf: faiss.IndexIVF) -> None:
        import tempfile
        from pathlib import Path

        self._ivf = ivf
        self._folder = tempfile.TemporaryDirectory(prefix="edgeqa-lists-")
        self._paths = [Path(self._folder.name) / n for n in ("rows", "lists", "vectors")]
        self._files = [p.open("wb") for p in self._paths]
        self.counts = np.zeros(ivf.nlist, dtype=np.int64)

    def __enter__(self) -> _Assigned:
        return self

    def __exit__(self, *_: object) -> None:
        for f in self._files:
            f.close()
        self._folder.cleanup()

    def add(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        lists = self._ivf.quantizer.assign(vectors, 1).ravel().astype(np.int64)
        self.counts += np.bincount(lists, minlength=len(self.counts))
        for f, part in zip(self._files, (rows.astype(np.int64), lists, vectors), strict=True):
            f.write(part.tobytes())

    def fill(self, batch: int = 1024) -> None:
        """Each list sized to what it holds, then the vectors added in the order they came."""
        import faiss

        for f in self._files:
            f.close()
        invlists = self._ivf.invlists and faiss.downcast_InvertedLists(self._ivf.invlists)
        if not isinstance(invlists, faiss.ArrayInvertedLists):  # sized in place: in memory
            raise TypeError(f"lists held in memory expected, not {type(invlists).__name__}")
        for number in np.flatnonzero(self.counts).tolist():
            invlists.resize(number, int(self.counts[number]))  # room for exactly these
            invlists.resize(number, 0)  # emptied: the room stays
        d, total = self._ivf.d, int(self.counts.sum())
        for start in range(0, total, batch):
            count = min(batch, total - start)
            rows, lists = (
                np.fromfile(p, dtype=np.int64, count=count, offset=8 * start)
                for p in self._paths[:2]
            )
            vectors = np.fromfile(
                self._paths[2], dtype=np.float32, count=count * d, offset=4 * d * start
            )
            self._ivf.add_core(
                count, faiss.swig_ptr(vectors), faiss.swig_ptr(rows), faiss.swig_ptr(lists)
            )


TWO_LEVEL_LISTS = 1024  # from this many lists, their centroids come from two-level k-means


def train_lists(ivf: faiss.IndexIVF, sample: np.ndarray) -> None:
    """Train the inverted file's lists on ``sample`` (unit vectors). Up to
    ``TWO_LEVEL_LISTS`` lists, FAISS's own k-means; past it, two-level k-means (FAISS's
    ``two_level_clustering``, spherical): ``sqrt(nlist)`` coarse centroids, then each one's
    points split into lists in proportion to their number. One level compares every sampled
    vector with every centroid, so its cost grows with the square of the night (300,000
    wordings: 10 s, 3,000,000: ~1,000 s); two levels compare it with ~``2 sqrt(nlist)``
    (3.8 s and 35 s)."""
    import math

    import faiss
    from faiss.contrib.clustering import two_level_clustering

    if ivf.nlist < TWO_LEVEL_LISTS:
        ivf.train(sample)
        return
    centroids, _ = two_level_clustering(
        sample, int(math.sqrt(ivf.nlist)), ivf.nlist, clustering_niter=10, spherical=True
    )
    ivf.quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
    ivf.train_encoder(len(sample), faiss.swig_ptr(sample), None)  # the fp16 codes: no state
    ivf.is_trained = True


def _first_rows(
    embedded: Iterator[tuple[np.ndarray, np.ndarray]], wanted: int, n: int
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The chunks that come until ``wanted`` rows (of ``n``) have: their vectors in one array
    (what the index trains on), copied in as each chunk comes, and each chunk as (its rows, a
    view into the array): held once."""
    joined = np.zeros((0, 0), dtype=np.float32)
    came: list[np.ndarray] = []
    got = 0
    for rows, vectors in embedded:
        if not len(rows):
            continue
        if got + len(rows) > len(joined):  # room for whole chunks of this size
            room = min(n, max(got + len(rows), -(-wanted // len(rows)) * len(rows)))
            grown = np.empty((room, vectors.shape[1]), dtype=np.float32)
            if got:
                grown[:got] = joined[:got]
            joined = grown
        joined[got : got + len(rows)] = vectors
        came.append(rows)
        got += len(rows)
        if got >= wanted:
            break
    held, start = [], 0
    for rows in came:
        held.append((rows, joined[start : start + len(rows)]))
        start += len(rows)
    return joined[:got], held


class Heads:
    """The clusters' heads, each under its cluster's number plus ``base``, in an index of their
    own: a carried one, or (``index`` None) an empty one of the neighbour index's kind, made
    when that one is trained. A head's vector is the one the neighbour index gives back (its
    fp16 codes past the exact index)."""

    def __init__(self, index: faiss.Index | None = None, base: int = 0) -> None:
        self.index, self.base, self.added = index, base, 0

    def start(self, empty: faiss.Index) -> None:
        """A copy of ``empty`` (trained, holding no vector), when no index is kept yet."""
        import faiss

        if self.index is None:
            self.index = faiss.deserialize_index(faiss.serialize_index(empty))
            ivf = faiss.try_extract_index_ivf(self.index)
            if ivf is not None:  # heads removed by id when their clusters are gone
                ivf.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
                quantizer = faiss.downcast_index(ivf.quantizer)
                if hasattr(quantizer, "hnsw"):  # a new wording's lists found as the night's are
                    quantizer.hnsw.efSearch = QUANTIZER_EF

    def add(self, numbers: np.ndarray, vectors: np.ndarray) -> None:
        if not len(numbers):
            return
        assert self.index is not None, "no index to keep the heads in"
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.index.add_with_ids(vectors, numbers + self.base)
        self.added += len(numbers)


def greedy_clusters(
    chunks: Iterable[np.ndarray],
    threshold: float | None,
    numbers_of: Callable[[int], Any],
    exact_rows: int = 20_000,
    list_rows: int = 256,
    nprobe: int = 16,
    stats: ClusterStats | None = None,
    progress: bool = False,
    recall: float = 0.99,
    order: np.ndarray | None = None,
    heads: Heads | None = None,
) -> Clusters:
    """Rows of the night's vectors (unit length; row numbers in the greedy order: most asked
    first) grouped: each cluster's rows, its head first, the others ascending. ``chunks``: the
    vectors of rows ``order[0]``, ``order[1]``, ..., a chunk at a time, consumed as they come
    (``order`` None: ``chunks`` is a list, in row order, emptied as it goes; an inverted file
    then trains on its first rows, so shuffle them first: ``embedding_order``). ``threshold``
    None: estimated from the vectors. ``numbers_of(row)``: what must match for two rows to
    join (``semantic.guard.numbers`` of the wording). The seconds spent waiting for chunks are
    ``stats.embed_s``; the rest ``stats.cluster_s``. ``heads``: where each cluster's head is
    kept with its vector, under the cluster's number (what the next night carries:
    ``clusterstate.py``)."""
    import faiss

    stats = stats if stats is not None else ClusterStats()
    started, waited = time.perf_counter(), stats.embed_s
    if order is None:
        listed = chunks if isinstance(chunks, list) else list(chunks)
        order = np.arange(sum(len(c) for c in listed), dtype=np.int64)
        chunks = (listed.pop(0) for _ in range(len(listed)))  # each one let go once it is in
    n = len(order)
    if n == 0:
        stats.threshold = threshold
        return Clusters()
    index, stats.index, stats.nprobe, threshold = neighbour_index(
        chunks, order, exact_rows, list_rows, nprobe, threshold, stats, recall, heads
    )
    stats.threshold = threshold
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
    clusters = Clusters()
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
        opened: list[int] = []  # the queries that opened a cluster
        for r, head in enumerate(queries):
            if assigned[head]:
                continue  # an earlier query of this batch took it
            assigned[head] = True
            opened.append(r)
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
        if heads is not None:
            first = len(clusters) - len(opened)
            heads.add(np.arange(first, len(clusters), dtype=np.int64), asked[opened])
        gone = np.asarray(taken, dtype=np.int64)
        index.remove_ids(faiss.IDSelectorArray(len(gone), faiss.swig_ptr(gone)))
        for row in taken:  # a clustered row is never compared again
            numbers.pop(row, None)
        if bar is not None:
            bar.update(len(taken))
    if bar is not None:
        bar.close()
    stats.cluster_s += time.perf_counter() - started - (stats.embed_s - waited)
    return clusters
