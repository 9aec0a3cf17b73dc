"""Request logs: Parquet files under ``<store>/logs/dt=YYYY-MM-DD/``, written in batches.

Both the origin and the edge service write them (so they live here, in the package both may
import); the nightly precompute reads them. Columns (``docs/release-format.md``): ``ts,
request_id, user, tenant, query, normalized, key, turns, tier, status, latency_ms, ttft_ms,
profile``. ``user`` is a salted
hash (``edge_index/users.py``), never a raw identity.

``LogWriter`` buffers rows and writes one Parquet file per date partition when ``max_rows`` rows
are buffered, every ``flush_interval_s`` seconds, and on ``close()``. It closes itself at exit and
on SIGTERM (``install_sigterm=True``), so a terminated process loses nothing it had accepted.

``read_logs`` reads the partitions of a date range file by file: a file that is not Parquet, or a
row with a missing or mistyped field, is skipped and counted (``LogReadStats``), never fatal.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import signal
import threading
import uuid
import weakref
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from edge_index.store import Store

log = logging.getLogger(__name__)

LOGS_PREFIX = "logs"
TIERS = ("exact", "semantic", "origin_cache", "generated", "miss", "rejected", "error")
COLUMNS = (
    "ts",
    "request_id",
    "user",
    "tenant",
    "query",
    "normalized",
    "key",
    "turns",
    "tier",
    "status",
    "latency_ms",
    "ttft_ms",
    "profile",
)
REQUIRED = ("ts", "user", "query", "turns", "tier", "status")


def schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("request_id", pa.string()),
            ("user", pa.string()),
            ("tenant", pa.string()),
            ("query", pa.string()),
            ("normalized", pa.string()),
            ("key", pa.string()),
            ("turns", pa.int32()),
            ("tier", pa.string()),
            ("status", pa.int32()),
            ("latency_ms", pa.float64()),
            ("ttft_ms", pa.float64()),
            ("profile", pa.string()),
        ]
    )


def partition_path(day: date) -> str:
    return f"{LOGS_PREFIX}/dt={day.isoformat()}"


def _as_utc(ts: Any) -> datetime:
    if isinstance(ts, datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    if isinstance(ts, int | float):
        return datetime.fromtimestamp(float(ts), UTC)
    raise TypeError(f"ts must be a datetime or epoch seconds, got {type(ts).__name__}")


class LogWriter:
    """Batched, thread-safe Parquet request-log writer (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        source: str = "origin",
        max_rows: int = 1000,
        flush_interval_s: float = 10.0,
        install_sigterm: bool = False,
    ) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self.store = store
        self.source = source
        self.max_rows = max_rows
        self.flush_interval_s = flush_interval_s
        self.rows_written = 0
        self.files_written = 0
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # guards _rows
        self._flush_lock = threading.Lock()  # one flush at a time, in order
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if flush_interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="edgeqa-log-flush", daemon=True)
            self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))
        if install_sigterm:
            self._install_sigterm()

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:
            self.close()
            if callable(previous):
                previous(signum, frame)
            else:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)

    def write(self, **row: Any) -> None:
        """Append one row; unknown columns are refused, missing ones are null."""
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown log columns: {sorted(unknown)}")
        if self._closed.is_set():
            raise RuntimeError("the log writer is closed")
        row.setdefault("ts", datetime.now(UTC))
        row["ts"] = _as_utc(row["ts"])
        row.setdefault("request_id", uuid.uuid4().hex)
        flush = False
        with self._lock:
            self._rows.append(row)
            flush = len(self._rows) >= self.max_rows
        if flush:
            self.flush()

    def _run(self) -> None:
        while not self._closed.wait(self.flush_interval_s):
            try:
                self.flush()
            except Exception:  # keep the thread alive; rows stay buffered for the next try
                log.exception("request-log flush failed; will retry")

    def flush(self) -> int:
        """Write what is buffered; returns the number of rows written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self._flush_lock:
            with self._lock:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            by_day: dict[date, list[dict[str, Any]]] = defaultdict(list)
            for row in rows:
                by_day[row["ts"].date()].append(row)
            done = 0
            written: set[date] = set()
            try:
                for day, day_rows in sorted(by_day.items()):
                    table = pa.Table.from_pylist(
                        [{c: r.get(c) for c in COLUMNS} for r in day_rows], schema=schema()
                    )
                    buffer = io.BytesIO()
                    pq.write_table(table, buffer, compression="zstd")
                    stamp = datetime.now(UTC).strftime("%H%M%S%f")
                    name = f"{self.source}-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
                    self.store.put(f"{partition_path(day)}/{name}", buffer.getvalue())
                    written.add(day)
                    done += len(day_rows)
                    self.files_written += 1
            except Exception:
                # put back what was not written, in front of anything newer: nothing is lost
                left = [r for r in rows if r["ts"].date() not in written]
                with self._lock:
                    self._rows = left + self._rows
                self.rows_written += done
                raise
            self.rows_written += done
            return done

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.flush()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_at_exit(ref: weakref.ReferenceType[LogWriter]) -> None:
    writer = ref()
    if writer is not None:
        writer.close()


@dataclass
class LogReadStats:
    files: int = 0
    rows: int = 0
    bad_files: int = 0
    malformed_rows: int = 0
    malformed_by_field: dict[str, int] = field(default_factory=dict)


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
    """Valid rows of the partitions ``since``..``until`` (inclusive), as dicts."""
    import pyarrow.parquet as pq

    stats = stats if stats is not None else LogReadStats()
    rows: list[dict[str, Any]] = []
    for day in days(since, until):
        for path in store.list(partition_path(day)):
            if not path.endswith(".parquet"):
                continue
            stats.files += 1
            try:
                table = pq.read_table(io.BytesIO(store.get(path)))
            except Exception as error:  # not Parquet, truncated, unreadable
                log.warning("skipping unreadable log file %s: %s", path, error)
                stats.bad_files += 1
                continue
            for row in _rows_of(table):
                stats.rows += 1
                bad = _valid(row)
                if bad is not None:
                    stats.malformed_rows += 1
                    stats.malformed_by_field[bad] = stats.malformed_by_field.get(bad, 0) + 1
                    continue
                rows.append(row)
    return rows


def _rows_of(table: pa.Table) -> Iterable[dict[str, Any]]:
    """Rows with every column present (missing ones None) and types coerced where safe."""
    names = set(table.column_names)
    for raw in table.to_pylist():
        row = {c: raw.get(c) if c in names else None for c in COLUMNS}
        with contextlib.suppress(TypeError, ValueError, OSError, OverflowError):
            if row["ts"] is not None:
                row["ts"] = _as_utc(row["ts"])
        if isinstance(row["ts"], str) or not isinstance(row["ts"], datetime | type(None)):
            row["ts"] = None
        for name in ("turns", "status"):
            value = row[name]
            if isinstance(value, float) and value.is_integer():
                row[name] = int(value)
            elif not isinstance(value, int) or isinstance(value, bool):
                row[name] = None if not isinstance(value, int) else value
        yield row
