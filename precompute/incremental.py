"""Rule 5 on an incremental night (DESIGN: "carried clusters absorb new wordings, only the rest
is clustered"; ``docs/precompute.md``, "Carried clusters"), and ``NightCaches``: what a night's
mining reads and writes across nights.

With the state the nights before kept (``clusterstate.py``), each wording its map holds in a
live cluster stays in it (carried: neither embedded nor clustered again). Each other one (new)
is embedded and searched among the heads at the threshold, numbers matching, as the greedy pass
searches: it joins the nearest head's cluster (absorbed). The rest are clustered greedily among
themselves (``clustering.greedy_clusters``), their heads added to the index under new numbers.
A cluster none of whose wordings is in tonight's window is retired (its head removed). Then
tonight's state is written.

Unlike the caches (``nightcache.py``) the state is an input of the night, as carried evidence
is: old wordings stay grouped as the night that clustered them grouped them, and a new wording
joins a cluster through its head, where clustering the whole window again might have opened
that cluster at another wording (one asked more tonight). Without a usable state the night
clusters every wording and writes the state anew.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.errors import EdgeQAError
from precompute.clustering import (
    ClusterStats,
    Encoder,
    Heads,
    Texts,
    embed,
    embedding_order,
    greedy_clusters,
)
from precompute.clusters import Clusters
from precompute.clusterstate import Carried, ClusterState, clusters_fingerprint, numbers_hash
from precompute.dayparts import DayParts, days_fingerprint
from precompute.nightcache import NightCache, embedder_fingerprint, rules_fingerprint
from precompute.vectorcache import VECTOR_CHUNK
from semantic.guard import numbers

if TYPE_CHECKING:
    import faiss
    import pyarrow as pa

    from base.store import Store
    from precompute.config import MiningConfig


@dataclass(frozen=True)
class NightCaches:
    """What a night's mining reads and writes across nights (None: that one is not kept): the
    text rules' verdicts and the wordings' vectors (caches: ``nightcache.py``), each log day's
    reduction (``dayparts.py``: read from the logs once) and the carried clusters (an input:
    above)."""

    verdicts: NightCache | None = None
    vectors: NightCache | None = None
    clusters: ClusterState | None = None
    days: DayParts | None = None

    @classmethod
    def of_night(
        cls,
        store: Store,
        profile: str,
        language: str | None,
        embedder: str,
        since: date,
        until: date,
        mining: MiningConfig | None = None,
    ) -> NightCaches:
        """The caches of ``profile``, for the night whose window is ``since`` to ``until``,
        under the fingerprints of tonight's text rules and embedder (``embedder``'s spec: its
        fingerprint taken when a wording is to be embedded, not before); and its carried
        clusters, when ``mining`` (the night's settings: the threshold, the list size) is
        given."""
        clusters = days = None
        if mining is not None:
            days = DayParts(
                store,
                profile,
                functools.partial(days_fingerprint, language, mining),
                since,
                until,
            )
            clusters = ClusterState(
                store,
                profile,
                functools.partial(
                    clusters_fingerprint,
                    embedder,
                    mining.cluster_threshold,
                    mining.cluster_list_rows,
                ),
                since,
                until,
            )
        return cls(
            NightCache(store, profile, "verdicts", rules_fingerprint(language), since, until),
            NightCache(
                store,
                profile,
                "vectors",
                functools.partial(embedder_fingerprint, embedder),
                since,
                until,
            ),
            clusters,
            days,
        )

    def close(self) -> None:
        """Write what is left and expire old parts (again: closing twice is harmless), even
        for a night that had nothing to embed or failed."""
        for cache in (self.verdicts, self.vectors, self.clusters, self.days):
            if cache is not None:
                cache.close()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            name: cache.counts.as_dict()
            for name, cache in (("verdicts", self.verdicts), ("vectors", self.vectors))
            if cache is not None
        }
        if self.clusters is not None:
            out["clusters"] = self.clusters.counts.as_dict()
        if self.days is not None:
            out["days"] = self.days.counts.as_dict()
        return out


def night_clusters(
    state: ClusterState,
    keys: pa.Array,
    texts: Texts,
    encode: Callable[[], Encoder],
    config: MiningConfig,
    stats: ClusterStats,
    progress: bool,
    from_scratch: Callable[[Heads], Clusters],
) -> Clusters:
    """Rule 5 on the night's wordings (``keys``, ``texts``: rows most asked first) with the
    carried clusters: those of the latest state kept, the new wordings absorbed or clustered
    among themselves, tonight's state written. Without a usable state, ``from_scratch(heads)``
    clusters every wording (the heads kept in ``heads``) and the state is written anew."""
    carried = state.load()
    n = len(keys)
    if carried is not None and _outgrown(carried.index, config):
        state.counts.started, carried = "outgrown", None
    if carried is None:
        heads = Heads()
        clusters = from_scratch(heads)
        if heads.index is None or stats.threshold is None or state.counts.started == "fingerprint":
            return clusters  # nothing to keep, or nowhere to keep it
        everyone = np.arange(n, dtype=np.int64)
        labels = np.empty(n, dtype=np.int64)
        hashes = _numbered(clusters, everyone, texts, labels, 0)
        state.counts.clustered, state.counts.new_clusters = n, len(clusters)
        state.keep(keys, labels, everyone)
        ids = np.arange(len(clusters), dtype=np.int64)
        night = state.map.night
        state.save(
            Carried(heads.index, ids, hashes, len(ids), stats.threshold, stats.nprobe, night, [])
        )
        return clusters
    labels, nights = state.members(carried, keys)
    new = np.flatnonzero(labels < 0)
    state.counts.carried = n - len(new)
    stats.index, stats.nprobe, stats.threshold = "carried", carried.nprobe, carried.threshold
    fresh, fresh_hashes = Clusters(), np.zeros(0, dtype=np.int64)
    if len(new):
        rest, rest_order, rest_chunks = _absorbed(
            carried, labels, new, texts, encode, config, stats, progress
        )
        state.counts.absorbed = len(new) - len(rest)
        if len(rest):
            fresh = greedy_clusters(
                rest_chunks,
                carried.threshold,
                lambda u: numbers(texts[int(rest[u])]),
                exact_rows=config.exact_cluster_rows,
                list_rows=config.cluster_list_rows,
                nprobe=config.cluster_nprobe,
                stats=stats,
                progress=progress,
                recall=config.cluster_recall,
                order=rest_order,
                heads=Heads(carried.index, carried.next_id),
            )
            fresh_hashes = _numbered(fresh, rest, texts, labels, carried.next_id)
        state.counts.clustered, state.counts.new_clusters = len(rest), len(fresh)
    alive = np.isin(carried.ids, labels)
    _retire(carried.index, carried.ids[~alive])
    state.counts.retired = int((~alive).sum())
    stale = (nights > 0) & (nights <= state.map.since.toordinal())
    state.counts.rewritten = int(stale.sum())
    state.keep(keys, labels, np.union1d(new, np.flatnonzero(stale)))
    next_id = carried.next_id + len(fresh)
    ids = np.concatenate([carried.ids[alive], np.arange(carried.next_id, next_id)])
    hashes = np.concatenate([carried.numbers[alive], fresh_hashes])
    state.save(dataclasses.replace(carried, ids=ids, numbers=hashes, next_id=next_id))
    return Clusters.of_labels(labels)


def _absorbed(
    carried: Carried,
    labels: np.ndarray,
    new: np.ndarray,
    texts: Texts,
    encode: Callable[[], Encoder],
    config: MiningConfig,
    stats: ClusterStats,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray, Iterator[np.ndarray]]:
    """The new wordings (rows ``new``) embedded, a chunk at a time, in a random order past the
    exact index (``embedding_order``: what an inverted file of the rest trains on is a fair
    sample), each absorbed into a carried cluster (``labels``) where its nearest head with its
    numbers is at the threshold. The rest: their rows (ascending), the order their vectors come
    in (positions in those rows) and the vectors, a chunk at a time from a file in a private
    temporary folder (the night's new vectors are never all held)."""
    order = embedding_order(len(new), config.exact_cluster_rows)
    folder = tempfile.TemporaryDirectory(prefix="edgeqa-new-wordings-")
    path = Path(folder.name) / "rest.f32"
    came: list[np.ndarray] = []
    start, dim = 0, carried.index.d
    chunks = iter(embed(texts.take(new), encode(), order, progress))
    try:
        with path.open("wb") as out:
            while True:
                waited = time.perf_counter()
                try:
                    vectors = next(chunks)
                except StopIteration:
                    break
                finally:
                    stats.embed_s += time.perf_counter() - waited
                started = time.perf_counter()
                at = order[start : start + len(vectors)]
                start += len(vectors)
                if vectors.shape[1] != dim:
                    raise EdgeQAError(
                        f"the embedder's vectors have {vectors.shape[1]} dimensions, the "
                        f"carried clusters' heads {dim}"
                    )
                joined = _absorb(carried, vectors, new[at], texts)
                labels[new[at]] = np.where(joined >= 0, joined, labels[new[at]])
                left = joined < 0
                out.write(np.ascontiguousarray(vectors[left], dtype=np.float32).tobytes())
                came.append(at[left])
                stats.cluster_s += time.perf_counter() - started
        if start != len(new):
            raise ValueError(f"vectors for {start} of the {len(new)} new wordings came")
    except BaseException:  # the folder, and what embeds, let go at once
        folder.cleanup()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        raise
    arrival = np.concatenate(came) if came else np.zeros(0, dtype=np.int64)
    positions = np.sort(arrival)

    def rest_chunks() -> Iterator[np.ndarray]:
        try:
            for first in range(0, len(arrival), VECTOR_CHUNK):
                count = min(VECTOR_CHUNK, len(arrival) - first)
                block = np.fromfile(path, np.float32, count * dim, offset=4 * dim * first)
                yield block.reshape(count, dim)
        finally:
            folder.cleanup()

    if not len(arrival):
        folder.cleanup()
    return new[positions], np.searchsorted(positions, arrival), rest_chunks()


def _numbered(
    clusters: Clusters, rows: np.ndarray, texts: Texts, labels: np.ndarray, first: int
) -> np.ndarray:
    """Each row of ``clusters`` (numbers into ``rows``, the night's rows they stand for) labelled
    with its cluster's number, ``first`` the first cluster's; each cluster's head's numbers
    hash, in order."""
    sizes, members = clusters.sizes(), clusters.rows()
    labels[rows[members]] = first + np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    heads = rows[members[np.cumsum(sizes) - sizes]]
    return np.array([numbers_hash(texts[int(r)]) for r in heads], dtype=np.int64)


OUTGROWN = 4  # heads a list may hold, in lists of ``cluster_list_rows``, before they are redrawn


def _outgrown(index: faiss.Index, config: MiningConfig) -> bool:
    """Whether the heads' index no longer fits the night's size: an exact one holding more
    heads than ``exact_cluster_rows`` (searching it grows with all pairs), or an inverted file
    whose lists hold ``OUTGROWN`` times what they were sized for. The night then clusters from
    scratch, and its state is drawn anew at its size."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return bool(index.ntotal > config.exact_cluster_rows)
    return bool(index.ntotal > OUTGROWN * ivf.nlist * config.cluster_list_rows)


def _absorb(carried: Carried, vectors: np.ndarray, rows: np.ndarray, texts: Texts) -> np.ndarray:
    """For each of ``vectors`` (the wordings ``rows``), the carried cluster whose head is the
    nearest at the threshold with the same numbers (-1: none)."""
    joined = np.full(len(rows), -1, dtype=np.int64)
    if not carried.index.ntotal or not len(rows):
        return joined
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    lims, scores, found = carried.index.range_search(vectors, carried.threshold)
    for i in np.flatnonzero(np.diff(lims)).tolist():
        heads, near = found[lims[i] : lims[i + 1]], scores[lims[i] : lims[i + 1]]
        same = carried.numbers[np.searchsorted(carried.ids, heads)] == numbers_hash(
            texts[int(rows[i])]
        )
        if same.any():
            joined[i] = heads[same][np.argmax(near[same])]
    return joined


def _retire(index: faiss.Index, ids: np.ndarray) -> None:
    """The heads of the clusters ``ids`` (none of whose wordings is in tonight's window) gone."""
    import faiss

    if len(ids):
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        index.remove_ids(faiss.IDSelectorArray(len(ids), faiss.swig_ptr(ids)))
