"""Request logs: batched Parquet writing, nothing lost, tolerant reading over a date range."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edge_index.logs import LogReadStats, LogWriter, read_logs
from edge_index.store import FileStore, Store, open_store
from edge_index.users import UserHasher, hash_user

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
from edge_index.logs import LogWriter
from edge_index.store import open_store
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
