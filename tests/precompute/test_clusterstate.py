"""Carried clusters (``precompute/clusterstate.py``): a night keeps its old wordings in their
clusters, absorbs new ones into them through their heads, clusters only the rest, and starts from
scratch when the state it would carry is missing, expired or damaged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from base.store import FileStore, Store
from precompute.clustering import (
    ClusterStats,
    Heads,
    Texts,
    embed,
    embedding_order,
    greedy_clusters,
)
from precompute.clusters import Clusters
from precompute.clusterstate import ClusterState
from precompute.config import MiningConfig
from precompute.incremental import NightCaches, night_clusters
from precompute.mining import mine
from precompute.samplelogs import generate_rows
from semantic.guard import numbers

NIGHT = date(2026, 11, 28)
CONFIG = MiningConfig(cluster_threshold=0.9, k=5, rule_workers=1)


def _unit(values: Sequence[float] | np.ndarray, dim: int = 8) -> np.ndarray:
    vector = np.zeros(dim, dtype=np.float32)
    vector[: len(values)] = values
    return vector / np.linalg.norm(vector)


VECTORS = {
    "how do i pay": _unit([1, 0, 0, 0]),
    "how do i pay now": _unit([1, 0.2, 0, 0]),  # 0.98 with the first: the same question
    "pay how": _unit([1, 0, 0.25, 0]),  # 0.97 with the first, 0.95 with the second
    "what is 2 plus 2": _unit([0, 0, 0, 1]),
    "what is 3 plus 2": _unit([0, 0, 0.05, 1]),  # 0.999, but its numbers differ
    "weather": _unit([0, 0, 0, 0, 1]),
    "a new thing": _unit([0, 0, 0, 0, 0, 1]),
}


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _encoder(calls: list[list[str]], vectors: dict[str, np.ndarray]) -> Any:
    def encode(texts: Sequence[str], progress: bool = False) -> Iterator[np.ndarray]:
        texts = list(texts)
        calls.append(texts)
        if texts:
            yield np.stack([vectors[t] for t in texts]).astype(np.float32)

    return encode


def _night(
    store: Store,
    texts: list[str],
    night: date,
    calls: list[list[str]],
    vectors: dict[str, np.ndarray] = VECTORS,
    config: MiningConfig = CONFIG,
) -> tuple[list[list[str]], dict[str, Any]]:
    """Rule 5 on ``texts`` (most asked first) with the carried clusters of ``store``: the
    clusters as texts, and what the state did."""
    state = ClusterState(store, "p", "fingerprint", night - timedelta(days=6), night)
    encode = _encoder(calls, vectors)
    stats = ClusterStats(wordings=len(texts))

    def from_scratch(heads: Heads) -> Clusters:
        order = embedding_order(len(texts), config.exact_cluster_rows)
        return greedy_clusters(
            embed(Texts(texts), encode, order),
            config.cluster_threshold,
            lambda row: numbers(texts[row]),
            exact_rows=config.exact_cluster_rows,
            list_rows=config.cluster_list_rows,
            stats=stats,
            order=order,
            heads=heads,
        )

    keys = pa.array([_key(t) for t in texts])
    clusters = night_clusters(
        state, keys, Texts(texts), lambda: encode, config, stats, False, from_scratch
    )
    state.close()
    return [[texts[r] for r in c] for c in clusters], state.counts.as_dict()


def test_old_wordings_stay_new_ones_join_through_the_heads_or_cluster_among_themselves(
    tmp_path: Path,
) -> None:
    store, calls = FileStore(tmp_path), list[list[str]]()
    first, counts = _night(
        store, ["how do i pay", "how do i pay now", "what is 2 plus 2", "weather"], NIGHT, calls
    )
    assert first == [["how do i pay", "how do i pay now"], ["what is 2 plus 2"], ["weather"]]
    assert counts["started"] == "none" and counts["heads"] == 3
    calls.clear()
    # a day later: the head "how do i pay" and "weather" are gone; three wordings are new
    tonight = ["how do i pay now", "what is 2 plus 2", "pay how", "what is 3 plus 2", "a new thing"]
    second, counts = _night(store, tonight, NIGHT + timedelta(days=1), calls)
    # only the new wordings were embedded
    assert sorted(t for c in calls for t in c) == ["a new thing", "pay how", "what is 3 plus 2"]
    # "pay how" joined the carried cluster through its head's vector (its head is gone
    # tonight); "what is 3 plus 2" is near "what is 2 plus 2" but its numbers differ
    assert second == [
        ["how do i pay now", "pay how"],
        ["what is 2 plus 2"],
        ["what is 3 plus 2"],
        ["a new thing"],
    ]
    assert counts["carried_from"] == NIGHT.isoformat() and counts["started"] is None
    assert (counts["carried"], counts["absorbed"], counts["clustered"]) == (2, 1, 2)
    assert (counts["new_clusters"], counts["retired"], counts["heads"]) == (2, 1, 4)
    calls.clear()
    # a night with nothing new embeds nothing: every wording is carried
    third, counts = _night(store, ["pay how", "a new thing"], NIGHT + timedelta(days=2), calls)
    assert calls == [] and third == [["pay how"], ["a new thing"]]
    assert counts["carried"] == 2 and counts["retired"] == 2 and counts["heads"] == 2
    # one state is kept: the latest
    states = [p for p in store.list("p/work/cache/clusters/") if p.endswith(".json")]
    assert len(states) == 1 and (NIGHT + timedelta(days=2)).isoformat() in states[0]


def test_a_damaged_or_expired_state_starts_the_clusters_again(tmp_path: Path) -> None:
    store, calls = FileStore(tmp_path), list[list[str]]()
    texts = ["how do i pay", "how do i pay now", "what is 2 plus 2"]
    expected, _ = _night(store, texts, NIGHT, calls)
    (index,) = (p for p in store.list("p/work/cache/clusters/") if p.endswith(".faiss"))
    store.put(index, store.get(index)[:-9] + b"damaged!!")
    again, counts = _night(store, texts, NIGHT + timedelta(days=1), calls)
    assert counts["started"] == "damaged" and again == expected
    assert counts["clustered"] == 3 and counts["carried"] == 0
    _, counts = _night(store, texts, NIGHT + timedelta(days=2), calls)
    assert counts["started"] is None and counts["carried"] == 3  # the state written anew
    # a state older than the window's first day: its map has expired
    calls.clear()
    _, counts = _night(store, texts, NIGHT + timedelta(days=10), calls)
    assert counts["started"] == "expired" and len(calls[0]) == 3


def test_map_parts_a_state_does_not_hold_are_not_read(tmp_path: Path) -> None:
    """A night that failed after writing map parts (or an older start's parts) puts no wording
    in a cluster: only the parts the state committed are read."""
    import pyarrow.parquet as pq

    store, calls = FileStore(tmp_path), list[list[str]]()
    _night(store, ["how do i pay", "what is 2 plus 2"], NIGHT, calls)
    (state,) = (p for p in store.list("p/work/cache/clusters/") if p.endswith(".json"))
    prefix = state.split("/state/")[0]
    stray = Path(tmp_path) / "stray.parquet"
    # "a new thing" put in the first cluster by a part nobody committed
    pq.write_table(pa.table({"key": [_key("a new thing")], "cluster": [0]}), stray)
    store.put(
        f"{prefix}/{(NIGHT + timedelta(days=1)).isoformat()}/00000-feedf00d.parquet",
        stray.read_bytes(),
    )
    tonight = ["how do i pay", "what is 2 plus 2", "a new thing"]
    clusters, counts = _night(store, tonight, NIGHT + timedelta(days=1), calls)
    assert clusters == [["how do i pay"], ["what is 2 plus 2"], ["a new thing"]]
    assert counts["carried"] == 2 and counts["clustered"] == 1


def test_heads_carried_in_an_inverted_file_absorb_and_cluster_past_the_exact_index(
    tmp_path: Path,
) -> None:
    """Past ``exact_cluster_rows`` the heads are kept in an inverted file like the neighbour
    index's: a night later, a new wording at a carried head's vector joins its cluster, and
    new wordings far from every head are clustered among themselves in one of their own."""
    rng = np.random.default_rng(0)
    config = MiningConfig(cluster_threshold=0.9, exact_cluster_rows=50, cluster_list_rows=64)
    vectors = {f"w{i}": _unit(rng.normal(size=32), 32) for i in range(700)}
    store, calls = FileStore(tmp_path), list[list[str]]()
    first, counts = _night(store, [f"w{i}" for i in range(600)], NIGHT, calls, vectors, config)
    assert counts["heads"] == len(first) == 600  # random vectors: each its own question
    # the heads kept in an inverted file whose lists a wording is assigned to as the night's
    import faiss

    (path,) = (p for p in store.list("p/work/cache/clusters/") if p.endswith(".faiss"))
    (tmp_path / "heads.faiss").write_bytes(store.get(path))
    heads = faiss.read_index(str(tmp_path / "heads.faiss"))  # held: the IVF is a view into it
    ivf = faiss.extract_index_ivf(heads)
    quantizer = faiss.downcast_index(ivf.quantizer)
    assert ivf.ntotal == 600 and quantizer.hnsw.efSearch == 64  # type: ignore[attr-defined]
    vectors["again 0"] = vectors["w0"]  # a new wording at a carried head
    tonight = [f"w{i}" for i in range(100, 700)] + ["again 0"]
    second, counts = _night(store, tonight, NIGHT + timedelta(days=1), [], vectors, config)
    assert counts["absorbed"] == 1 and counts["clustered"] == 100 and counts["carried"] == 500
    assert counts["retired"] == 99 and counts["heads"] == 601  # w0's cluster lives on
    assert sorted(t for c in second for t in c) == sorted(tonight)


def test_the_sample_nights_carried_mine_what_a_night_from_scratch_does(
    embedder: Any, tmp_path: Path
) -> None:
    """On the sample logs, night 2 carrying night 1's clusters publishes the same questions as
    night 2 clustering every wording, and embeds only its new wordings."""
    rows = generate_rows(NIGHT, days=8, seed=1)

    def night(store: Store, until: date, carried: bool) -> Any:
        since = until - timedelta(days=6)
        window = sorted(
            (r for r in rows if since <= r["ts"].date() <= until), key=lambda r: r["ts"]
        )
        caches = NightCaches.of_night(
            store, "p", "en", "embedded", since, until, CONFIG if carried else None
        )
        end = datetime(until.year, until.month, until.day, 23, 59, 59, tzinfo=UTC)
        return mine(window, embedder, CONFIG, end, language="en", caches=caches)

    store = FileStore(tmp_path / "carried")
    night(store, NIGHT - timedelta(days=1), True)
    hot, report = night(store, NIGHT, True)
    scratch_hot, scratch = night(FileStore(tmp_path / "scratch"), NIGHT, False)
    assert hot and [h.as_row() for h in hot] == [h.as_row() for h in scratch_hot]
    counts = report.caches["clusters"]
    assert counts["carried"] > 0 and counts["started"] is None
    assert (
        counts["carried"] + counts["absorbed"] + counts["clustered"]
        == scratch.clustering["wordings"]
    )
    assert report.caches["vectors"]["found"] == 0  # the carried wordings' vectors are not read


def test_clusters_of_labels_group_rows_in_the_greedy_order() -> None:
    clusters = Clusters.of_labels(np.array([7, 3, 7, 9, 3, 1]))
    assert list(clusters) == [[0, 2], [1, 4], [3], [5]]
    assert len(Clusters.of_labels(np.zeros(0, dtype=np.int64))) == 0


@pytest.mark.parametrize("damage", ["json", "a list", "heads"])
def test_a_state_whose_files_do_not_match_is_not_used(tmp_path: Path, damage: str) -> None:
    store, calls = FileStore(tmp_path), list[list[str]]()
    texts = ["how do i pay", "what is 2 plus 2"]
    _night(store, texts, NIGHT, calls)
    (path,) = (
        p
        for p in store.list("p/work/cache/clusters/")
        if p.endswith(".heads.parquet" if damage == "heads" else ".json")
    )
    written = {"json": b"{not json", "a list": b"[]"}.get(damage, store.get(path) + b"\0")
    store.put(path, written)
    _, counts = _night(store, texts, NIGHT + timedelta(days=1), calls)
    assert counts["started"] == "damaged" and counts["clustered"] == 2


def test_heads_outgrowing_their_index_are_drawn_again(tmp_path: Path) -> None:
    """An exact heads' index holding more heads than the exact index takes (a profile that
    grew) is not searched by every new wording: the night clusters from scratch, at its size."""
    store, calls = FileStore(tmp_path), list[list[str]]()
    texts = ["how do i pay", "what is 2 plus 2", "weather"]
    _night(store, texts, NIGHT, calls)
    small = MiningConfig(cluster_threshold=0.9, k=5, rule_workers=1, exact_cluster_rows=2)
    clusters, counts = _night(store, texts, NIGHT + timedelta(days=1), calls, config=small)
    assert counts["started"] == "outgrown" and counts["clustered"] == 3
    assert sorted(map(tuple, clusters)) == sorted((t,) for t in texts)


def test_an_embedder_whose_fingerprint_cannot_be_taken_here_keeps_no_state(
    tmp_path: Path,
) -> None:
    """A folder embedder only the GPU workers hold: its fingerprint raises here, so the night
    clusters from scratch and writes no state (as the vector cache keeps none), and ends."""
    from base.errors import EdgeQAError

    def nowhere() -> str:
        raise EdgeQAError("no such embedder folder here")

    store = FileStore(tmp_path)
    state = ClusterState(store, "p", nowhere, NIGHT - timedelta(days=6), NIGHT)
    texts = ["how do i pay", "what is 2 plus 2"]
    encode = _encoder([], VECTORS)
    stats = ClusterStats(wordings=len(texts))

    def from_scratch(heads: Heads) -> Clusters:
        return greedy_clusters(
            embed(Texts(texts), encode), 0.9, lambda r: 0, stats=stats, heads=heads
        )

    keys = pa.array([_key(t) for t in texts])
    clusters = night_clusters(
        state, keys, Texts(texts), lambda: encode, CONFIG, stats, False, from_scratch
    )
    state.close()
    assert len(clusters) == 2 and state.counts.started == "fingerprint"
    assert store.list("p/work/cache/clusters/") == []
