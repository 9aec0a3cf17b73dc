"""Carried clusters, as stored: what clustering keeps for the next night, so that a night
clusters only its new wordings (``incremental.py``: how a night uses it; ``docs/precompute.md``,
"Carried clusters").

A night that clusters keeps, under ``<profile>/work/cache/clusters/<fingerprint>/``:

    <night>/<nnnnn>-<token>.parquet  the map: key (a wording's), cluster (int64); parts as the
                                     caches write them (``nightcache.NightCache``)
    state/<night>-<token>.json       the map's parts it holds (``committed``), the next cluster
                                     number, the threshold, the heads' probes, the sha256 of:
    state/<night>-<token>.faiss      the heads' index: each live cluster's head vector
    state/<night>-<token>.heads.parquet  cluster, numbers (a hash of its head's numbers)

The next night takes the latest state written in its window (``ClusterState.load``) and the
map's entries of its wordings (``members``), then writes its own (``keep``, ``save``: the state
last, the earlier states deleted). A state is not used (the night starts from scratch, and
says why: ``ClusterCounts.started``) when there is none under tonight's fingerprint (the
embedder, the threshold, the list size, the code of clustering and of the numbers rule), when
the latest is older than the window's first day (its map has expired), or when it is damaged
(not readable, or a file whose sha256 is not the state's): a damaged state never stops a night.
Only the map's parts a state committed are read: a night that failed after writing some, or an
earlier start's, puts no wording in a cluster.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from importlib.metadata import PackageNotFoundError
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.errors import EdgeQAError
from base.store import (
    ObjectNotFoundError,
    Store,
    TransientStoreError,
    parquet_bytes,
    parquet_table,
)
from precompute.nightcache import (
    PART_ROWS,
    NightCache,
    _digest,
    _sources,
    embedder_fingerprint,
)
from precompute.vectorcache import KeyIndex
from semantic.guard import numbers

if TYPE_CHECKING:
    import faiss
    import pyarrow as pa


log = logging.getLogger(__name__)

STATE_FORMAT = 1
# the map's parts fetched, decoded and looked up at a time (2.4 MB each: what they hold is small)
MAP_AHEAD = 32
MAX_STATE_BYTES = 1 << 20  # a state's JSON (its committed parts: two a night)
# the code that decides which wordings join (a change starts the clusters from scratch)
STATE_MODULES = (
    "precompute/clustering.py",
    "precompute/clusterstate.py",
    "precompute/incremental.py",
    "semantic/guard.py",
)


def clusters_fingerprint(embedder: str, threshold: float | None, list_rows: int) -> str:
    """What a night's clusters depend on: the embedder's vectors (``embedder_fingerprint``),
    the threshold (None: estimated by the night that starts from scratch, then kept), the
    inverted file's list size and the code of clustering and of the numbers rule."""
    header = f"{embedder_fingerprint(embedder)}\0{threshold}\0{list_rows}"
    return _digest(header.encode(), *_sources(STATE_MODULES))


def numbers_hash(text: str) -> int:
    """What must match for two wordings to join (``semantic.guard.numbers``), as a 64-bit
    number kept for a head instead of its numbers: 0 for none."""
    found = numbers(text)
    if not found:
        return 0
    digest = hashlib.blake2b("\0".join(found).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True) or 1


@dataclass
class ClusterCounts:
    """What a night did with the carried clusters: the state it started from (its night) or why
    it started from scratch, its wordings carried, absorbed and clustered, the clusters opened
    and retired, the heads kept for the next night, the map entries rewritten before they fell
    out, and the seconds reading the state, finding tonight's wordings in its map (``map_s``)
    and writing it."""

    carried_from: str | None = None
    # why from scratch: "none", "expired", "damaged", "fingerprint", "outgrown"
    started: str | None = None
    carried: int = 0
    absorbed: int = 0
    clustered: int = 0
    new_clusters: int = 0
    retired: int = 0
    heads: int = 0
    rewritten: int = 0
    load_s: float = 0.0
    map_s: float = 0.0
    save_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in self.__dict__.items()}


@dataclass
class Carried:
    """A state as read: the heads' index, the live clusters' numbers (sorted) and their heads'
    numbers hashes, the next number, the threshold and the heads' probes, the state's night and
    the map's parts it holds (``<night>/<token>``)."""

    index: faiss.Index
    ids: np.ndarray
    numbers: np.ndarray
    next_id: int
    threshold: float
    nprobe: int | None
    night: date
    committed: list[str]


def _part_token(path: str) -> str:
    """``<night>/<token>`` of a map part's path (``.../<night>/<nnnnn>-<token>.parquet``)."""
    night, name = path.rsplit("/", 2)[-2:]
    return f"{night}/{name.removesuffix('.parquet').split('-', 1)[-1]}"


def _map_part(schema: pa.Schema) -> bool:
    import pyarrow as pa

    return schema.field("key").type == pa.string() and schema.field("cluster").type == pa.int64()


class ClusterState:
    """The carried clusters of one profile under one fingerprint, for the night whose window is
    ``since`` to ``night``: read (``load``, ``members``), then written (``save``)."""

    def __init__(
        self,
        store: Store,
        profile: str,
        fingerprint: str | Callable[[], str],
        since: date,
        night: date,
    ) -> None:
        self.map = NightCache(store, profile, "clusters", fingerprint, since, night)
        self.counts = ClusterCounts()
        self._saved: str | None = None
        # the state read and written on a thread of its own, off the night's path: read while
        # the log window is aggregated, written while rules 6-8 run (``prefetch``, ``save``)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="edgeqa-cluster-state")
        self._loading: Future[Carried | None] | None = None
        self._saving: Future[None] | None = None

    @property
    def store(self) -> Store:
        return self.map.store

    def _stem(self) -> str:
        return f"{self.map.prefix}/state/{self.map.night.isoformat()}-{self.map.token}"

    def prefetch(self) -> None:
        """Start reading the state (``load``) on its thread: it needs nothing of tonight's."""
        if self._loading is None:
            self._loading = self._thread.submit(self._timed_load)

    def load(self) -> Carried | None:
        """The latest state written in tonight's window (None: none, or not usable: counted),
        once read (``prefetch``: started before)."""
        self.prefetch()
        assert self._loading is not None
        return self._loading.result()

    def _timed_load(self) -> Carried | None:
        started = time.perf_counter()
        try:
            return self._load()
        finally:
            self.counts.load_s += time.perf_counter() - started

    def _load(self) -> Carried | None:
        import faiss

        try:
            prefix = self.map.prefix
        except (EdgeQAError, PackageNotFoundError, OSError) as error:
            log.warning("the embedder's fingerprint cannot be taken here: %s", error)
            self.counts.started = "fingerprint"
            return None
        states = sorted(p for p in self.store.list(f"{prefix}/state/") if p.endswith(".json"))
        written = [(p, _state_night(p)) for p in states]
        usable = [(p, n) for p, n in written if n is not None and n <= self.map.night]
        if not usable:
            self.counts.started = "none"
            return None
        path, night = usable[-1]
        assert night is not None
        if night < self.map.since:  # its map's parts have expired
            self.counts.started = "expired"
            return None
        stem = path.removesuffix(".json")
        try:
            state = json.loads(self.store.get(path, MAX_STATE_BYTES))
            if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
                raise ValueError(f"format {state.get('format')!r}, not {STATE_FORMAT}")
            heads_data = self.store.get(f"{stem}.heads.parquet")
            _check(heads_data, state["heads_sha256"], "heads")
            heads = parquet_table(heads_data, ["cluster", "numbers"])
            ids = heads.column("cluster").to_numpy().astype(np.int64)
            hashes = heads.column("numbers").to_numpy().astype(np.int64)
            with tempfile.TemporaryDirectory(prefix="edgeqa-heads-") as folder:
                local = Path(folder) / "heads.faiss"
                self.store.get_file(f"{stem}.faiss", local)
                _check_file(local, state["index_sha256"])
                index = faiss.read_index(str(local))
            if index.ntotal != len(ids) or (len(ids) > 1 and not (np.diff(ids) > 0).all()):
                raise ValueError(f"{index.ntotal} heads indexed, {len(ids)} listed in order")
            next_id, threshold = int(state["next_id"]), float(state["threshold"])
            if len(ids) and ids[-1] >= next_id:
                raise ValueError(f"cluster {ids[-1]} past the next number {next_id}")
            nprobe = state.get("nprobe")
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None and nprobe:
                ivf.nprobe = int(nprobe)
            committed = [str(c) for c in state["committed"]]
        except TransientStoreError:  # the store, not the state: the night fails and is retried
            raise
        except (
            ObjectNotFoundError,
            KeyError,
            TypeError,
            ValueError,
            AttributeError,
            OverflowError,
            RuntimeError,
        ) as error:
            log.warning("the carried clusters %s are not usable, clustering anew: %s", path, error)
            self.counts.started = "damaged"
            return None
        self.counts.carried_from = night.isoformat()
        return Carried(index, ids, hashes, next_id, threshold, nprobe, night, committed)

    def members(self, carried: Carried, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Each of tonight's wordings' carried cluster (-1: none, or a retired one) and the night
        its map entry was written (days since 0001-01-01), from the map's parts ``carried``
        holds: the latest night's entry of a key, as the caches take theirs. Each part's keys
        are found among tonight's on the thread that fetched it; this one only keeps what they
        found."""
        n, started = len(keys), time.perf_counter()
        labels, nights = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
        index = KeyIndex(keys)
        held = set(carried.committed)

        def found(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
            rows, at = index.find(table.column("key").combine_chunks())
            return at, table.column("cluster").to_numpy()[rows]

        for written, (at, clusters) in self.map.mapped(
            ["key", "cluster"], _map_part, found, lambda p: _part_token(p) in held, MAP_AHEAD
        ):
            day = written.toordinal()
            later = nights[at] < day
            labels[at[later]] = clusters[later]
            nights[at[later]] = day
        live = np.isin(labels, carried.ids)
        labels[~live], nights[~live] = -1, 0
        self.counts.map_s += time.perf_counter() - started
        return labels, nights

    def save(self, tonight: Carried) -> None:
        """Tonight's state (``tonight.committed``: the map's parts the state it started from
        held), once the map's entries are added (``keep``), written on the state's thread
        (``close`` waits for it; the index is not used meanwhile): the map's last part, the
        heads and the state (last: what makes it the latest), then the states before it
        deleted, of any fingerprint."""
        self._saving = self._thread.submit(self._save, tonight)

    def _save(self, tonight: Carried) -> None:
        import faiss
        import pyarrow as pa

        started = time.perf_counter()
        self.map.close()  # the map's last part written, the parts of nights gone expired
        since = self.map.since.isoformat()
        held = [c for c in tonight.committed if c.split("/", 1)[0] >= since]
        held.append(self.map.part_token)
        stem = self._stem()
        with tempfile.TemporaryDirectory(prefix="edgeqa-heads-") as folder:
            local = Path(folder) / "heads.faiss"
            faiss.write_index(tonight.index, str(local))
            index_sha = _file_sha256(local)
            self.store.put_file(f"{stem}.faiss", local)
        heads = parquet_bytes(pa.table({"cluster": tonight.ids, "numbers": tonight.numbers}))
        self.store.put(f"{stem}.heads.parquet", heads)
        state = {
            "format": STATE_FORMAT,
            "night": self.map.night.isoformat(),
            "next_id": int(tonight.next_id),
            "threshold": float(tonight.threshold),
            "nprobe": tonight.nprobe,
            "heads": len(tonight.ids),
            "committed": held,
            "index_sha256": index_sha,
            "heads_sha256": hashlib.sha256(heads).hexdigest(),
        }
        self.store.put(f"{stem}.json", json.dumps(state, indent=1).encode())
        self._saved = stem
        for path in self.store.list(f"{self.map.root}/"):
            if "/state/" not in path or path.startswith(f"{stem}."):
                continue
            night = _state_night(path)
            if night is not None and night <= self.map.night:
                try:
                    self.store.delete(path)
                except ObjectNotFoundError:
                    continue
        self.counts.heads = len(tonight.ids)
        self.counts.save_s += time.perf_counter() - started

    def keep(self, keys: pa.Array, labels: np.ndarray, rows: np.ndarray) -> None:
        """The map entries of ``rows`` (their keys and clusters) written tonight."""
        import pyarrow as pa

        for start in range(0, len(rows), PART_ROWS):
            picked = pa.array(rows[start : start + PART_ROWS])
            self.map.add(
                pa.table(
                    {
                        "key": keys.take(picked),
                        "cluster": pa.array(labels[rows[start : start + PART_ROWS]]),
                    }
                )
            )

    def close(self) -> None:
        """Wait for the state's thread (a failed write is raised here). A night that saved
        nothing (it clustered nothing, or failed) writes no state: the map's parts it wrote are
        committed by none, never read, and expire with their night, as old ones do."""
        try:
            if self._saving is not None:
                self._saving.result()
        finally:
            self._thread.shutdown(wait=True)
            if self._saved is None:
                self.map.close()


def _state_night(path: str) -> date | None:
    name = path.rsplit("/", 1)[-1]
    try:
        return date.fromisoformat(name[:10])
    except ValueError:
        return None


def _check(data: bytes, sha: str, what: str) -> None:
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError(f"the {what}' sha256 is not the state's")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_file(path: Path, sha: str) -> None:
    if _file_sha256(path) != sha:
        raise ValueError("the heads' index's sha256 is not the state's")
