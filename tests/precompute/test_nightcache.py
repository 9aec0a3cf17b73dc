"""Incremental nights: the text rules' verdicts and the wordings' vectors kept across nights
(``precompute/nightcache.py``, ``precompute/vectorcache.py``) change what a night computes, never
what it mines."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from base.errors import EdgeQAError
from base.store import FileStore, Store
from precompute.config import MiningConfig
from precompute.incremental import NightCaches
from precompute.mining import mine
from precompute.nightcache import NightCache, embedder_fingerprint, rules_fingerprint
from precompute.samplelogs import generate_rows
from precompute.textrules import judge_all, judge_files, judge_table
from precompute.vectorcache import vectors_with_cache

UNTIL = date(2026, 11, 28)
FIRST = UNTIL - timedelta(days=7)  # 8 days of logs: night 1 mines the first 7, night 2 the last 7
CONFIG = MiningConfig(cluster_threshold=0.9, k=5, rule_workers=1)


def _end(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 23, 59, 59, tzinfo=UTC)


def _night(
    rows: list[dict[str, Any]], embedder: Any, store: Store, until: date
) -> tuple[list[Any], Any]:
    """Mine the 7 days ending ``until`` of ``rows`` with the caches of ``store``."""
    since = until - timedelta(days=6)
    window = [r for r in rows if since <= r["ts"].date() <= until]
    window.sort(key=lambda r: r["ts"])
    caches = NightCaches.of_night(store, "p", "en", "embedded", since, until)
    return mine(window, embedder, CONFIG, _end(until), language="en", caches=caches)


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return generate_rows(UNTIL, days=8, seed=1)


def _rows_of(hot: list[Any]) -> list[dict[str, Any]]:
    return [h.as_row() for h in hot]


def test_a_night_with_the_caches_mines_what_a_night_from_scratch_does(
    rows: list[dict[str, Any]], embedder: Any, tmp_path: Path
) -> None:
    """Night 2 (a day later, the same store) judges and embeds only the texts and wordings
    night 1 had not seen, and mines the same questions as a night over its window in a new
    store: the same wordings, askers, scores and order."""
    same, new = FileStore(tmp_path / "same"), FileStore(tmp_path / "new")
    _, first = _night(rows, embedder, same, UNTIL - timedelta(days=1))
    assert first.caches["verdicts"]["found"] == 0 and first.caches["vectors"]["found"] == 0
    hot, second = _night(rows, embedder, same, UNTIL)
    scratch_hot, scratch = _night(rows, embedder, new, UNTIL)
    assert hot and _rows_of(hot) == _rows_of(scratch_hot)
    since = UNTIL - timedelta(days=6)
    window = sorted((r for r in rows if since <= r["ts"].date() <= UNTIL), key=lambda r: r["ts"])
    uncached, _ = mine(window, embedder, CONFIG, _end(UNTIL), language="en")  # no cache at all
    assert _rows_of(uncached) == _rows_of(hot)
    assert second.qualifying_clusters == scratch.qualifying_clusters
    assert second.excluded_rows == scratch.excluded_rows
    verdicts, vectors = second.caches["verdicts"], second.caches["vectors"]
    assert verdicts["found"] > 0 and vectors["found"] > 0
    # only what was new tonight was computed: what the run from scratch computed, less what hit
    assert verdicts["computed"] == scratch.caches["verdicts"]["computed"] - verdicts["found"]
    assert vectors["computed"] == scratch.caches["vectors"]["computed"] - vectors["found"]
    assert second.clustering["wordings"] == scratch.clustering["wordings"]


def _rewrite_parts(store: Store, prefix: str, change: Any) -> int:
    """Every cache part under ``prefix`` rewritten by ``change`` (a table -> a table)."""
    parts = [p for p in store.list(prefix) if p.endswith(".parquet")]
    for path in parts:
        table = change(pq.read_table(io.BytesIO(store.get(path))))
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        store.put(path, buffer.getvalue())
    return len(parts)


def test_cached_vectors_that_are_not_unit_vectors_are_embedded_again(
    rows: list[dict[str, Any]], embedder: Any, tmp_path: Path
) -> None:
    store = FileStore(tmp_path)
    _night(rows, embedder, store, UNTIL - timedelta(days=1))

    def doubled(table: pa.Table) -> pa.Table:
        vectors = table.column("vector").combine_chunks()
        values = vectors.flatten().to_numpy() * 2
        size = vectors.type.list_size
        wrong = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), size)
        return table.set_column(1, "vector", wrong)

    assert _rewrite_parts(store, "p/work/cache/vectors/", doubled)
    hot, report = _night(rows, embedder, store, UNTIL)
    scratch_hot, _ = _night(rows, embedder, FileStore(tmp_path / "new"), UNTIL)
    assert report.caches["vectors"]["found"] == 0
    assert report.caches["vectors"]["invalid"] > 0
    assert _rows_of(hot) == _rows_of(scratch_hot)


def test_a_cache_part_that_is_not_one_is_skipped_and_counted(
    rows: list[dict[str, Any]], embedder: Any, tmp_path: Path
) -> None:
    store = FileStore(tmp_path)
    _night(rows, embedder, store, UNTIL - timedelta(days=1))
    night = str(UNTIL - timedelta(days=1))
    for kind in ("verdicts", "vectors"):
        (fingerprint,) = {p.split("/")[4] for p in store.list(f"p/work/cache/{kind}/")}
        store.put(f"p/work/cache/{kind}/{fingerprint}/{night}/99999-junk.parquet", b"not parquet")
        wrong = pa.table({"qhash": [1], "key": [2], "vector": [3]})
        buffer = io.BytesIO()
        pq.write_table(wrong, buffer)
        store.put(
            f"p/work/cache/{kind}/{fingerprint}/{night}/99998-ints.parquet", buffer.getvalue()
        )
        buffer = io.BytesIO()
        pq.write_table(pa.table({"qhash": ["a"]}), buffer)  # the other columns missing
        store.put(
            f"p/work/cache/{kind}/{fingerprint}/{night}/99996-short.parquet", buffer.getvalue()
        )
    hot, report = _night(rows, embedder, store, UNTIL)
    scratch_hot, _ = _night(rows, embedder, FileStore(tmp_path / "new"), UNTIL)
    assert _rows_of(hot) == _rows_of(scratch_hot)
    for kind in ("verdicts", "vectors"):
        assert report.caches[kind]["invalid_parts"] == 3
        assert report.caches[kind]["found"] > 0  # the good parts were read


def test_a_verdicts_part_damaged_past_its_footer_is_skipped_the_others_read_at_once(
    rows: list[dict[str, Any]], embedder: Any, tmp_path: Path
) -> None:
    """The verdicts' parts are read into the window's database in one statement; one whose
    footer reads but whose data does not (checked on its fetching thread: the footer only)
    fails it, and the parts are then read one at a time: that one skipped and counted."""
    store = FileStore(tmp_path)
    _night(rows, embedder, store, UNTIL - timedelta(days=1))
    night = str(UNTIL - timedelta(days=1))
    (fingerprint,) = {p.split("/")[4] for p in store.list("p/work/cache/verdicts/")}
    texts = [f"text {i}" for i in range(2000)]
    part = pa.table(
        {
            "qhash": [hashlib.sha256(t.encode()).hexdigest() for t in texts],
            "language": ["en"] * len(texts),
            "reason": pa.array([None] * len(texts), pa.string()),
            "kinds": pa.array([None] * len(texts), pa.list_(pa.string())),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(part, buffer, compression="snappy")
    data = bytearray(buffer.getvalue())
    data[100:4000] = bytes(3900)  # the first column's pages zeroed; the footer intact
    pq.read_schema(io.BytesIO(bytes(data)))  # the footer reads
    store.put(f"p/work/cache/verdicts/{fingerprint}/{night}/99997-torn.parquet", bytes(data))
    hot, report = _night(rows, embedder, store, UNTIL)
    scratch_hot, _ = _night(rows, embedder, FileStore(tmp_path / "new"), UNTIL)
    assert _rows_of(hot) == _rows_of(scratch_hot)
    assert report.caches["verdicts"]["invalid_parts"] == 1
    assert report.caches["verdicts"]["found"] > 0  # the good parts were read


def test_a_verdict_cache_that_lets_a_refused_text_through_stops_the_night(
    embedder: Any, tmp_path: Path
) -> None:
    """A cache whose entries say every text is usable (written by someone who may write the
    work area): the night judges what it would publish again, and stops, naming the cache."""
    store = FileStore(tmp_path)
    asked = _end(UNTIL) - timedelta(days=1)
    rows = [
        {
            "ts": asked,
            "user": f"u{i}",
            "signed": True,
            "query": query,
            "turns": 1,
            "tier": "generated",
            "status": 200,
        }
        for i in range(8)
        for query in ("What is the weather today?", "How do I freeze my card?")
    ]
    hot, report = _night(rows, embedder, store, UNTIL)
    assert [h.question for h in hot] == ["How do I freeze my card?"]
    assert report.excluded_rows == {"time_sensitive": 8}

    def usable(table: pa.Table) -> pa.Table:
        nulls = pa.nulls(len(table), pa.string())
        return table.set_column(table.schema.get_field_index("reason"), "reason", nulls)

    assert _rewrite_parts(store, "p/work/cache/verdicts/", usable)
    with pytest.raises(EdgeQAError, match=r"cache .*let a text through .*\(time_sensitive\)"):
        _night(rows, embedder, store, UNTIL)


def _encoder(calls: list[list[str]]) -> Any:
    """An encoder of fixed unit vectors (one per text, from its hash), recording its texts."""

    def encode(texts: Sequence[str], progress: bool = False) -> Iterator[np.ndarray]:
        calls.append(list(texts))
        for start in range(0, len(texts), 3):  # chunks of any size come back in order
            chunk = texts[start : start + 3]
            vectors = np.stack(
                [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in chunk]
            ).astype(np.float32)
            yield vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    return lambda: encode


def _vectors(cache: NightCache, keys: list[str], calls: list[list[str]]) -> np.ndarray:
    texts = [f"text of {k}" for k in keys]
    return np.concatenate(list(vectors_with_cache(cache, keys, texts, _encoder(calls))))


def test_vectors_come_in_the_night_s_order_and_stale_parts_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A night's vectors come in its order, cached or embedded (in chunks that mix them); an
    entry from a part about to fall out is written again when used; the parts of nights before
    the window go, of any fingerprint; a night whose every vector is cached makes no encoder."""
    import precompute.vectorcache as vectorcache

    monkeypatch.setattr(vectorcache, "VECTOR_CHUNK", 2)
    store = FileStore(tmp_path)
    store.put("p/work/cache/vectors/README", b"not a part")  # other objects are left alone
    day = date(2026, 11, 1)
    old_embedder = f"p/work/cache/vectors/g/{day}/00000-x.parquet"  # another fingerprint's
    store.put(old_embedder, b"old")

    def cache(since: int, until: int) -> NightCache:
        at = day + timedelta(days=since), day + timedelta(days=until)
        return NightCache(store, "p", "vectors", "f", *at)

    calls: list[list[str]] = []
    first = cache(0, 6)
    one = _vectors(first, ["a", "b", "c"], calls)
    assert calls == [["text of a", "text of b", "text of c"]]
    assert first.counts.computed == 3
    second = cache(6, 12)  # night 1's part (day 6) falls out after this night: used ones rewritten
    two = _vectors(second, ["c", "d", "e", "a"], calls)  # chunks of 2: cached and new mixed
    assert calls[1:] == [["text of d", "text of e"]]
    np.testing.assert_array_equal(two[[0, 3]], one[[2, 0]])
    assert (second.counts.found, second.counts.computed, second.counts.rewritten) == (2, 2, 2)
    assert second.counts.expired_parts == 1  # the other fingerprint's part, of day 0
    assert not store.exists(old_embedder)
    third = cache(7, 13)
    three = _vectors(third, ["a", "c", "d"], calls)
    assert len(calls) == 2  # all cached: nothing embedded, no encoder made
    np.testing.assert_array_equal(three, two[[3, 0, 1]])
    assert third.counts.expired_parts == 1  # night 1's part
    # nothing computed or rewritten: no part of its own; night 2's holds what is in use
    nights = {p.split("/")[-2] for p in store.list("p/work/cache/vectors/f/")}
    assert nights == {str(day + timedelta(days=12))}
    assert store.exists("p/work/cache/vectors/README")


def test_the_latest_night_s_vector_of_a_wording_is_taken_and_bad_rows_are_embedded(
    tmp_path: Path,
) -> None:
    """Two nights' parts hold a vector of ``a``: the later night's is taken, whichever part is
    read first; a part's row that is not a unit vector is embedded again, its good rows taken."""
    store = FileStore(tmp_path)
    day = date(2026, 11, 20)

    def unit(seed: int) -> np.ndarray:
        vector = np.random.default_rng(seed).normal(size=8).astype(np.float32)
        return vector / np.linalg.norm(vector)

    def put(night: date, keys: list[str], vectors: list[np.ndarray]) -> None:
        values = pa.array(np.concatenate(vectors), pa.float32())
        table = pa.table({"key": keys, "vector": pa.FixedSizeListArray.from_arrays(values, 8)})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        store.put(f"p/work/cache/vectors/f/{night}/00000-t.parquet", buffer.getvalue())

    put(day + timedelta(days=2), ["a", "b"], [unit(2), 3 * unit(3)])  # b's is not unit length
    put(day + timedelta(days=1), ["a", "c"], [unit(1), unit(4)])
    cache = NightCache(store, "p", "vectors", "f", day, day + timedelta(days=6))
    calls: list[list[str]] = []
    got = _vectors(cache, ["b", "c", "a"], calls)
    assert calls == [["text of b"]]  # the only one embedded
    np.testing.assert_array_equal(got[1], unit(4))
    np.testing.assert_array_equal(got[2], unit(2))  # day 2's, not day 1's
    assert (cache.counts.found, cache.counts.invalid, cache.counts.computed) == (2, 1, 1)


def test_the_text_rules_give_the_same_verdicts_on_two_processes() -> None:
    texts = [f"How do I reset my password number {i}?" for i in range(40)]
    texts += ["What is the weather today?", "My email is ann@example.com, help"]
    chunks = [(texts[i : i + 7], [None] * len(texts[i : i + 7])) for i in range(0, len(texts), 7)]
    alone = [v for chunk in judge_all(iter(chunks), "en", 1) for v in chunk]
    together = [v for chunk in judge_all(iter(chunks), "en", 2) for v in chunk]
    assert together == alone and len(alone) == len(texts)
    assert [v.reason for v in alone[-2:]] == ["time_sensitive", "pii"]


def test_the_text_rules_read_and_write_their_chunks_themselves_on_one_or_two_processes(
    tmp_path: Path,
) -> None:
    """``judge_files``: each row group of the texts' file (a text and its cached verdict, if
    any) judged where it is read, its verdicts written to a file of their own, the same on two
    processes as on one and as the chunks judged in this process."""
    texts = [f"How do I reset my password number {i}?" for i in range(30)]
    texts += ["What is the weather today?", "My email is ann@example.com, help"]
    # the first text's verdict cached: taken, not judged again
    known = [("en", None, None)] + [None] * (len(texts) - 1)
    todo = tmp_path / "todo.parquet"
    table = pa.table(
        {
            "query": texts,
            "language": [k and k[0] for k in known],
            "reason": pa.array([None] * len(texts), pa.string()),
            "kinds": pa.array([None] * len(texts), pa.list_(pa.string())),
        }
    )
    pq.write_table(table, todo, row_group_size=7)
    expected = judge_table(texts, known, "en")
    for workers in (1, 2):
        out = tmp_path / f"judged-{workers}"
        out.mkdir()
        assert sum(judge_files(todo, out, "en", workers)) == len(texts)
        parts = sorted(out.glob("*.parquet"))
        assert len(parts) == 5  # a file a row group, in order
        assert pa.concat_tables(pq.read_table(p) for p in parts).equals(expected)
    assert expected.column("reason").to_pylist()[-2:] == ["time_sensitive", "pii"]


def test_a_rule_s_or_a_language_s_or_an_embedder_s_change_is_another_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import precompute.nightcache as nightcache

    assert rules_fingerprint("en") != rules_fingerprint("zh")
    assert rules_fingerprint("en") == rules_fingerprint("en")
    assert embedder_fingerprint("embedded") != embedder_fingerprint("multilingual")
    folder = tmp_path / "tuned"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"1")
    tuned = embedder_fingerprint(str(folder))
    (folder / "weights.bin").write_bytes(b"2")
    nightcache._folder_digest.cache_clear()
    assert embedder_fingerprint(str(folder)) != tuned
    # a rule's code is part of the fingerprint
    rules = nightcache.RULES_MODULES
    monkeypatch.setattr(nightcache, "RULES_MODULES", rules[:-1])
    changed = rules_fingerprint("en")
    monkeypatch.setattr(nightcache, "RULES_MODULES", rules)
    assert changed != rules_fingerprint("en")


def test_a_parts_keys_are_found_among_the_nights_by_their_index_whole_keys_checked() -> None:
    """The vector cache's lookup (``vectorcache.KeyIndex``): the night's keys indexed once, a
    part's found by binary search on 64-bit numbers, each match checked whole: keys that share a
    prefix are each found and never confused; an odd key (not hex, short) is found as well, a
    null one never."""
    import hashlib
    import random

    import pyarrow as pa

    from precompute.vectorcache import KeyIndex

    rng = random.Random(3)
    night = [hashlib.sha256(f"w{i}".encode()).hexdigest() for i in range(5000)]
    twin = night[17][:16] + "f" * 48  # night[17]'s prefix, another key
    night.append(night[42][:16] + "0" * 48)  # two night keys sharing a prefix, both found
    index = KeyIndex(pa.array(night))
    part = [*rng.sample(night, 700), night[42], night[-1], twin, "not-hex-" * 8, "abc", None]
    part += [hashlib.sha256(f"other{i}".encode()).hexdigest() for i in range(300)]
    rng.shuffle(part)
    rows, positions = index.find(pa.array(part, pa.string()))
    pairs = list(zip(rows.tolist(), positions.tolist(), strict=True))
    assert all(part[r] == night[p] for r, p in pairs)  # every match is the same key
    assert sorted(r for r, _ in pairs) == [i for i, k in enumerate(part) if k in set(night)]
    odd = ["a", "text of b", "ü" * 20]  # keys of no hex: found all the same
    rows, positions = KeyIndex(pa.array([*odd, None, *night[:3]])).find(pa.array(odd[::-1]))
    assert sorted(zip(rows.tolist(), positions.tolist(), strict=True)) == [(0, 2), (1, 1), (2, 0)]
