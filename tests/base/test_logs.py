"""Request logs: batched Parquet writing, nothing lost, tolerant reading over a date range."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import generate_latest

from base.logreader import LogReadStats, log_days, read_log_tables, read_logs
from base.logs import LogWriter
from base.store import FileStore, Store, open_store
from base.users import UserHasher, hash_user
from tests.s3proxy import FaultyS3

DAY = date(2026, 11, 20)


def _row(n: int, day: date = DAY, **extra: object) -> dict[str, object]:
    ts = datetime.combine(day, datetime.min.time(), UTC) + timedelta(minutes=n)
    return {
        "ts": ts,
        "user": f"u{n % 7}",
        "query": f"question {n}",
        "turns": 1,
        "tier": "generated",
        "status": 200,
        **extra,
    }


def test_flush_by_size_and_on_close(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    writer = LogWriter(store, max_rows=10, flush_interval_s=0)
    for n in range(25):
        writer.write(**_row(n))
    assert writer.rows_written == 20 and writer.files_written == 2
    writer.close()
    assert writer.rows_written == 25
    rows = read_logs(store, DAY, DAY)
    assert sorted(r["query"] for r in rows) == sorted(f"question {n}" for n in range(25))


def test_flush_by_interval(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with LogWriter(store, max_rows=1000, flush_interval_s=0.05) as writer:
        writer.write(**_row(1))
        deadline = time.monotonic() + 10
        while writer.rows_written == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert writer.rows_written == 1  # written by the timer, before close


def test_rows_are_partitioned_by_day_and_read_by_range(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with LogWriter(store, flush_interval_s=0) as writer:
        for offset in range(4):
            writer.write(**_row(offset, DAY + timedelta(days=offset)))
    assert {p.split("/")[1] for p in store.list("logs")} == {
        f"dt={(DAY + timedelta(days=i)).isoformat()}" for i in range(4)
    }
    middle = read_logs(store, DAY + timedelta(days=1), DAY + timedelta(days=2))
    assert sorted(r["query"] for r in middle) == ["question 1", "question 2"]
    with pytest.raises(ValueError, match="before"):
        read_logs(store, DAY, DAY - timedelta(days=1))


def test_unknown_column_is_refused(tmp_path: Path) -> None:
    writer = LogWriter(FileStore(tmp_path), flush_interval_s=0)
    with pytest.raises(ValueError, match="email"):
        writer.write(email="x@example.com", **_row(1))
    writer.close()


def test_failed_flush_keeps_the_rows(tmp_path: Path) -> None:
    class Failing(FileStore):
        fail = True

        def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
            if self.fail:
                raise OSError("disk full")
            super().put(path, data, content_type)

    store = Failing(tmp_path)
    writer = LogWriter(store, max_rows=1000, flush_interval_s=0)
    for n in range(5):
        writer.write(**_row(n))
    with pytest.raises(OSError):
        writer.flush()
    store.fail = False
    writer.close()
    assert len(read_logs(store, DAY, DAY)) == 5


def test_malformed_rows_and_files_are_skipped_and_counted(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with LogWriter(store, flush_interval_s=0) as writer:
        writer.write(**_row(1))
        writer.write(**_row(2, turns=0))
        writer.write(**_row(3, tier="bogus"))
        writer.write(**_row(4, query="   "))
        writer.write(**_row(5, user=None))
    # a file that is not Parquet, and one with wrong column types
    store.put(f"logs/dt={DAY.isoformat()}/broken.parquet", b"not parquet at all")
    odd = pa.table({"ts": ["yesterday"], "user": [3], "query": ["q"], "turns": ["one"]})
    buffer = io.BytesIO()
    pq.write_table(odd, buffer)
    store.put(f"logs/dt={DAY.isoformat()}/odd.parquet", buffer.getvalue())
    stats = LogReadStats()
    rows = read_logs(store, DAY, DAY, stats)
    assert [r["query"] for r in rows] == ["question 1"]
    assert stats.bad_files == 1
    assert stats.malformed_rows == 5
    assert stats.malformed_by_field == {"turns": 1, "tier": 1, "query": 1, "user": 1, "ts": 1}


def test_a_file_is_read_a_row_group_at_a_time_and_a_corrupt_one_ends_it(tmp_path: Path) -> None:
    """Each row group is its own table (a day's file is never decoded whole); a row group
    that cannot be decoded counts the file bad, and the row groups before it are kept."""
    store = FileStore(tmp_path)
    with LogWriter(store, flush_interval_s=0) as writer:
        for n in range(6):
            writer.write(**_row(n))
    (path,) = store.list(f"logs/dt={DAY.isoformat()}")
    table = pq.read_table(io.BytesIO(store.get(path)))
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=2, compression="none")
    store.put(path, buffer.getvalue())
    stats = LogReadStats()
    tables = list(read_log_tables(store, DAY, DAY, stats))
    assert [t.num_rows for t in tables] == [2, 2, 2]
    queries = [r["query"] for t in tables for r in t.to_pylist()]
    assert queries == [f"question {n}" for n in range(6)]
    assert (stats.files, stats.rows, stats.bad_files) == (1, 6, 0)

    # the second row group's first page overwritten: the first two rows are read, then the file
    # is counted bad (its footer still says three row groups)
    data = bytearray(buffer.getvalue())
    offset = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(1).column(0)
    start = offset.data_page_offset
    data[start : start + 64] = b"\xff" * 64
    store.put(path, bytes(data))
    stats = LogReadStats()
    rows = read_logs(store, DAY, DAY, stats)
    assert [r["query"] for r in rows] == ["question 0", "question 1"]
    assert (stats.files, stats.rows, stats.bad_files) == (1, 2, 1)


def test_only_the_files_directly_in_a_day_s_partition_are_read(tmp_path: Path) -> None:
    """A Parquet file in a folder below ``logs/dt=<day>/`` (a writer of ``*/work/*`` could put
    one at ``logs/dt=<day>/work/x.parquet``) is not a log file: it is neither listed nor read."""
    store = FileStore(tmp_path)
    with LogWriter(store, flush_interval_s=0) as writer:
        writer.write(**_row(0))
    (path,) = store.list(f"logs/dt={DAY.isoformat()}")
    forged = path.rsplit("/", 1)[0] + "/work/forged.parquet"
    store.put(forged, store.get(path))
    stats = LogReadStats()
    tables = list(read_log_tables(store, DAY, DAY, stats))
    assert sum(t.num_rows for t in tables) == 1 and stats.files == 1
    (day,) = log_days(store, DAY, DAY)
    assert [p for p, _ in day.files] == [path]


def test_user_hash_is_salted_and_stable() -> None:
    assert hash_user("alice", b"s1") == hash_user("alice", b"s1")
    assert hash_user("alice", b"s1") != hash_user("alice", b"s2")
    assert "alice" not in hash_user("alice", b"s1")
    assert len(hash_user("alice", b"s1")) == 32
    assert UserHasher("pepper").salt == b"pepper"
    assert UserHasher("").salt == UserHasher().salt  # one random salt per process
    assert UserHasher("pepper")("alice") == hash_user("alice", b"pepper")


_CHILD = """
import sys, time
from base.logs import LogWriter
from base.store import open_store
writer = LogWriter(open_store(sys.argv[1]), max_rows=10_000, flush_interval_s=3600,
                   install_sigterm=True)
for n in range(137):
    writer.write(user=f"u{n}", query=f"q{n}", turns=1, tier="generated", status=200)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_sigterm_loses_nothing(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    uri = (
        f"file://{tmp_path}" if kind == "file" else f"s3://{request.getfixturevalue('s3_bucket')}/x"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, uri], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) != 0  # terminated, but only after flushing
    store: Store = open_store(uri)
    today = datetime.now(UTC).date()
    rows = read_logs(store, today - timedelta(days=1), today)
    assert sorted(r["query"] for r in rows) == sorted(f"q{n}" for n in range(137))


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _live(n: int) -> dict[str, object]:
    return {"user": f"u{n % 7}", "query": f"q{n}", "turns": 1, "tier": "generated", "status": 200}


def test_writes_never_wait_for_a_hanging_store(
    s3_bucket: str, s3_proxy: type[FaultyS3], tmp_path: Path
) -> None:
    store = open_store(f"s3://{s3_bucket}/logs", retries=1)
    writer = LogWriter(store, max_rows=10, flush_interval_s=0.05, spill_dir=tmp_path / "spill")
    s3_proxy.held.set()  # every store request hangs from now on
    writes = threading.Thread(target=lambda: [writer.write(**_live(n)) for n in range(500)])
    writes.start()
    writes.join(60)
    assert not writes.is_alive()  # 50 batches' worth written while the store hung
    s3_proxy.held.clear()
    writer.close()
    today = datetime.now(UTC).date()
    rows = read_logs(store, today - timedelta(days=1), today)
    assert sorted(r["query"] for r in rows) == sorted(f"q{n}" for n in range(500))


def test_a_store_outage_spills_to_disk_and_every_row_is_shipped_after(
    s3_bucket: str, s3_proxy: type[FaultyS3], tmp_path: Path
) -> None:
    store = open_store(f"s3://{s3_bucket}/logs", retries=1)
    spill = tmp_path / "spill"
    writer = LogWriter(
        store, source="edge", max_rows=50, flush_interval_s=0.05, max_buffered_rows=200,
        spill_dir=spill,
    )  # fmt: skip
    s3_proxy.failures_left = 10**9  # S3 answers 503 to everything
    for n in range(2000):
        writer.write(**_live(n))
        assert writer.buffered_rows <= 200  # memory stays bounded through the outage
        if n % 100 == 99:
            _wait_for(lambda: writer.buffered_rows < 100, "the flush thread to spill")
    _wait_for(lambda: writer.rows_spilled == 2000, "every row to be spilled")
    assert writer.rows_written == 0 and writer.rows_dropped == 0
    metrics = generate_latest(writer.registry).decode()
    assert 'edgeqa_edge_log_rows_total{outcome="spilled"} 2000.0' in metrics
    assert f"edgeqa_edge_log_spill_bytes {float(writer.spill_bytes)}" in metrics
    s3_proxy.failures_left = 0  # S3 is back
    _wait_for(lambda: writer.rows_shipped == 2000, "the spilled rows to be shipped")
    writer.close()
    assert writer.spill_bytes == 0 and not list(spill.rglob("*.parquet"))
    today = datetime.now(UTC).date()
    rows = read_logs(store, today - timedelta(days=1), today)
    assert len({r["request_id"] for r in rows}) == len(rows) == 2000  # each row once


def test_beyond_both_budgets_rows_are_dropped_and_counted(tmp_path: Path) -> None:
    class Down(FileStore):
        def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
            raise OSError("store down")

    writer = LogWriter(
        Down(tmp_path / "store"), max_rows=10, flush_interval_s=0, max_buffered_rows=100,
        spill_dir=tmp_path / "spill", spill_max_bytes=20_000,
    )  # fmt: skip
    accepted = 0
    for n in range(1000):
        with contextlib.suppress(OSError):  # inline flushes (batch mode) report the outage
            writer.write(**_live(n))
        accepted += 1
        assert writer.buffered_rows <= 100
    assert 0 < writer.rows_spilled < 1000 and writer.rows_dropped > 0
    assert writer.spill_bytes <= 20_000
    assert writer.rows_spilled + writer.rows_dropped + writer.buffered_rows == accepted


def test_a_restarted_writer_ships_what_its_predecessor_spilled(
    s3_bucket: str, s3_proxy: type[FaultyS3], tmp_path: Path
) -> None:
    store = open_store(f"s3://{s3_bucket}/logs", retries=0)
    spill = tmp_path / "spill"
    s3_proxy.failures_left = 10**9
    first = LogWriter(store, flush_interval_s=3600, spill_dir=spill)
    for n in range(137):
        first.write(**_live(n))
    first.close()  # the store is down: the last flush spills
    assert first.rows_spilled == 137 and first.rows_written == 0
    s3_proxy.failures_left = 0
    second = LogWriter(store, flush_interval_s=0.05, spill_dir=spill)
    _wait_for(lambda: second.rows_shipped == 137, "the restarted writer to ship")
    second.close()
    today = datetime.now(UTC).date()
    rows = read_logs(store, today - timedelta(days=1), today)
    assert sorted(r["query"] for r in rows) == sorted(f"q{n}" for n in range(137))


def test_personal_data_is_redacted_before_it_is_written(tmp_path: Path) -> None:
    from precompute.config import MiningConfig
    from precompute.mining import mine

    store = FileStore(tmp_path / "store")
    spill = tmp_path / "spill"
    secret = "My card 4111 1111 1111 1111 was declined, mail jo@example.com"

    class Down(FileStore):
        def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
            raise OSError("store down")

    with LogWriter(Down(tmp_path / "down"), flush_interval_s=0, spill_dir=spill) as down:
        down.write(**_row(1, query=secret, normalized=secret.lower(), key="k" * 64))
    with LogWriter(store, flush_interval_s=0) as writer:
        writer.write(**_row(1, query=secret, normalized=secret.lower(), key="k" * 64))
        writer.write(**_row(2))
    files = [*spill.rglob("*.parquet"), *(tmp_path / "store").rglob("*.parquet")]
    assert len(files) == 2
    for path in files:  # neither the store nor the local spill ever holds the raw text
        data = path.read_bytes()
        table = pq.read_table(io.BytesIO(data))
        assert "4111" not in str(table.to_pylist()) and "jo@" not in str(table.to_pylist())
    rows = read_logs(store, DAY, DAY)
    redacted = next(r for r in rows if r["query"].startswith("[personal"))
    assert redacted["query"] == "[personal data: email, card]"
    assert redacted["normalized"] == "" and redacted["key"] == ""
    _, report = mine(
        rows,
        None,
        MiningConfig(cluster_threshold=0.9, k=1),
        datetime.combine(DAY, datetime.min.time(), UTC),
    )
    assert report.excluded_rows["pii"] == 1 and report.pii_by_kind == {"email": 1, "card": 1}


def test_one_unencodable_row_loses_nothing_else(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with LogWriter(store, flush_interval_s=0) as writer:
        writer.write(**_row(1))
        writer.write(**_row(2, query="bad \ud800 question", tier="rejected", status=400))
        writer.write(**_row(3))
    rows = read_logs(store, DAY, DAY)
    assert sorted(r["query"] for r in rows) == ["bad ? question", "question 1", "question 3"]
    assert writer.rows_dropped == 0
