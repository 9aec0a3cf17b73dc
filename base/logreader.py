"""Reading request logs back: the partitions of a window of days, file by file.

The nightly job streams them (``read_log_tables``: one Arrow table per row group, in log order;
a few files' bytes fetched ahead, still compressed, and each row group decoded only when it is
read: what is held does not grow with a day's rows); tools and tests take dicts (``read_logs``).
A file that is not Parquet, or a row with a missing or mistyped field, is skipped and counted
(``LogReadStats``), never fatal: a file whose columns have the types of ``logs.schema()`` is
checked a column at a time, one with other types row by row. The files are written by
``logs.LogWriter``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from base.logs import COLUMNS, REQUIRED, TIERS, as_utc, partition_path, schema

if TYPE_CHECKING:
    import pyarrow as pa

    from base.store import Store

log = logging.getLogger(__name__)


@dataclass
class LogReadStats:
    files: int = 0
    rows: int = 0
    bad_files: int = 0
    malformed_rows: int = 0
    malformed_by_field: dict[str, int] = field(default_factory=dict)

    def add(self, other: LogReadStats) -> None:
        """Add what ``other`` counted."""
        for name in ("files", "rows", "bad_files", "malformed_rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, n in other.malformed_by_field.items():
            self.malformed_by_field[name] = self.malformed_by_field.get(name, 0) + n


def days(since: date, until: date) -> list[date]:
    if until < since:
        raise ValueError(f"--until ({until}) is before --since ({since})")
    return [since + timedelta(days=i) for i in range((until - since).days + 1)]


def _valid(row: dict[str, Any]) -> str | None:
    """The first bad field's name, or None."""
    for name in REQUIRED:
        if row.get(name) is None:
            return name
    if not isinstance(row["query"], str):
        return "query"
    if not row["query"].strip() and row["tier"] not in ("rejected", "error"):
        return "query"  # a refused request may have had an empty query
    if not isinstance(row["user"], str) or not row["user"]:
        return "user"
    if not isinstance(row["turns"], int) or row["turns"] < 1:
        return "turns"
    if row["tier"] not in TIERS:
        return "tier"
    return None


def read_logs(
    store: Store, since: date, until: date, stats: LogReadStats | None = None
) -> list[dict[str, Any]]:
    """Valid rows of the partitions ``since``..``until`` (inclusive), as dicts: for tools and
    tests. The nightly job streams ``read_log_tables`` instead (no list of every row)."""
    return [
        row for table in read_log_tables(store, since, until, stats) for row in table.to_pylist()
    ]


def read_log_tables(
    store: Store, since: date, until: date, stats: LogReadStats | None = None
) -> Iterator[pa.Table]:
    """The valid rows of the partitions ``since``..``until`` (inclusive), one Arrow table per
    row group of each file (in ``schema()``), in log order: days, then files as listed, then
    rows. A file whose columns have the expected types is checked column-wise; one with odd
    types row by row. A file that is not Parquet is skipped; one with a row group that cannot be
    decoded (cut short, corrupt) is counted bad from that row group on."""
    stats = stats if stats is not None else LogReadStats()
    for day in log_days(store, since, until):
        yield from read_day_tables(store, day, stats)


@dataclass(frozen=True)
class LogDay:
    """One day's partition as listed: its Parquet files (path and size), in log order."""

    day: date
    files: tuple[tuple[str, int], ...]

    @property
    def listing(self) -> str:
        """What the day's files are, in 16 hex digits: a file added, removed or rewritten to
        another size gives another (``precompute/dayparts.py`` reuses a day's reduction only
        for the same)."""
        import hashlib

        digest = hashlib.sha256()
        for path, size in self.files:
            digest.update(f"{path}\0{size}\n".encode())
        return digest.hexdigest()[:16]


def log_days(store: Store, since: date, until: date) -> list[LogDay]:
    """The partitions ``since``..``until`` (inclusive) as listed now, one ``LogDay`` each: the
    Parquet files directly in ``logs/dt=<day>/``, as ``logs.LogWriter`` writes them. A file in a
    folder below it is not a log file and is never read (a writer of another prefix's grant,
    ``*/work/*``, could put one at ``logs/dt=<day>/work/x.parquet``: ``docs/security.md``)."""
    out = []
    for day in days(since, until):
        folder = partition_path(day) + "/"
        found = sorted(
            (listed.path, listed.size)
            for listed in store.scan(partition_path(day))
            if listed.path.endswith(".parquet")
            and listed.path.startswith(folder)
            and "/" not in listed.path[len(folder) :]
        )
        out.append(LogDay(day, tuple(found)))
    return out


def read_day_tables(store: Store, day: LogDay, stats: LogReadStats) -> Iterator[pa.Table]:
    """``read_log_tables`` of one listed day."""
    for path, data in _fetched(store, (path for path, _ in day.files)):
        stats.files += 1
        for table in _row_groups(path, data, stats):
            yield from _valid_rows(table, stats)


@dataclass
class LogDays:
    """A window's days, for a reader that takes them a day at a time (``mining.mine_to``: each
    day reduced once, ``precompute/dayparts.py``): ``stats`` counts what was read."""

    store: Store
    days: list[LogDay]
    stats: LogReadStats = field(default_factory=LogReadStats)

    @classmethod
    def of(
        cls, store: Store, since: date, until: date, stats: LogReadStats | None = None
    ) -> LogDays:
        return cls(store, log_days(store, since, until), stats or LogReadStats())

    def tables(self, day: LogDay, stats: LogReadStats) -> Iterator[pa.Table]:
        """The day's valid rows (``read_log_tables``), counted in ``stats`` (the day's, new)
        and, once read to the end, in ``self.stats``."""
        yield from read_day_tables(self.store, day, stats)
        self.stats.add(stats)


def _row_groups(path: str, data: bytes | Exception, stats: LogReadStats) -> Iterator[pa.Table]:
    """The row groups of a fetched file, each decoded as it is asked for, on this thread (as
    ``base.store.parquet_table`` does: pyarrow's decoding threads can abort a process at exit);
    a file that cannot be read is logged and counted as bad, once."""
    import io

    import pyarrow.parquet as pq

    try:
        if isinstance(data, Exception):
            raise data
        parquet = pq.ParquetFile(io.BytesIO(data))
        for group in range(parquet.num_row_groups):
            yield parquet.read_row_group(group, use_threads=False)
    except Exception as error:  # not Parquet, truncated, unreadable
        log.warning("skipping unreadable log file %s: %s", path, error)
        stats.bad_files += 1


def _valid_rows(table: pa.Table, stats: LogReadStats) -> Iterator[pa.Table]:
    """The valid rows of one row group (counted, and the bad ones by field, in ``stats``)."""
    stats.rows += len(table)
    typed = _typed(table)
    if typed is None:  # odd column types: judged row by row
        valid = []
        for row in _rows_of(table):
            bad = _valid(row)
            if bad is None:
                valid.append(row)
            else:
                _malformed(stats, bad)
        yield _table_of(valid)
        return
    bad = _bad_fields(typed)
    for name, n in _count_values(bad).items():
        _malformed(stats, name, n)
    yield typed.filter(_is_null(bad))


FETCH_WORKERS = 4  # log files fetched ahead (an object store's latency, hidden)


def _fetched(
    store: Store, paths: Iterable[str], workers: int = FETCH_WORKERS
) -> Iterator[tuple[str, bytes | Exception]]:
    """Each path with its file's bytes (or why they could not be fetched), in order; a few
    files fetched ahead at once, never more than ``2 × workers`` held, still compressed
    (decoding one whole made a day of 430,000 rows 87 MB of Arrow: eight held were most of a
    3M-row night's peak)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    pending: deque[tuple[str, Future[bytes]]] = deque()
    queue = iter(paths)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for path in itertools.islice(queue, 2 * workers):
            pending.append((path, pool.submit(store.get, path)))
        while pending:
            path, future = pending.popleft()
            following = next(queue, None)
            if following is not None:
                pending.append((following, pool.submit(store.get, following)))
            try:
                data = future.result()
            except Exception as error:
                yield path, error
                continue
            del future  # the bytes are held once, by whoever reads them
            yield path, data


def _malformed(stats: LogReadStats, name: str, n: int = 1) -> None:
    stats.malformed_rows += n
    stats.malformed_by_field[name] = stats.malformed_by_field.get(name, 0) + n


def _typed(table: pa.Table) -> pa.Table | None:
    """``table`` in ``schema()``'s types (missing columns null), or None when a column holds
    another kind of value than its field's (a number for a string, text for a number...)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for target in schema():
        if target.name not in table.column_names:
            columns.append(pa.nulls(len(table), target.type))
            continue
        column = table.column(target.name)
        kind = column.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        same_kind = (
            (pa.types.is_timestamp(kind) and pa.types.is_timestamp(target.type))
            or (pa.types.is_integer(kind) and pa.types.is_integer(target.type))
            or (pa.types.is_floating(kind) and pa.types.is_floating(target.type))
            or (
                (pa.types.is_string(kind) or pa.types.is_large_string(kind))
                and pa.types.is_string(target.type)
            )
            or (pa.types.is_boolean(kind) and pa.types.is_boolean(target.type))
            or pa.types.is_null(kind)
        )
        if not same_kind:
            return None
        try:
            # timestamps: any unit and zone to ms UTC (a naive one is UTC, as in ``as_utc``)
            safe = not pa.types.is_timestamp(kind)
            columns.append(pc.cast(column, target.type, safe=safe))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # an int64 past int32
            return None
    return pa.table(columns, schema=schema())


def _bad_fields(table: pa.Table) -> pa.Array:
    """Per row, the first bad field's name (``_valid``'s order) or null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    checks = [(name, pc.is_null(table.column(name))) for name in REQUIRED]
    query, tier = table.column("query"), table.column("tier")
    refused = pc.is_in(tier, pa.array(["rejected", "error"]))
    blank = pc.equal(pc.utf8_trim_whitespace(query), "")
    checks += [
        ("query", pc.and_(blank, pc.invert(refused))),  # a refused request may have had none
        ("user", pc.equal(table.column("user"), "")),
        ("turns", pc.less(table.column("turns"), 1)),
        ("tier", pc.invert(pc.is_in(tier, pa.array(TIERS)))),
    ]
    bad = pa.nulls(len(table), pa.string())
    for name, failed in reversed(checks):  # the first check that fails wins
        bad = pc.if_else(pc.fill_null(failed, False), pa.scalar(name), bad)
    return bad


def _count_values(bad: pa.Array) -> dict[str, int]:
    import pyarrow.compute as pc

    counts = pc.value_counts(pc.drop_null(bad)).to_pylist()
    return {item["values"]: int(item["counts"]) for item in counts}


def _is_null(values: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.is_null(values)


def _table_of(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows judged one by one (``_rows_of``, ``_valid``) back in ``schema()``: a value of
    another type in a column nothing checks (a number for ``network``) becomes text, or null."""
    import pyarrow as pa

    fields = schema()
    columns: dict[str, list[Any]] = {f.name: [] for f in fields}
    for row in rows:
        for f in fields:
            value = row[f.name]
            if value is not None and pa.types.is_string(f.type) and not isinstance(value, str):
                value = str(value)
            elif pa.types.is_floating(f.type) and not isinstance(value, int | float):
                value = None
            elif pa.types.is_boolean(f.type) and not isinstance(value, bool):
                value = None  # anything but a boolean is not a signed user's row
            columns[f.name].append(value)
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in fields}, schema=fields)


def _rows_of(table: pa.Table) -> Iterable[dict[str, Any]]:
    """Rows with every column present (missing ones None) and types coerced where safe."""
    names = set(table.column_names)
    for raw in table.to_pylist():
        row = {c: raw.get(c) if c in names else None for c in COLUMNS}
        with contextlib.suppress(TypeError, ValueError, OSError, OverflowError):
            if row["ts"] is not None:
                row["ts"] = as_utc(row["ts"])
        if isinstance(row["ts"], str) or not isinstance(row["ts"], datetime | type(None)):
            row["ts"] = None
        for name in ("turns", "status"):
            value = row[name]
            if isinstance(value, float) and value.is_integer():
                row[name] = int(value)
            elif not isinstance(value, int) or isinstance(value, bool):
                row[name] = None if not isinstance(value, int) else value
        yield row
