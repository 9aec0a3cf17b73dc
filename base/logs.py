"""Request logs: Parquet files under ``<store>/logs/dt=YYYY-MM-DD/``, written in batches.

Both the origin and the edge service write them (so they live here, in the package both may
import); the nightly precompute reads them. Columns (``docs/release-format.md``): ``ts,
request_id, user, network, tenant, query, normalized, key, turns, tier, status, latency_ms,
ttft_ms, profile, signed, asn``. ``user``, ``network`` and ``asn`` are salted hashes
(``base/users.py``), never a raw identity, address or AS number; ``signed``: the user is a
signed user token (null in rows from before the column: not signed). A question with personal
data in it is written as ``[personal data: <kinds>]`` (``redaction.py``), on the flushing
thread, before it reaches disk or the store.

``LogWriter`` buffers rows and writes one Parquet file per date partition when ``max_rows`` rows
are buffered, every ``flush_interval_s`` seconds, and on ``close()``. In a server every store
write happens on its background thread, never in ``write()``: a slow or failing store cannot
stall a request. While the store fails, files go to a local spill folder (bounded) and are
shipped once it is back; memory is bounded too, and a row beyond both budgets is dropped and
counted (``registry``: the writer's Prometheus metrics). It closes itself at exit and on SIGTERM
(``install_sigterm=True``), so a terminated process loses nothing it had accepted.

Reading them back (a window of days, file by file, every row checked): ``logreader.py``.
"""

from __future__ import annotations

import atexit
import logging
import re
import signal
import threading
import uuid
import weakref
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.spill import SpillFolder
from base.store import parquet_bytes
from policy.redaction import loggable

if TYPE_CHECKING:
    import pyarrow as pa
    from prometheus_client import CollectorRegistry

    from base.config import SharedSettings
    from base.store import Store

log = logging.getLogger(__name__)

LOGS_PREFIX = "logs"
TIERS = ("exact", "semantic", "origin_cache", "generated", "miss", "rejected", "error")
COLUMNS = (
    "ts",
    "request_id",
    "user",
    "network",
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
    "signed",
    "asn",
)
REQUIRED = ("ts", "user", "query", "turns", "tier", "status")


def schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("request_id", pa.string()),
            ("user", pa.string()),
            ("network", pa.string()),  # the viewer's /24 or /48, hashed like the user
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
            ("signed", pa.bool_()),  # the user is a token the deployment signed
            ("asn", pa.string()),  # the viewer's autonomous system, hashed; "" unknown
        ]
    )


def partition_path(day: date) -> str:
    return f"{LOGS_PREFIX}/dt={day.isoformat()}"


def as_utc(ts: Any) -> datetime:
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
        max_buffered_rows: int = 100_000,
        spill_dir: Path | None = None,
        spill_max_bytes: int = 256 << 20,
    ) -> None:
        """``flush_interval_s`` > 0: a background thread does every store write, so ``write``
        never blocks on the store (the servers); 0: ``write`` flushes inline every ``max_rows``
        rows (batch tools). ``spill_dir``: where files go while the store fails, up to
        ``spill_max_bytes``, shipped once it works again."""
        if max_rows < 1 or max_buffered_rows < max_rows:
            raise ValueError("need 1 <= max_rows <= max_buffered_rows")
        self.store = store
        self.source = source
        self.max_rows = max_rows
        self.max_buffered_rows = max_buffered_rows
        self.flush_interval_s = flush_interval_s
        self.spill = SpillFolder(spill_dir, spill_max_bytes) if spill_dir is not None else None
        self.rows_written = 0  # to the store, straight from memory
        self.files_written = 0
        self.rows_dropped = 0  # beyond the memory and spill budgets
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # guards _rows and the counters
        self._flush_lock = threading.Lock()  # one flush at a time, in order
        self._failing = False  # the last store write failed (warn once per outage)
        self._closed = threading.Event()
        self._wake = threading.Event()
        self.registry = _metrics_registry(self)
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

    @property
    def buffered_rows(self) -> int:
        return len(self._rows)

    @property
    def rows_spilled(self) -> int:  # to the spill folder while the store failed
        return self.spill.rows_spilled if self.spill is not None else 0

    @property
    def rows_shipped(self) -> int:  # from the spill folder to the store
        return self.spill.rows_shipped if self.spill is not None else 0

    @property
    def spill_bytes(self) -> int:
        return self.spill.bytes if self.spill is not None else 0

    def write(self, **row: Any) -> None:
        """Append one row; unknown columns are refused, missing ones are null. Never waits for
        the store when a background thread flushes; past ``max_buffered_rows`` the row is
        dropped and counted."""
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown log columns: {sorted(unknown)}")
        if self._closed.is_set():
            raise RuntimeError("the log writer is closed")
        row.setdefault("ts", datetime.now(UTC))
        row["ts"] = as_utc(row["ts"])
        row.setdefault("request_id", uuid.uuid4().hex)
        with self._lock:
            if len(self._rows) >= self.max_buffered_rows:
                self.rows_dropped += 1
                return
            self._rows.append(row)
            full = len(self._rows) >= self.max_rows
        if full:
            if self._thread is not None:
                self._wake.set()
            else:
                self.flush()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._closed.is_set():
                break  # close() flushes what is left
            try:
                self.flush()
                self.ship_spilled()
            except Exception as error:  # keep the thread alive: the rows are spilled or kept
                self._warn(error)

    def _warn(self, error: Exception) -> None:
        if not self._failing:
            log.warning("request-log store write failed (%s); spilling, will retry", error)
        self._failing = True

    def flush(self) -> int:
        """Write what is buffered; returns the number of rows written to the store. While the
        store fails, files go to the spill folder; rows that fit nowhere are kept in memory (up
        to ``max_buffered_rows``) and the store's error is raised."""
        with self._flush_lock:
            with self._lock:
                rows, self._rows = self._rows, []
            if not rows:
                return 0
            by_day: dict[date, list[dict[str, Any]]] = defaultdict(list)
            for row in rows:
                by_day[row["ts"].date()].append(row)
            done, kept = 0, []
            error: Exception | None = None
            for day, day_rows in sorted(by_day.items()):
                path = f"{partition_path(day)}/{self._file_name()}"
                try:
                    data = _encode(day_rows)
                except Exception:  # a row no Parquet file can hold: theirs only, counted
                    log.exception(
                        "dropping %d request-log rows that cannot be encoded", len(day_rows)
                    )
                    with self._lock:
                        self.rows_dropped += len(day_rows)
                    continue
                if error is None:
                    try:
                        self.store.put(path, data)
                        done += len(day_rows)
                        self.files_written += 1
                        continue
                    except Exception as failure:
                        error = failure
                if self.spill is None or not self.spill.put(path, data, len(day_rows)):
                    kept.extend(day_rows)
            with self._lock:
                self.rows_written += done
                if kept:  # in front of anything newer, within the memory budget
                    self._rows = kept + self._rows
                    over = len(self._rows) - self.max_buffered_rows
                    if over > 0:
                        del self._rows[self.max_buffered_rows :]
                        self.rows_dropped += over
            if error is not None:
                if kept:
                    raise error
                self._warn(error)
            else:
                self._failing = False
            return done

    def _file_name(self) -> str:
        stamp = datetime.now(UTC).strftime("%H%M%S%f")
        return f"{self.source}-{stamp}-{uuid.uuid4().hex[:8]}.parquet"

    def ship_spilled(self) -> int:
        """Ship what waits in the spill folder (raises at the first failure); rows shipped."""
        return self.spill.ship(self.store) if self.spill is not None else 0

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self.flush()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _encode(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa

    table = pa.Table.from_pylist([loggable(r, COLUMNS) for r in rows], schema=schema())
    return parquet_bytes(table, compression="zstd")


def _metrics_registry(writer: LogWriter) -> CollectorRegistry:
    """``edgeqa_<source>_log_rows_total{outcome}`` (written, spilled, shipped, dropped) and the
    buffered rows and spilled bytes, read from the writer when scraped."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    name = "edgeqa_" + re.sub(r"[^a-z0-9_]", "_", writer.source.lower()) + "_log"

    class LogCollector:
        def collect(self) -> Iterator[Any]:
            rows = CounterMetricFamily(
                f"{name}_rows", "Request-log rows by outcome", labels=["outcome"]
            )
            for outcome in ("written", "spilled", "shipped", "dropped"):
                rows.add_metric([outcome], getattr(writer, f"rows_{outcome}"))
            yield rows
            yield GaugeMetricFamily(
                f"{name}_buffered_rows", "Rows waiting in memory", value=writer.buffered_rows
            )
            yield GaugeMetricFamily(
                f"{name}_spill_bytes", "Bytes waiting in the spill folder", value=writer.spill_bytes
            )

    registry = CollectorRegistry()
    registry.register(LogCollector())  # type: ignore[arg-type]
    return registry


def open_log_writer(store: Store, source: str, settings: SharedSettings) -> LogWriter:
    """A service's writer: background flushes, spilling to ``<cache_dir>/log-spill/<source>``
    up to ``EDGEQA_LOG_SPILL_MB`` while the store fails."""
    spill = settings.log_spill_mb << 20
    return LogWriter(
        store,
        source=source,
        spill_dir=settings.cache_dir / "log-spill" / source if spill else None,
        spill_max_bytes=spill,
    )


def _close_at_exit(ref: weakref.ReferenceType[LogWriter]) -> None:
    writer = ref()
    if writer is not None:
        writer.close()
