"""The night's log window reduced by DuckDB to one row per wording: mining's rules 1-4 and the
evidence each wording carries into clustering (``mining.py``).

No list of all rows exists anywhere: a day's rows go, a file's Arrow table at a time, into an
embedded DuckDB database in a private temporary folder, which streams and spills to disk past
``memory_mb`` (``EDGEQA_MINING_MEMORY_MB``). Each day is reduced on its own to a partial
(``dayparts.py``), which the nightly job keeps in the store: a night whose window moved by a day
reads, judges and reduces that one day, and merges the window's partials. What DuckDB computes,
in SQL:

- per day, rule 1-2 and the text rules' exclusions, counted per row by reason (and per kind);
  the text rules themselves run in Python once per distinct raw text of the day
  (``textrules.py``; a verdict the cache holds, or one judged tonight for an earlier day, is
  taken), their verdicts joined back to the rows;
- rule 4's per-identity and per-network caps, in log order over the window (a sequence number
  given at ingest within a day, days in order: ``dayparts.py`` says why the merge is exact);
- per wording (key): its asks (``hits``), its most common raw form (ties by text), its distinct
  users and networks with each one's latest ask — the ``askers_kept`` latest of each (at least
  k) as lists, the rest as counts and, for users, their summed recency weight — and what the
  crowd rule counts (``mining.py``): which users came with a token the deployment signed (a flag
  on each kept user, and their count) and its autonomous systems (kept and counted as networks);
- the parent run's carried evidence merged in per user (and whether signed), network and AS,
  keeping the latest ask.

Why a bounded set of askers per wording is enough (``docs/precompute.md``): k is decided on the
union of a cluster's askers (rule 6) and of a token's wordings (rule 7). When no wording holds
more than ``askers_kept`` (>= k) askers the kept sets are whole and the union exact; when one does,
its kept set alone already holds k distinct askers, and so does the union, whatever the others.
Counts and scores add the askers beyond the kept ones (exact per wording; over a cluster, someone
typing two wordings that both overflow counts twice).

Arrow tables in; out, one row per wording in the order clustering takes them (most askers
first, then most asks, then key): a table in this window's database (``reduction.py``), read a
column or a batch of rows at a time while the window is open, never whole in Python.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.config import usable_cpus
from base.logreader import LogDays, LogReadStats
from precompute.asks import to_us
from precompute.config import MiningConfig
from precompute.dayparts import (
    DayParts,
    local_duckdb,
    merge_days,
    read_counts,
    reduce_days,
    sql_literal,
    texts_to_check,
    write_counts,
    write_day,
)
from precompute.nightcache import PART_ROWS, NightCache
from precompute.reduction import Wordings, reduce_window
from precompute.textrules import (
    CHUNK,
    REASONS,
    judge_files,
    verdict_part,
    verdict_schema,
)

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

log = logging.getLogger(__name__)

# the rows mining reads: any other column of the logs is not loaded
ROW_COLUMNS = ("ts", "user", "network", "query", "turns", "tier", "status", "signed", "asn")
ROWS_PER_INSERT = 50_000  # dict rows are batched into Arrow tables of this many
MB_PER_THREAD = 128  # DuckDB's memory per thread it runs
# the reasons a cached verdict may give (any other is not taken: the text is judged again)
_REASONS = ", ".join(f"'{reason}'" for reason in REASONS)
PARALLEL_TEXTS = 4 * CHUNK  # texts to judge past which the text rules run on several processes


def _rows_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("seq", pa.int64()),  # log order: the caps count rows in it
            ("ts", pa.int64()),  # microseconds since the epoch, UTC
            ("user", pa.string()),
            ("network", pa.string()),
            ("query", pa.string()),
            ("turns", pa.int32()),
            ("tier", pa.string()),
            ("status", pa.int32()),
            ("signed", pa.bool_()),  # null (a row from before the column): not signed
            ("asn", pa.string()),
        ]
    )


@dataclass
class WindowCounts:
    """What the window's reduction counted: the rows of the language mined, exclusions by reason
    (per row) and kind, the asks carried in (``mining.MiningReport`` fields)."""

    rows: int = 0
    excluded_rows: dict[str, int] = field(default_factory=dict)
    pii_by_kind: dict[str, int] = field(default_factory=dict)
    time_sensitive_by_kind: dict[str, int] = field(default_factory=dict)
    carried_users: int = 0  # (wording, user) asks the carried evidence added to the logs'
    distinct_texts: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    rule_workers: int = 1  # processes the text rules ran on


def _bump(counts: dict[str, int], reason: str, n: int = 1) -> None:
    counts[reason] = counts.get(reason, 0) + n


def _bump_seconds(counts: WindowCounts, step: str, seconds: float) -> None:
    counts.seconds[step] = counts.seconds.get(step, 0.0) + seconds


def _take(counts: WindowCounts, day: Mapping[str, Any]) -> None:
    """A day's counts (``counts.json``) added to the window's."""
    counts.rows += day["rows"]
    counts.distinct_texts += day["distinct_texts"]
    for name in ("excluded_rows", "pii_by_kind", "time_sensitive_by_kind"):
        for reason, n in day[name].items():
            _bump(getattr(counts, name), reason, n)


class LogWindow:
    """An embedded DuckDB database of one window's rows (``add``), reduced once to one row per
    wording (``wordings``). A context manager: its temporary folder goes with it."""

    def __init__(
        self, memory_mb: int = 1024, temp_dir: Path | None = None, writes_to: Iterable[Path] = ()
    ) -> None:

        self._folder = Path(tempfile.mkdtemp(prefix="edgeqa-mining-", dir=temp_dir))  # 0700
        # each thread needs buffers of its own: a small budget runs on fewer threads rather
        # than fail (at 64 MB two threads ran out of memory where one spills)
        threads = max(1, min(usable_cpus(), memory_mb // MB_PER_THREAD))
        self.con = embedded_duckdb(self._folder, memory_mb, threads, writes_to)
        self._memory_mb = memory_mb
        self._pending: list[Mapping[str, Any]] = []
        self._cached = False  # whether table ``cached`` (the verdicts' cache) is loaded
        self.seconds_adding = 0.0
        self._new_rows()

    def _new_rows(self) -> None:
        """An empty table ``rows`` (a day's), numbered from 0 in log order."""
        self.con.execute("DROP TABLE IF EXISTS rows")
        self.con.execute(
            "CREATE TABLE rows (seq BIGINT, ts BIGINT, user VARCHAR, network VARCHAR, "
            "query VARCHAR, turns INTEGER, tier VARCHAR, status INTEGER, signed BOOLEAN, "
            "asn VARCHAR)"
        )
        self._seq = 0

    def __enter__(self) -> LogWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def disk_bytes(self) -> int:
        """Bytes in the window's folder now: its database and what DuckDB spilled."""
        total = 0
        for path in self._folder.rglob("*"):
            try:
                total += path.stat().st_size if path.is_file() else 0
            except FileNotFoundError:  # a spill file removed while counted
                continue
        return total

    def _count(self, sql: str) -> int:
        """The one number ``sql`` selects (its result fetched whole: DuckDB wants it done)."""
        ((value,),) = self.con.execute(sql).fetchall()
        return int(value)

    # -- rows in --------------------------------------------------------------------------------

    def add(self, rows: Iterable[Mapping[str, Any] | pa.Table]) -> None:
        """Add rows: Arrow tables of the logs' columns (``base.logreader.read_log_tables``),
        or dicts (``ts``, ``user``, ``query``; ``network``, ``turns``, ``tier``, ``status`` when
        known), in log order."""
        import pyarrow as pa

        started = time.perf_counter()
        for item in rows:
            if isinstance(item, pa.Table):
                self._flush_pending()
                self._insert(item)
            else:
                self._pending.append(item)
                if len(self._pending) >= ROWS_PER_INSERT:
                    self._flush_pending()
        self._flush_pending()
        self.seconds_adding += time.perf_counter() - started

    def _flush_pending(self) -> None:
        import pyarrow as pa

        if not self._pending:
            return
        rows, self._pending = self._pending, []
        columns: dict[str, list[Any]] = {name: [] for name in ROW_COLUMNS}
        for row in rows:
            columns["ts"].append(to_us(row["ts"]))
            columns["user"].append(str(row["user"]))
            network = row.get("network")
            columns["network"].append(None if network is None else str(network))
            columns["query"].append(str(row["query"]))
            columns["turns"].append(row.get("turns"))
            columns["tier"].append(row.get("tier"))
            columns["status"].append(row.get("status"))
            signed = row.get("signed")
            columns["signed"].append(signed if isinstance(signed, bool) else None)
            asn = row.get("asn")
            columns["asn"].append(None if asn is None else str(asn))
        schema = _rows_schema()
        self._append(
            pa.table(
                {
                    name: pa.array(values, schema.field(name).type)
                    for name, values in columns.items()
                }
            )
        )

    def _insert(self, table: pa.Table) -> None:
        """A table in the logs' schema (``base.logs.schema``: ts a UTC timestamp)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(table)
        names = set(table.column_names)
        columns = {}
        for name in ROW_COLUMNS:
            column = (
                table.column(name)
                if name in names
                else pa.nulls(n, _rows_schema().field(name).type)
            )
            if name == "ts":
                column = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
            columns[name] = column
        self._append(pa.table(columns))

    def _append(self, table: pa.Table) -> None:
        import pyarrow as pa

        n = len(table)
        if n == 0:
            return
        seq = pa.array(range(self._seq, self._seq + n), pa.int64())
        self._seq += n
        self._insert_arrow("rows", table.add_column(0, "seq", seq), list(_rows_schema().names))

    def _insert_arrow(self, target: str, table: pa.Table, columns: list[str]) -> None:
        self.con.register("arrow_in", table)
        try:
            self.con.execute(f"INSERT INTO {target} SELECT {', '.join(columns)} FROM arrow_in")
        finally:
            self.con.unregister("arrow_in")

    # -- one row per wording out ----------------------------------------------------------------

    def wordings(
        self,
        config: MiningConfig,
        now: datetime,
        carried: Mapping[str, pa.Table],
        language: str | None = None,
        progress: bool = False,
        verdicts: NightCache | None = None,
        workers: int = 1,
        cached_out: Path | None = None,
        days: LogDays | None = None,
        parts: DayParts | None = None,
    ) -> tuple[Wordings, WindowCounts]:
        """The window's wordings (``reduction.Wordings``: one row per key, in clustering's
        order, kept in this window's database: valid while it is open; ``key``,
        ``normalized``, ``question`` (the most common raw form), ``hits``, ``user_count``,
        ``users`` (the kept ones: a list of {name, ts, signed}, ts in µs since the epoch),
        ``more_user_weight`` (the others' summed recency weight), ``signer_count`` (users who
        came with a signed token), ``network_count``, ``networks``, ``asn_count``, ``asns``,
        ``askers``)
        and what was counted. ``carried``: the parent run's evidence (``carry.py``);
        ``language``: only this language's rows count (None: all); ``verdicts``: the text
        rules' cache across nights (``nightcache.py``; None: none); ``workers``: processes the
        text rules run on; ``cached_out``: where the raw texts whose usable verdict came from
        the store (the verdicts' cache, or a day's partial) are written (Parquet: ``key``,
        ``query``, ``language``), for mining to judge those it keeps again, and beside it the
        forms of the texts judged tonight (``dayparts.texts_to_check``).

        ``days``: the window's log days, each reduced on its own (``dayparts.py``) and the
        days merged; ``parts``: where a day's reduction is kept across nights (None: none
        kept), a day found there not read again. Without ``days``, the rows ``add``ed are
        the window, reduced as one day."""
        counts = WindowCounts()
        folder = self._folder / "days"

        def day(read: LogReadStats, local: Path) -> None:
            self._day(config, language, progress, verdicts, workers, local, counts, read)

        started = time.perf_counter()
        if days is None:  # the rows added
            day(LogReadStats(), folder / "d=0")
            taken = []
        else:  # the days taken from the store
            taken = reduce_days(days, parts, folder, self._new_rows, self.add, day)
        if verdicts is not None:
            verdicts.close()
        # the days' reading, their partials' fetching and reduction, but for the text rules
        counts.seconds["aggregate"] = (
            time.perf_counter()
            - started
            - counts.seconds.get("rules", 0.0)
            + (self.seconds_adding if days is None else 0.0)
        )
        started = time.perf_counter()
        for local in sorted(folder.iterdir()):
            _take(counts, read_counts(local))
        if cached_out is not None:
            texts_to_check(self.con, folder, taken, cached_out)
        self.con.execute("DROP TABLE IF EXISTS cached")
        usable, counted = merge_days(self.con, config, folder)
        if usable > counted:
            _bump(counts.excluded_rows, "over_user_share", usable - counted)
        self._carry(carried, counts)
        table = reduce_window(self.con, config, now, self._memory_mb)
        counts.seconds["merge"] = time.perf_counter() - started  # the window from its days
        return table, counts

    def _day(
        self,
        config: MiningConfig,
        language: str | None,
        progress: bool,
        verdicts: NightCache | None,
        workers: int,
        folder: Path,
        counts: WindowCounts,
        read: LogReadStats,
    ) -> None:
        """The day in table ``rows`` reduced to its partial in ``folder`` (``dayparts.py``):
        the text rules (their seconds into ``counts``), rules 1-2, and what was counted
        (``counts.json``, with ``read``: the log reader's counts)."""
        day = WindowCounts()
        started = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        self._judge(language, day, progress, verdicts, workers, folder / "cached.parquet")
        _bump_seconds(counts, "rules", time.perf_counter() - started)
        counts.rule_workers = max(counts.rule_workers, day.rule_workers)
        self._classify(day)
        write_day(self.con, config, folder)
        self.con.execute("DROP TABLE classified")
        self.con.execute("DROP VIEW judged")
        self.con.execute("DROP TABLE texts")
        self._new_rows()
        write_counts(folder, day, read)

    def _judge(
        self,
        language: str | None,
        counts: WindowCounts,
        progress: bool,
        verdicts: NightCache | None,
        workers: int,
        cached_out: Path | None = None,
    ) -> None:
        """The text rules on every distinct raw text, into table ``texts``: a verdict found in
        ``verdicts`` (the cache across nights, by the text's sha256) is taken, not judged again,
        and the texts judged tonight go into it; the texts judged on ``workers`` processes."""

        con = self.con
        con.execute(
            "CREATE TEMP TABLE queries AS SELECT query, sha256(query) AS qhash, "
            "row_number() OVER () AS rid "
            "FROM (SELECT DISTINCT query FROM rows WHERE query IS NOT NULL)"
        )
        total = self._count("SELECT count(*) FROM queries")
        counts.distinct_texts = int(total)
        self._known(verdicts)
        con.execute(
            "CREATE TEMP TABLE texts (query VARCHAR, language VARCHAR, reason VARCHAR, "
            "kinds VARCHAR[], key VARCHAR, normalized VARCHAR, form VARCHAR)"
        )

        # every text with its cached verdict, if any, joined once and written in the texts' order
        # to a Parquet file of ``CHUNK`` rows a row group (DuckDB, on its threads): the processes
        # that judge read their chunks from it and write their verdicts to files, which go into
        # ``texts`` in one statement; this process only hands out row groups (feeding each chunk
        # through it and inserting each chunk's verdicts cost its one thread 25 ms a chunk)
        folder = self._folder / "texts"
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "judged").mkdir(parents=True)
        todo = folder / "todo.parquet"
        con.execute(
            "COPY (SELECT q.query, k.language, k.reason, k.kinds "
            "FROM queries q LEFT JOIN known k USING (qhash) ORDER BY q.rid) "
            f"TO '{sql_literal(str(todo))}' (FORMAT parquet, ROW_GROUP_SIZE {CHUNK})"
        )
        bar = _progress(total, "text rules", progress)
        known = self._count("SELECT count(*) FROM known")  # this day's, tonight's too
        if total - known < PARALLEL_TEXTS:  # a process's start costs more than these take
            workers = 1
        counts.rule_workers = workers
        for judged in judge_files(todo, folder / "judged", language, workers):
            if bar is not None:
                bar.update(judged)
        if bar is not None:
            bar.close()
        if total:
            names = ", ".join(verdict_schema().names)
            parts = sql_literal(str(folder / "judged" / "*.parquet"))
            con.execute(f"INSERT INTO texts SELECT {names} FROM read_parquet('{parts}')")
        shutil.rmtree(folder)
        if verdicts is not None:
            found = self._keep_verdicts(verdicts)
            if cached_out is not None and found:
                target = sql_literal(str(cached_out))
                con.execute(
                    f"""
                    COPY (
                        SELECT t.key, q.query, k.language
                        FROM queries q JOIN known k USING (qhash) JOIN texts t USING (query)
                        WHERE k.reason IS NULL AND t.key IS NOT NULL AND NOT k.tonight
                    ) TO '{target}' (FORMAT parquet)
                    """
                )
        con.execute("DROP TABLE queries")
        con.execute("DROP TABLE known")
        where = "" if language is None else f"WHERE language = '{sql_literal(language)}'"
        con.execute(f"CREATE TEMP VIEW judged AS SELECT * FROM texts {where}")

    def _known(self, verdicts: NightCache | None) -> None:
        """Table ``known``: the cached verdict of each of the day's texts that has one (the
        latest night's, or one judged tonight for an earlier day): the cache's parts copied to
        local files (a few at a time, on threads: ``NightCache.files``) and read into the
        window's database in one statement, on DuckDB's threads (inserted a part at a time,
        they cost the mining process's one thread 1.13 µs a verdict, 5.7 min at a billion rows
        a week), once a night (table ``cached``); a part DuckDB then cannot read is skipped
        and counted, the others inserted one by one. Then joined with the day's texts once (a
        semi-join per part hashed every one of tonight's texts again for each part)."""
        con = self.con
        if not self._cached:
            self._load_cached(verdicts)
            self._cached = True
        con.execute(
            "CREATE TEMP TABLE known AS SELECT DISTINCT ON (qhash) c.* FROM cached c "
            "SEMI JOIN queries q USING (qhash) ORDER BY qhash, tonight DESC, night DESC"
        )
        if verdicts is not None:
            verdicts.counts.found += self._count("SELECT count(*) FROM known WHERE NOT tonight")

    def _load_cached(self, verdicts: NightCache | None) -> None:
        """Table ``cached``: every verdict of the cache (``_known``)."""
        import duckdb

        con = self.con
        con.execute(
            "CREATE TEMP TABLE cached (qhash VARCHAR, language VARCHAR, reason VARCHAR, "
            "kinds VARCHAR[], night DATE, tonight BOOLEAN)"
        )
        folder = self._folder / "verdicts"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        files = [path for _, path in verdicts.files(folder, verdict_part)] if verdicts else []
        insert = (
            "INSERT INTO cached SELECT qhash, language, reason, kinds, night, false "
            "FROM read_parquet('{}', hive_partitioning = true, hive_types = {{'night': DATE}}) "
            f"WHERE reason IS NULL OR reason IN ({_REASONS})"
        )
        if files:
            try:  # every part at once (a statement: all of them or none)
                con.execute(insert.format(sql_literal(str(folder / "*" / "*.parquet"))))
            except duckdb.Error as error:  # a part damaged past its footer: one at a time
                log.warning("a verdicts part is damaged, reading them one at a time: %s", error)
                for path in files:
                    try:
                        con.execute(insert.format(sql_literal(str(path))))
                    except duckdb.Error as one:
                        log.warning("cache part %s is not readable, skipped: %s", path, one)
                        assert verdicts is not None
                        verdicts.counts.invalid_parts += 1
        shutil.rmtree(folder)

    def _keep_verdicts(self, verdicts: NightCache) -> int:
        """Into the cache: the verdicts judged for the day and those taken from a part about to
        fall out, without their text (hash, language, reason, kinds), a batch at a time; and
        into table ``cached`` (as tonight's: a later day takes them). The day's verdicts found
        in the store."""
        import pyarrow as pa

        stale = verdicts.since.isoformat()
        self.con.execute(
            f"""
            CREATE TEMP TABLE kept_verdicts AS
            SELECT q.qhash, t.language, t.reason, t.kinds, k.qhash IS NULL AS judged
            FROM queries q JOIN texts t USING (query) LEFT JOIN known k USING (qhash)
            WHERE k.qhash IS NULL OR (NOT k.tonight AND k.night <= DATE '{stale}')
            """
        )
        result = self.con.sql("SELECT * FROM kept_verdicts")
        for batch in result.to_arrow_reader(PART_ROWS):
            table = pa.Table.from_batches([batch])
            judged = sum(table.column("judged").to_pylist())
            verdicts.counts.computed += judged
            verdicts.counts.rewritten += len(table) - judged
            verdicts.add(table.drop_columns(["judged"]))
        night = verdicts.night.isoformat()
        self.con.execute(
            "INSERT INTO cached SELECT qhash, language, reason, kinds, "
            f"DATE '{night}', true FROM kept_verdicts"
        )
        self.con.execute("DROP TABLE kept_verdicts")
        return self._count("SELECT count(*) FROM known WHERE NOT tonight")

    def _classify(self, counts: WindowCounts) -> None:
        """Rules 1-2 per row of the day, into table ``classified`` (``reason`` null for a row
        that counts), counted by reason (rule 4 is the window's: ``dayparts.merge_days``)."""
        con = self.con
        con.execute(
            """
            CREATE TEMP TABLE classified AS
            SELECT r.seq, r.ts, r.user, r.network, r.signed, r.asn, t.key, t.form, t.kinds,
                CASE
                    WHEN r.tier = 'miss' THEN 'edge_miss'
                    WHEN coalesce(nullif(r.status, 0), 200) >= 400
                        OR r.tier IN ('rejected', 'error') THEN 'failed_request'
                    WHEN coalesce(nullif(r.turns, 0), 1) > 1 THEN 'multi_turn'
                    ELSE t.reason
                END AS reason
            FROM rows r JOIN judged t USING (query)
            """
        )
        counts.rows = self._count("SELECT count(*) FROM classified")
        for reason, n in con.execute(
            "SELECT reason, count(*) FROM classified WHERE reason IS NOT NULL GROUP BY reason"
        ).fetchall():
            _bump(counts.excluded_rows, reason, int(n))
        for reason, kind, n in con.execute(
            "SELECT reason, kind, count(*) FROM (SELECT reason, unnest(kinds) AS kind "
            "FROM classified WHERE reason IN ('pii', 'time_sensitive')) GROUP BY reason, kind"
        ).fetchall():
            by_kind = counts.pii_by_kind if reason == "pii" else counts.time_sensitive_by_kind
            _bump(by_kind, kind, int(n))

    def _carry(self, carried: Mapping[str, pa.Table], counts: WindowCounts) -> None:
        """The carried evidence (``carry.carry``' tables ``carried``, ``carried_users``,
        ``carried_networks`` and ``carried_asns``) in, to be merged per user, network and AS
        with the logged asks."""
        for name, table in carried.items():
            self.con.register(f"{name}_arrow", table)
            self.con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {name}_arrow")
            self.con.unregister(f"{name}_arrow")
        counts.carried_users = self._count(
            "SELECT count(*) FROM (SELECT DISTINCT key, user FROM carried_users) c "
            "WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.key = c.key AND k.user = c.user)"
        )


def embedded_duckdb(
    folder: Path, memory_mb: int, threads: int, writes_to: Iterable[Path] = ()
) -> duckdb.DuckDBPyConnection:
    """A DuckDB database in ``folder`` (private, the caller's to remove), spilling there past
    ``memory_mb``, that reaches no file but under ``folder`` and ``writes_to``, no URL, no
    extension (``dayparts.local_duckdb``); unlocked: ``reduce_window`` lowers its memory limit."""
    return local_duckdb(
        str(folder / "db.duckdb"),
        [folder, *writes_to],
        lock=False,
        memory_limit=f"{memory_mb}MB",
        threads=threads,
        temp_directory=str(folder / "spill"),
        preserve_insertion_order=False,
    )


def _progress(total: int, what: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="text", leave=False)
