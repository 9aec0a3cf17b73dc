"""The mine stage's DuckDB databases reach their own folders only: no other file, no URL, no
extension installed or loaded, and the setting that says so cannot be turned back on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ESCAPES = (
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT count(*) FROM read_parquet('s3://edgeqa-prod/store/logs/x.parquet')",
    "SELECT * FROM read_csv('https://example.com/x.csv')",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
)


def _refuses_every_escape(con: Any, outside: Path) -> None:
    import duckdb

    for sql in (*ESCAPES, f"COPY (SELECT 1 AS x) TO '{outside}' (FORMAT parquet)"):
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert not outside.exists()


def test_the_log_window_s_database_reaches_its_own_folder_only(tmp_path: Path) -> None:
    from precompute.logwindow import LogWindow

    with LogWindow(64) as window:
        con = window.con
        inside = window._folder / "x.parquet"
        con.execute(f"COPY (SELECT 1 AS x) TO '{inside}' (FORMAT parquet)")
        assert con.execute(f"SELECT x FROM read_parquet('{inside}')").fetchall() == [(1,)]
        _refuses_every_escape(con, tmp_path / "elsewhere.parquet")


def test_the_partials_check_s_database_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dayparts._in_range``'s in-memory database (kept open past its close to be probed)."""
    import duckdb

    from precompute import dayparts

    opened: list[Any] = []
    connect = duckdb.connect

    class Kept:
        def __init__(self, con: Any) -> None:
            self.con = con

        def __getattr__(self, name: str) -> Any:
            return getattr(self.con, name)

        def close(self) -> None:  # probed below, closed then
            pass

    def kept(*args: Any, **kwargs: Any) -> Any:
        opened.append(connect(*args, **kwargs))
        return Kept(opened[-1])

    monkeypatch.setattr(duckdb, "connect", kept)
    part = tmp_path / "part"
    part.mkdir()
    with pytest.raises(ValueError, match="not readable"):  # no partial in an empty folder
        dayparts._in_range(part)
    assert len(opened) == 1
    try:
        _refuses_every_escape(opened[0], tmp_path / "elsewhere.parquet")
        with pytest.raises(duckdb.Error):
            opened[0].execute("SET memory_limit = '8GB'")  # locked once set up
    finally:
        opened[0].close()
