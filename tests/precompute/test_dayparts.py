"""Each log day reduced once (``precompute/dayparts.py``): a window merged from its days'
partials is the window reduced from its rows, rule 4's caps counted across days included, and a
night a day later reads and judges only the new day."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from base.logreader import LogDays, read_log_tables
from base.store import FileStore, Store
from precompute.carry import carry
from precompute.config import MiningConfig
from precompute.dayparts import DayParts, days_fingerprint
from precompute.logwindow import LogWindow
from precompute.reduction import COLUMNS
from precompute.samplelogs import generate_rows, write_logs

UNTIL = date(2026, 11, 28)
FIRST = UNTIL - timedelta(days=7)  # 8 days of logs: night 1 mines the first 7, night 2 the last 7
# caps small enough that the sample's users and the rows below cross them over several days
CONFIG = MiningConfig(
    cluster_threshold=0.9, k=5, rule_workers=1, max_rows_per_user=4, max_rows_per_network=7
)


def _end(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, 23, 59, 59, tzinfo=UTC)


def _capped_rows() -> Iterator[dict[str, Any]]:
    """Rows that make rule 4 count across days: one user asking one wording three times a day
    (a group of three rows, counted in part on the second day: the user's cap), and a network
    of many users, one of whom asks twice a day (counted in part: the network's cap)."""
    for offset in range(8):
        day = _end(FIRST + timedelta(days=offset)) - timedelta(hours=12)
        for i in range(3):
            yield {
                "ts": day + timedelta(minutes=i),
                "user": "heavy-user",
                "network": f"own-{offset % 2}",
                "query": "how do I reset my password",
                "turns": 1,
                "tier": "generated",
                "status": 200,
            }
        for i in range(2):
            yield {
                "ts": day + timedelta(minutes=5 + i),
                "user": f"twice-{offset}",
                "network": "one-busy-network",
                "query": "how do I export my data",
                "turns": 1,
                "tier": "generated",
                "status": 200,
            }
        for i in range(4):
            yield {
                "ts": day + timedelta(minutes=10 + i),
                "user": f"shared-{offset}-{i}",
                "network": "one-busy-network",
                "query": ["how do I export my data", "how to export my data"][i % 2],
                "turns": 1,
                "tier": "generated",
                "status": 200,
            }


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Store:
    rows = generate_rows(UNTIL, days=8, seed=3) + list(_capped_rows())
    rows.sort(key=lambda r: r["ts"])
    store = FileStore(tmp_path_factory.mktemp("logs"))
    write_logs(store, rows, max_rows=400)
    return store


def _reduced(window: LogWindow, until: date, **days: Any) -> tuple[dict[str, list[Any]], Any]:
    config = CONFIG
    now = _end(until)
    wordings, counts = window.wordings(config, now, carry((), config, now).tables, "en", **days)
    return {name: wordings.column(name).to_pylist() for name in COLUMNS}, counts


def _from_rows(logs: Store, until: date) -> tuple[dict[str, list[Any]], Any]:
    """The window reduced from its rows, as one (what a night did before each day was)."""
    with LogWindow(CONFIG.memory_mb) as window:
        window.add(read_log_tables(logs, until - timedelta(days=6), until))
        return _reduced(window, until)


def _from_days(logs: Store, out: Store, until: date) -> tuple[dict[str, list[Any]], Any, Any]:
    since = until - timedelta(days=6)
    parts = DayParts(out, "p", days_fingerprint("en", CONFIG), since, until)
    days = LogDays.of(logs, since, until)
    with LogWindow(CONFIG.memory_mb) as window:
        table, counts = _reduced(window, until, days=days, parts=parts)
    parts.close()
    return table, counts, parts


def _same(a: tuple[dict[str, list[Any]], Any], b: tuple[dict[str, list[Any]], Any]) -> None:
    assert a[0] == b[0]
    for name in ("rows", "excluded_rows", "pii_by_kind", "time_sensitive_by_kind"):
        assert getattr(a[1], name) == getattr(b[1], name), name


def test_a_window_merged_from_its_days_is_the_window_reduced_from_its_rows(
    logs: Store, tmp_path: Path
) -> None:
    """Night 1 reduces its 7 days and keeps them; night 2, a day later in the same store,
    reads the one new day and takes six from the store: both are their window reduced from its
    rows as one, column for column, rule 4's caps counted over the days."""
    out = FileStore(tmp_path / "out")
    night_1 = UNTIL - timedelta(days=1)
    first, first_counts, parts = _from_days(logs, out, night_1)
    whole = _from_rows(logs, night_1)
    _same((first, first_counts), whole)
    assert (parts.counts.found, parts.counts.computed) == (0, 7)
    # the caps bit, and across days: the heavy user counts 4 rows of the window, not 3 a day
    assert whole[1].excluded_rows["over_user_share"] > 0
    heavy = first["users"][first["key"].index(_key(first, "reset my password"))]
    assert "heavy-user" in {u["name"] for u in heavy}

    second, second_counts, parts = _from_days(logs, out, UNTIL)
    _same((second, second_counts), _from_rows(logs, UNTIL))
    assert (parts.counts.found, parts.counts.computed, parts.counts.expired_parts) == (6, 1, 1)
    assert not out.list(f"p/work/cache/days/{parts.fingerprint}/{FIRST.isoformat()}/")


def _key(table: dict[str, list[Any]], words: str) -> str:
    return next(k for k, n in zip(table["key"], table["normalized"], strict=True) if words in n)


def test_hits_of_a_capped_user_count_the_window_s_first_rows_only(
    logs: Store, tmp_path: Path
) -> None:
    """The heavy user asks one wording 3 times a day: with a cap of 4 rows a window, the
    wording's asks from them are 4 (3 on the first day, 1 of the second day's 3)."""
    table, _, _ = _from_days(logs, FileStore(tmp_path / "out"), UNTIL)
    key = _key(table, "reset my password")
    row = table["key"].index(key)
    others = len({u["name"] for u in table["users"][row]} - {"heavy-user"})
    assert table["hits"][row] >= 4 and table["user_count"][row] == others + 1
    alone, _, _ = _from_days(_only(logs, "heavy-user", tmp_path), FileStore(tmp_path / "o"), UNTIL)
    assert alone["hits"] == [4]


def _only(logs: Store, user: str, tmp_path: Path) -> Store:
    rows = [
        r for t in read_log_tables(logs, FIRST, UNTIL) for r in t.to_pylist() if r["user"] == user
    ]
    store = FileStore(tmp_path / "only")
    write_logs(store, rows)
    return store


def test_a_day_whose_logs_changed_or_whose_partial_is_damaged_is_reduced_again(
    logs: Store, tmp_path: Path
) -> None:
    """A day given one more log file has another listing: reduced again, its old partial
    deleted. A partial whose file is not the one its manifest names is refused, counted, and
    the day reduced from its logs. Either way the window is its rows'."""
    out = FileStore(tmp_path / "out")
    copy = FileStore(tmp_path / "logs")
    for path in logs.list(""):
        copy.put(path, logs.get(path))
    _from_days(copy, out, UNTIL)
    late = UNTIL - timedelta(days=2)
    write_logs(
        copy,
        [
            {
                "ts": _end(late) - timedelta(minutes=1),
                "user": "late-user",
                "network": "late-net",
                "query": "how do I reset my password",
                "turns": 1,
                "tier": "generated",
                "status": 200,
            }
        ],
    )
    table, counts, parts = _from_days(copy, out, UNTIL)
    _same((table, counts), _from_rows(copy, UNTIL))
    assert (parts.counts.found, parts.counts.computed) == (6, 1)
    prefix = f"p/work/cache/days/{parts.fingerprint}/{late.isoformat()}/"
    assert len({path.split("/")[-2] for path in out.list(prefix)}) == 1  # the old listing gone

    groups = next(p for p in out.list(prefix) if p.endswith("groups.parquet"))
    out.put(groups, out.get(groups)[:-20] + b"\0" * 20)
    table, counts, parts = _from_days(copy, out, UNTIL)
    _same((table, counts), _from_rows(copy, UNTIL))
    assert (parts.counts.found, parts.counts.computed, parts.counts.invalid_parts) == (6, 1, 1)

    # files that match a manifest written for them, but not a partial's shape, are refused too
    for name, forged in (
        ("users.parquet", _parquet(pa.table({"user": ["u"], "rows": ["many"]}))),
        ("counts.json", json.dumps({"rows": -1}).encode()),
    ):
        path = next(p for p in out.list(prefix) if p.endswith(name))
        out.put(path, forged)
        manifest = path.rsplit("/", 1)[0] + "/manifest.json"
        sums = json.loads(out.get(manifest))
        sums["sha256"][name] = hashlib.sha256(forged).hexdigest()
        out.put(manifest, json.dumps(sums).encode())
        table, counts, parts = _from_days(copy, out, UNTIL)
        _same((table, counts), _from_rows(copy, UNTIL))
        assert (parts.counts.found, parts.counts.invalid_parts) == (6, 1), name


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_a_changed_cap_or_language_is_another_fingerprint() -> None:
    tighter = MiningConfig(max_rows_per_user=3)
    assert days_fingerprint("en", CONFIG) == days_fingerprint("en", CONFIG)
    assert days_fingerprint("en", CONFIG) != days_fingerprint("de", CONFIG)
    assert days_fingerprint("en", MiningConfig()) != days_fingerprint("en", tighter)


def test_a_night_mining_from_its_days_mines_what_a_night_from_scratch_does(
    logs: Store, embedder: Any, tmp_path: Path
) -> None:
    """Through mining, as the nightly job runs it: night 2 a day later in the same store takes
    six days from it, and mines the questions a night in a new store mines, its log reader's
    counts those of every day (the taken days' as they were read)."""
    from precompute.incremental import NightCaches
    from precompute.mining import mine

    def night(out: Store, until: date) -> tuple[list[dict[str, Any]], Any, LogDays]:
        since = until - timedelta(days=6)
        caches = NightCaches.of_night(out, "p", "en", "embedded", since, until, CONFIG)
        # no carried clusters: an input of the night (which may group otherwise), not a cache
        caches = dataclasses.replace(caches, clusters=None)
        days = LogDays.of(logs, since, until)
        hot, report = mine(days, embedder, CONFIG, _end(until), language="en", caches=caches)
        return [h.as_row() for h in hot], report, days

    same = FileStore(tmp_path / "same")
    night(same, UNTIL - timedelta(days=1))
    hot, report, days = night(same, UNTIL)
    scratch_hot, scratch, scratch_days = night(FileStore(tmp_path / "new"), UNTIL)
    assert hot and hot == scratch_hot
    assert report.caches["days"]["found"] == 6 and scratch.caches["days"]["found"] == 0
    assert report.excluded_rows == scratch.excluded_rows and report.rows == scratch.rows
    assert days.stats == scratch_days.stats and days.stats.rows > 0


@pytest.mark.parametrize(
    ("name", "column", "forged"),
    [
        ("groups.parquet", "form", "my card 4111 1111 1111 1111 was declined"),
        ("keys.parquet", "normalized", "0 how do i export my data"),  # first: min() takes it
    ],
)
def test_a_partial_that_names_a_wording_otherwise_than_its_texts_stops_the_night(
    logs: Store, embedder: Any, tmp_path: Path, name: str, column: str, forged: str
) -> None:
    """A partial is read from the store: a wording's raw form or normalized text that is not
    what the rules give its texts (here, written with a matching manifest) stops the night
    that would keep it, naming where the verdicts came from."""
    from base.errors import EdgeQAError
    from precompute.incremental import NightCaches
    from precompute.mining import mine

    def night(until: date) -> list[Any]:
        since = until - timedelta(days=6)
        caches = NightCaches.of_night(out, "p", "en", "embedded", since, until, CONFIG)
        caches = dataclasses.replace(caches, clusters=None)
        hot, _ = mine(
            LogDays.of(logs, since, until),
            embedder,
            CONFIG,
            _end(until),
            language="en",
            caches=caches,
        )
        return hot

    out = FileStore(tmp_path / "out")
    key = night(UNTIL - timedelta(days=1))[0].phrasings[0].key
    for path in out.list("p/work/cache/days/"):
        if not path.endswith(f"/{name}"):
            continue
        table = pq.read_table(io.BytesIO(out.get(path)))
        values = [
            forged if k == key else v
            for k, v in zip(table["key"].to_pylist(), table[column].to_pylist(), strict=True)
        ]
        table = table.set_column(
            table.schema.get_field_index(column), column, pa.array(values, pa.string())
        )
        data = _parquet(table)
        out.put(path, data)
        manifest = path.rsplit("/", 1)[0] + "/manifest.json"
        sums = json.loads(out.get(manifest))
        sums["sha256"][name] = hashlib.sha256(data).hexdigest()
        out.put(manifest, json.dumps(sums).encode())
    with pytest.raises(EdgeQAError, match=r"store's cache .*work/cache/days.*" + key):
        night(UNTIL)


def test_a_day_with_a_log_file_not_read_is_reduced_but_not_kept(
    logs: Store, tmp_path: Path
) -> None:
    """A log file that could not be read (here not Parquet; a fetch that failed alike) leaves
    its day's rows short: the day is reduced tonight, not kept, and reduced again the next."""
    copy = FileStore(tmp_path / "logs")
    for path in logs.list(""):
        copy.put(path, logs.get(path))
    short = UNTIL - timedelta(days=3)
    copy.put(f"logs/dt={short.isoformat()}/zz-torn.parquet", b"not parquet")
    out = FileStore(tmp_path / "out")
    for found, computed in ((0, 7), (6, 1)):  # the second night: every other day taken
        table, counts, parts = _from_days(copy, out, UNTIL)
        assert (parts.counts.found, parts.counts.computed) == (found, computed)
        assert not out.list(f"p/work/cache/days/{parts.fingerprint}/{short.isoformat()}/")
    _same((table, counts), _from_rows(copy, UNTIL))
