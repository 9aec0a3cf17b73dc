"""The night's kept log rows reduced to one row per wording (``reduce_window``), and that table
read as mining needs it (``Wordings``): a column at a time for clustering, every column of the
candidate clusters' wordings for k, never the whole table in Python.

The table stays in the window's DuckDB database (``logwindow.py``), which spills to its private
folder past ``EDGEQA_MINING_MEMORY_MB``. What grows with the window's wordings is there, not in
the mining process: the kept askers of each wording (users, networks, autonomous systems: a
list each, ~1.5 KB a wording asked by six people), its raw form and its normalized text. Once the
table is made, every table it was made from is dropped and DuckDB is held to
``READ_MEMORY_MB``: clustering, which runs beside it, gets the memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

from precompute.asks import from_us, to_us
from precompute.config import MiningConfig
from precompute.questions import Phrasing

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa


_US_PER_DAY = 86_400_000_000
READ_MEMORY_MB = 256  # DuckDB's memory once the wordings are reduced (reads spill past it)
PICKED_ROWS = 8192  # wordings read back per batch
# the columns of a wording, in the table's order (``LogWindow.wordings``)
COLUMNS = (
    "key",
    "normalized",
    "question",
    "hits",
    "user_count",
    "users",
    "more_user_weight",
    "signer_count",
    "network_count",
    "networks",
    "asn_count",
    "asns",
    "askers",
)
# what the table was made from: dropped once it is (``rows``, the logged rows, last)
_MADE_FROM = (
    "ranked",
    "by_user",
    "by_network",
    "by_asn",
    "by_form",
    "kept",
    "day_keys",
    "carried",
    "carried_users",
    "carried_networks",
    "carried_asns",
)


class Wordings:
    """The reduced window: ``len`` wordings, row ``0`` first in clustering's order (most askers,
    then most asks, then key). Valid while its window is open."""

    def __init__(self, con: duckdb.DuckDBPyConnection, count: int) -> None:
        self._con = con
        self._count = count

    def __len__(self) -> int:
        return self._count

    def column(self, name: str) -> pa.ChunkedArray:
        """Column ``name`` (one of ``COLUMNS``) of every wording, in row order."""
        if name not in COLUMNS:
            raise ValueError(f"no column {name!r} in the wordings (one of {', '.join(COLUMNS)})")
        return self._con.sql(f"SELECT {name} FROM wordings ORDER BY row").to_arrow_table()[0]

    def picked(self, rows: Sequence[int] | np.ndarray) -> Iterator[pa.Table]:
        """Every column of the wordings at ``rows``, in that order (a row may come twice), as
        tables of up to ``PICKED_ROWS`` rows: one join and one sort in DuckDB, read as a
        stream."""
        import pyarrow as pa

        wanted = np.asarray(rows, dtype=np.int64)
        if len(wanted) == 0:
            return
        if int(wanted.min()) < 0 or int(wanted.max()) >= self._count:
            raise IndexError(f"wording rows must lie in [0, {self._count})")
        self._con.register(
            "wanted_in", pa.table({"at": np.arange(len(wanted), dtype=np.int64), "row": wanted})
        )
        try:
            columns = ", ".join(f"w.{name}" for name in COLUMNS)
            result = self._con.sql(
                f"SELECT {columns} FROM wanted_in i JOIN wordings w USING (row) ORDER BY i.at"
            )
            for batch in result.to_arrow_reader(PICKED_ROWS):
                yield pa.Table.from_batches([batch])
        finally:
            self._con.unregister("wanted_in")


def phrasings_of(batch: pa.Table) -> list[Phrasing]:
    """``Phrasing``s of the wordings of ``batch`` (rows of ``Wordings.picked``), in order: a
    chunk of candidate clusters at a time (``kstep.py``; a million log rows: ~200,000 candidate
    wordings, a million kept askers — built at once they held 800 MB)."""
    out = []
    for d in batch.to_pylist():
        users = {u["name"]: from_us(u["ts"]) for u in d["users"] or ()}
        networks = {n["name"]: from_us(n["ts"]) for n in d["networks"] or ()}
        signers = {u["name"]: from_us(u["ts"]) for u in d["users"] or () if u["signed"]}
        asns = {a["name"]: from_us(a["ts"]) for a in d["asns"] or ()}
        out.append(
            Phrasing(
                d["key"],
                d["normalized"],
                d["question"],
                set(users),
                int(d["hits"]),
                users,
                set(networks),
                networks,
                more_users=int(d["user_count"]) - len(users),
                more_networks=int(d["network_count"]) - len(networks),
                more_weight=float(d["more_user_weight"] or 0.0),
                latest_by_signer=signers,
                latest_by_asn=asns,
                more_signers=int(d["signer_count"]) - len(signers),
                more_asns=int(d["asn_count"]) - len(asns),
            )
        )
    return out


def reduce_window(
    con: duckdb.DuckDBPyConnection, config: MiningConfig, now: datetime, memory_mb: int
) -> Wordings:
    """The window's table ``wordings``: one row per wording (``COLUMNS``, and ``row``), made from
    the window's ``kept`` rows, ``judged`` texts and the carried evidence. Step by step into
    temporary tables: each step one operator DuckDB can spill (grouping, window, join). Then
    the tables it was made from are dropped and DuckDB (given ``memory_mb``) held to less."""
    kept_askers = int(config.kept_askers)
    half_life_us = _US_PER_DAY * config.half_life_days
    decay = f"pow(0.5, greatest({to_us(now)} - ts, 0) / {half_life_us!r})"
    # (key, who, ts, signed) per ask, logged or carried. ``signed``: the crowd rule's signed
    # users, a flag on the user's own entry (a second list of them would double what the
    # lists hold); a row from before the column is not signed, nor has an AS
    sources = {
        "user": "SELECT key, user, ts, coalesce(signed, false) AS signed FROM kept "
        "UNION ALL SELECT key, user, ts, signed FROM carried_users",
        # a row without a network counts its user as its network (logs from before them)
        "network": "SELECT key, CASE WHEN coalesce(network, '') = '' THEN 'user:' || user "
        "ELSE network END AS network, ts, false AS signed FROM kept "
        "UNION ALL SELECT key, network, ts, false FROM carried_networks",
        "asn": "SELECT key, asn, ts, false AS signed FROM kept WHERE coalesce(asn, '') <> '' "
        "UNION ALL SELECT key, asn, ts, false FROM carried_asns",
    }
    for who, source in sources.items():
        # each identity's latest ask of each wording, ranked latest first
        con.execute(
            f"""
            CREATE TEMP TABLE {who}_ranked AS
            SELECT key, {who}, ts, signed,
                row_number() OVER (PARTITION BY key ORDER BY ts DESC, {who}) AS rank
            FROM (
                SELECT key, {who}, max(ts) AS ts, bool_or(signed) AS signed
                FROM ({source}) GROUP BY key, {who}
            )
            """
        )
        fields = f"name := {who}, ts := ts" + (", signed := signed" if who == "user" else "")
        con.execute(
            f"""
            CREATE TEMP TABLE by_{who} AS
            SELECT key, count(*) AS {who}_count,
                count(*) FILTER (WHERE signed) AS signed_{who}_count,
                list(struct_pack({fields})) FILTER (WHERE rank <= {kept_askers}) AS {who}s,
                coalesce(sum({decay}) FILTER (WHERE rank > {kept_askers}), 0)
                    AS more_{who}_weight
            FROM {who}_ranked GROUP BY key
            """
        )
        con.execute(f"DROP TABLE {who}_ranked")
    # asks per wording, and its most common raw form (ties: the first by text)
    con.execute(
        """
        CREATE TEMP TABLE by_form AS
        SELECT key, hits, form AS question FROM (
            SELECT key, form, sum(n) OVER (PARTITION BY key) AS hits,
                row_number() OVER (PARTITION BY key ORDER BY n DESC, form) AS rank
            FROM (SELECT key, form, sum(n) AS n FROM kept GROUP BY key, form)
        )
        WHERE rank = 1
        """
    )
    # clustering's order, from the three columns it is decided by: a window over the whole
    # table sorts what it carries, and the wide rows (each wording's kept askers) ran DuckDB out
    # of its 512 MB once in four 3,000,000-row nights on a busy host
    con.execute(
        """
        CREATE TEMP TABLE ranked AS
        SELECT key, row_number() OVER (ORDER BY askers DESC, hits DESC, key) - 1 AS row
        FROM (
            SELECT u.key, coalesce(f.hits, 0)::BIGINT AS hits,
                CASE WHEN coalesce(n.network_count, 0) = 0 THEN u.user_count
                    ELSE least(u.user_count, n.network_count) END AS askers
            FROM by_user u
            LEFT JOIN by_network n USING (key)
            LEFT JOIN by_form f USING (key)
        )
        """
    )
    con.execute(
        """
        CREATE TEMP TABLE wordings AS
        WITH joined AS (
            SELECT u.key,
                coalesce(t.normalized, c.normalized) AS normalized,
                coalesce(f.question, c.question) AS question,
                coalesce(f.hits, 0)::BIGINT AS hits,
                u.user_count, u.users, u.more_user_weight,
                u.signed_user_count AS signer_count,
                coalesce(n.network_count, 0) AS network_count,
                coalesce(n.networks, []) AS networks,
                coalesce(a.asn_count, 0) AS asn_count,
                coalesce(a.asns, []) AS asns,
                CASE WHEN coalesce(n.network_count, 0) = 0 THEN u.user_count
                    ELSE least(u.user_count, n.network_count) END AS askers
            FROM by_user u
            LEFT JOIN by_network n USING (key)
            LEFT JOIN by_asn a USING (key)
            LEFT JOIN by_form f USING (key)
            LEFT JOIN day_keys t USING (key)
            LEFT JOIN carried c USING (key)
        )
        SELECT r.row, j.* FROM joined j JOIN ranked r USING (key)
        """
    )
    ((count,),) = con.execute("SELECT count(*) FROM wordings").fetchall()
    for name in _MADE_FROM:
        con.execute(f"DROP TABLE IF EXISTS {name}")
    con.execute("DROP VIEW IF EXISTS judged")
    for name in ("texts", "rows"):
        con.execute(f"DROP TABLE IF EXISTS {name}")
    con.execute("CHECKPOINT")
    con.execute(f"SET memory_limit = '{min(READ_MEMORY_MB, int(memory_mb))}MB'")
    return Wordings(con, int(count))
