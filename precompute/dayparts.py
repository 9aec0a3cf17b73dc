"""Each log day reduced once (DESIGN: "each log day aggregated once, per-day partials merged for
the window"): what one day's rows leave once rules 1-2 and the text rules have run
(``write_day``), kept across nights in the store (``DayParts``), and the window's days merged
into the rows rule 4 keeps (``merge_days``), which ``reduction.reduce_window`` reduces to one
row per wording. A night whose window moved by a day reads and judges that day's rows only.

A day's partial, a folder of files (``FILES``):

    groups.parquet    one row per (key, user, network, asn, form, signed) of the day's usable
                      rows that can count under rule 4: ``gid`` (its first row's number that
                      day), ``n`` rows, ``ts`` the latest, ``ur`` and ``nr`` the last row's rank
                      among its user's (network's) usable rows that day
    ranks.parquet     for a group of more than one row, each row's ranks and time (``gid``,
                      ``ur``, ``nr``, ``ts``)
    users.parquet     each user's usable rows that day, counted or not (``user``, ``rows``)
    networks.parquet  each network's (``network``, ``rows``)
    keys.parquet      the day's wordings (``key``, ``normalized``)
    texts.parquet     the raw texts that let each wording in (``key``, ``query``, ``language``,
                      ``form``): judged again when a night keeps their wording and the day came
                      from the store, a kept wording's question then one of their forms
                      (``nightcache.check_verdicts``)
    counts.json       the day's rows of the language mined, exclusions by reason and by kind,
                      its distinct texts, and the log reader's counts

Why the merge is exact. Rule 4 counts an identity's first ``max_rows_per_user`` usable rows in
log order over the window (a network's first ``max_rows_per_network``). A row of day d is its
user's (b + r)-th, where b is the user's usable rows on the window's days before d and r its rank
within d: it counts when b + r <= the cap, and likewise for its network. As b >= 0, a row with
r over the cap never counts and is not kept. Within a group (one user, one network) the ranks
grow with log order, so a group whose last row counts counts whole (most groups: one row), one
whose only row does not counts nothing, and the rest are counted row by row from their ranks.

In the store, under ``<profile>/work/cache/days/<fingerprint>/<day>/<listing>/``: the
fingerprint is the text rules' (``nightcache.rules_fingerprint``: their code, Python's, the
language) with this code's and rule 4's caps; ``<listing>`` the day's log files, by path and
size (``base.logreader.LogDay.listing``): a file added to a day, or rewritten, makes the day
reduced again. ``manifest.json`` is written last, with each file's sha256; a partial whose
files do not match it, or whose Parquet is not of the partial's columns, is reduced again from
the logs (counted ``invalid_parts``). Partials of days before the window's first day are deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import EdgeQAError
from base.store import ObjectNotFoundError, Store
from precompute.config import MiningConfig
from precompute.nightcache import CacheCounts, _digest, _sources, rules_fingerprint

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from base.logreader import LogDay, LogDays, LogReadStats

log = logging.getLogger(__name__)

FILES = (
    "groups.parquet",
    "ranks.parquet",
    "users.parquet",
    "networks.parquet",
    "keys.parquet",
    "texts.parquet",
    "counts.json",
)
MANIFEST = "manifest.json"
TRUSTED_FORMS = "trusted-forms.parquet"  # beside what a night judges again: tonight's forms
FETCHES = 4  # days' partials fetched from the store at once
# what the log reader counts (``base.logreader.LogReadStats``), in a day's counts.json
READ_COUNTS = {"files", "rows", "bad_files", "malformed_rows", "malformed_by_field"}
FORMAT = 3
# the columns of each Parquet file of a partial, with their Arrow types (what a partial read
# from the store must have)
_I, _S = "int64", "string"
COLUMNS = {
    "groups.parquet": (
        ("gid", _I),
        ("key", _S),
        ("user", _S),
        ("network", _S),
        ("asn", _S),
        ("form", _S),
        ("signed", "bool"),
        ("n", _I),
        ("ts", _I),
        ("ur", _I),
        ("nr", _I),
    ),
    "ranks.parquet": (("gid", _I), ("ur", _I), ("nr", _I), ("ts", _I)),
    "users.parquet": (("user", _S), ("rows", _I)),
    "networks.parquet": (("network", _S), ("rows", _I)),
    "keys.parquet": (("key", _S), ("normalized", _S)),
    "texts.parquet": (("key", _S), ("query", _S), ("language", _S), ("form", _S)),
}
# the code a partial's content depends on, besides the text rules'
DAY_MODULES = (
    "precompute/dayparts.py",
    "precompute/logwindow.py",
    "base/logreader.py",
    "base/logs.py",
)


def days_fingerprint(language: str | None, config: MiningConfig) -> str:
    """What a day's partial depends on: the text rules' fingerprint, this code, rule 4's caps."""
    caps = f"{FORMAT}\0{config.max_rows_per_user}\0{config.max_rows_per_network}"
    return _digest(rules_fingerprint(language).encode(), caps.encode(), *_sources(DAY_MODULES))


def sql_literal(text: str) -> str:
    """``text`` inside an SQL string literal."""
    return text.replace("'", "''")


def _sql(path: Path) -> str:
    return sql_literal(str(path))


def reduce_days(
    days: LogDays,
    parts: DayParts | None,
    folder: Path,
    new_day: Callable[[], None],
    add: Callable[[Iterator[pa.Table]], None],
    reduce: Callable[[LogReadStats, Path], None],
) -> list[Path]:
    """Each of the window's days as a partial in ``folder/d=<n>/`` (n: its place in the
    window): taken from ``parts`` when it holds the day's (those folders are returned: their
    texts' verdicts came from the store), else read from the logs (``new_day``, then ``add`` of
    its rows) and reduced (``reduce``, given what the log reader counted and the folder), then
    put in ``parts``, unless a log file of the day could not be read (fetched or decoded: the
    day is reduced again the next night, not kept with rows missing). Which days the store
    holds is asked first (a manifest each); their partials are then fetched ``FETCHES`` at a
    time on threads while this one reduces the others (a night's one new day: ~200 GB of
    partials at a billion rows a week are read while it is reduced), and a partial that does
    not check is reduced from the logs after."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from base.logreader import LogReadStats

    def reduced(number: int) -> None:
        local, day = folder / f"d={number}", days.days[number]
        new_day()
        read = LogReadStats()
        add(days.tables(day, read))
        reduce(read, local)
        if parts is None:
            return
        parts.counts.computed += 1
        if read.bad_files:
            log.warning("%s: %d log files not read, not kept", day.day, read.bad_files)
            return
        parts.put(day, local)

    numbers = range(len(days.days))
    held = [n for n in numbers if parts is not None and parts.holds(days.days[n])]
    taken = []
    with ThreadPoolExecutor(max_workers=FETCHES) as pool:
        fetches = {
            pool.submit(parts.fetch, days.days[n], folder / f"d={n}"): n
            for n in held
            if parts is not None
        }
        for number in numbers:
            if number not in held:
                reduced(number)
        for future in as_completed(fetches):
            number = fetches[future]
            if future.result():
                local = folder / f"d={number}"
                taken.append(local)
                days.stats.add(LogReadStats(**read_counts(local)["read"]))
            else:
                reduced(number)
    return sorted(taken)


def texts_to_check(
    con: duckdb.DuckDBPyConnection, folder: Path, taken: list[Path], out: Path
) -> None:
    """The texts a night that took anything from the store judges again before it keeps
    their wordings (``nightcache.check_verdicts``), into ``out`` (``key``, ``query``,
    ``language``): those of the days ``taken`` from the store, and on the days of ``folder``
    reduced tonight those whose verdict the cache gave (``cached.parquet``); and beside it
    (``TRUSTED_FORMS``: ``key``, ``form``) the forms of the texts of the days reduced tonight,
    which a kept wording's question may be too. Nothing written when nothing came from the
    store."""
    from_store = [local / "texts.parquet" for local in taken]
    tonight = [local for local in sorted(folder.iterdir()) if local not in taken]
    from_store += [local / "cached.parquet" for local in tonight]
    from_store = [path for path in from_store if path.exists()]
    if not from_store:
        return
    for target, columns, files in (
        (out, "key, query, language", from_store),
        (out.with_name(TRUSTED_FORMS), "key, form", [d / "texts.parquet" for d in tonight]),
    ):
        if files:
            listed = ", ".join(f"'{_sql(path)}'" for path in files)
            con.execute(
                f"COPY (SELECT {columns} FROM read_parquet([{listed}])) "
                f"TO '{_sql(target)}' (FORMAT parquet)"
            )


def write_counts(folder: Path, counts: Any, read: LogReadStats) -> None:
    """The day's ``counts.json``: of ``counts`` (a ``logwindow.WindowCounts``) the rows,
    exclusions, kinds and distinct texts; ``read``: what the log reader counted."""
    names = ("rows", "excluded_rows", "pii_by_kind", "time_sensitive_by_kind", "distinct_texts")
    data = {name: getattr(counts, name) for name in names}
    data["read"] = dict(read.__dict__)
    (folder / "counts.json").write_text(json.dumps(data, sort_keys=True), encoding="utf-8")


def write_day(con: duckdb.DuckDBPyConnection, config: MiningConfig, folder: Path) -> None:
    """The day's partial into ``folder`` (all but ``counts.json``) from its tables in ``con``:
    ``classified`` (the day's rows with their verdict: ``reason`` null for a usable one) and
    ``judged`` (its texts)."""
    folder.mkdir(parents=True, exist_ok=True)
    user_cap, network_cap = int(config.max_rows_per_user), int(config.max_rows_per_network)
    con.execute(
        """
        CREATE TEMP TABLE usable AS
        SELECT seq, ts, user, network, signed, asn, key, form,
            row_number() OVER (PARTITION BY user ORDER BY seq) AS ur,
            CASE WHEN coalesce(network, '') <> '' THEN
                row_number() OVER (PARTITION BY network ORDER BY seq) END AS nr
        FROM classified WHERE reason IS NULL
        """
    )
    capped = f"ur <= {user_cap} AND coalesce(nr, 0) <= {network_cap}"
    con.execute(
        f"""
        CREATE TEMP TABLE day_groups AS
        SELECT min(seq) AS gid, key, user, network, asn, form, signed, count(*)::BIGINT AS n,
            max(ts) AS ts, max(ur) AS ur, max(nr) AS nr
        FROM usable WHERE {capped}
        GROUP BY key, user, network, asn, form, signed
        """
    )
    queries = {
        "groups.parquet": "SELECT * FROM day_groups",
        # the rows of the groups of more than one (rare: one user asking one wording again)
        "ranks.parquet": f"""
            SELECT g.gid, u.ur, u.nr, u.ts
            FROM usable u JOIN (SELECT * FROM day_groups WHERE n > 1) g
                ON u.user = g.user AND u.key = g.key
                AND u.form IS NOT DISTINCT FROM g.form
                AND u.network IS NOT DISTINCT FROM g.network
                AND u.asn IS NOT DISTINCT FROM g.asn
                AND u.signed IS NOT DISTINCT FROM g.signed
            WHERE u.{capped.replace(" AND coalesce(nr", " AND coalesce(u.nr")}
        """,
        "users.parquet": "SELECT user, count(*)::BIGINT AS rows FROM usable GROUP BY user",
        "networks.parquet": "SELECT network, count(*)::BIGINT AS rows FROM usable "
        "WHERE nr IS NOT NULL GROUP BY network",
        "keys.parquet": "SELECT DISTINCT key, normalized FROM judged WHERE key IS NOT NULL",
        "texts.parquet": "SELECT DISTINCT key, query, language, form FROM judged "
        "WHERE key IS NOT NULL AND reason IS NULL",
    }
    for name, query in queries.items():
        con.execute(f"COPY ({query}) TO '{_sql(folder / name)}' (FORMAT parquet)")
    con.execute("DROP TABLE day_groups")
    con.execute("DROP TABLE usable")


def merge_days(con: duckdb.DuckDBPyConnection, config: MiningConfig, days: Path) -> tuple[int, int]:
    """The window's rows that count under rule 4 into table ``kept`` (``key``, ``user``,
    ``network``, ``asn``, ``form``, ``signed``, ``ts``: the latest counted ask, ``n``: the rows
    it stands for) and its wordings' normalized texts into ``day_keys``, from the partials in
    ``days`` (``d=<n>/``, one folder a day, in log order): the window's usable rows and those
    counted."""
    user_cap, network_cap = int(config.max_rows_per_user), int(config.max_rows_per_network)

    def parts(name: str) -> str:
        return (
            f"read_parquet('{_sql(days / '*' / name)}', hive_partitioning = true, "
            "hive_types = {'d': INTEGER})"
        )

    for who in ("user", "network"):
        # each identity's usable rows on the window's days before each day of theirs
        con.execute(
            f"""
            CREATE TEMP TABLE before_{who} AS
            SELECT d, {who}, before FROM (
                SELECT d, {who}, coalesce(sum(rows) OVER (PARTITION BY {who} ORDER BY d
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
                FROM {parts(f"{who}s.parquet")}
            ) WHERE before > 0
            """
        )
    # each group with what its user and network may still count on its day (na: null
    # without a network); then those that count whole, and the rest's rows that count
    con.execute(
        f"""
        CREATE TEMP TABLE capped AS
        SELECT g.*, {user_cap} - coalesce(u.before, 0) AS ua,
            CASE WHEN g.nr IS NOT NULL THEN {network_cap} - coalesce(w.before, 0) END AS na
        FROM {parts("groups.parquet")} g
        LEFT JOIN before_user u ON u.d = g.d AND u.user = g.user
        LEFT JOIN before_network w ON w.d = g.d AND w.network = g.network
        """
    )
    whole = "ur <= ua AND (na IS NULL OR nr <= na)"
    con.execute(
        f"""
        CREATE TEMP TABLE kept AS
        SELECT key, user, network, asn, form, signed, ts, n FROM capped WHERE {whole}
        UNION ALL
        SELECT any_value(g.key), any_value(g.user), any_value(g.network), any_value(g.asn),
            any_value(g.form), any_value(g.signed), max(r.ts), count(*)::BIGINT
        FROM (SELECT * FROM capped WHERE n > 1 AND NOT ({whole})) g
        JOIN {parts("ranks.parquet")} r ON r.d = g.d AND r.gid = g.gid
        WHERE r.ur <= g.ua AND (g.na IS NULL OR r.nr <= g.na)
        GROUP BY g.d, g.gid
        """
    )
    con.execute("DROP TABLE capped")
    con.execute(
        "CREATE TEMP TABLE day_keys AS "  # one a key, whatever a partial from the store says
        f"SELECT key, min(normalized) AS normalized FROM {parts('keys.parquet')} GROUP BY key"
    )
    con.execute("DROP TABLE before_user")
    con.execute("DROP TABLE before_network")
    ((usable,),) = con.execute(
        f"SELECT coalesce(sum(rows), 0) FROM {parts('users.parquet')}"
    ).fetchall()
    ((counted,),) = con.execute("SELECT coalesce(sum(n), 0) FROM kept").fetchall()
    return int(usable), int(counted)


def read_counts(folder: Path) -> dict[str, Any]:
    """A partial's ``counts.json``, checked: counts are non-negative integers (it may come from
    the store). Raises ``ValueError``."""
    data = json.loads((folder / "counts.json").read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("counts.json is not an object")
    for name in ("rows", "distinct_texts"):
        _count(data.get(name), name)
    for name in ("excluded_rows", "pii_by_kind", "time_sensitive_by_kind", "read"):
        value = data.get(name)
        if not isinstance(value, dict):
            raise ValueError(f"counts.json: {name} is not an object")
        if name == "read" and not set(value) <= READ_COUNTS:
            raise ValueError(f"counts.json: read holds {sorted(set(value) - READ_COUNTS)}")
        for key, n in value.items():
            if name == "read" and key == "malformed_by_field":
                if not isinstance(n, dict):
                    raise ValueError("counts.json: read.malformed_by_field is not an object")
                for field_name, m in n.items():
                    _count(m, f"read.malformed_by_field.{field_name}")
            else:
                _count(n, f"{name}.{key}")
    return data


def _count(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"counts.json: {name} is not a count")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _usable(folder: Path) -> None:
    """Raises ``ValueError`` unless ``folder`` holds a partial of the expected columns and
    types, and counts that are counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, columns in COLUMNS.items():
        try:
            found = tuple((f.name, str(f.type)) for f in pq.read_schema(folder / name))
        except pa.ArrowException as error:
            raise ValueError(f"{name} is not Parquet: {error}") from error
        if found != columns:
            raise ValueError(f"{name} has columns {found}, not {columns}")
    read_counts(folder)
    _in_range(folder)


# a partial's rows that no day's rows give (what would make the merge count past a cap, or
# overflow: a group counted whole has n <= ur <= the cap)
_OUT_OF_RANGE = {
    "groups.parquet": "n < 1 OR ur < 1 OR n > ur OR nr < 1",
    "ranks.parquet": "ur < 1 OR nr < 1",
    "users.parquet": "rows < 1",
    "networks.parquet": "rows < 1",
}


def local_duckdb(
    database: str, folders: Iterable[Path], lock: bool = True, **config: Any
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection (``config``: its settings) that reaches the files under ``folders``
    and nothing else: no other file, no URL (s3://, https://), no extension downloaded or
    loaded (``enable_external_access`` off, which DuckDB never turns back on); with ``lock``,
    its settings are frozen too. The mine stage reads only local files it fetched and Arrow
    tables it registers."""
    import duckdb

    allowed = sorted({f"{path}/" for folder in folders for path in (folder, folder.resolve())})
    # nothing is downloaded at run time: no extension may be fetched or loaded
    quiet = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    con = duckdb.connect(database, config={**config, **quiet})
    try:
        con.execute("SET allowed_directories = ?", [allowed])
        con.execute("SET enable_external_access = false")
        if lock:
            con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _in_range(folder: Path) -> None:
    """Raises ``ValueError`` when a partial's counts and ranks are out of range, or their
    pages cannot be read (DuckDB, in memory, on the fetching thread)."""
    import duckdb

    con = local_duckdb(":memory:", [folder], threads=1, memory_limit="256MB")
    try:
        for name, bad in _OUT_OF_RANGE.items():
            ((n,),) = con.execute(
                f"SELECT count(*) FROM read_parquet('{_sql(folder / name)}') WHERE {bad}"
            ).fetchall()
            if n:
                raise ValueError(f"{name} has {n} rows of counts or ranks out of range")
    except duckdb.Error as error:
        raise ValueError(f"not readable: {error}") from error
    finally:
        con.close()


@dataclass
class DayParts:
    """The window's days' partials in the store, for the night whose window is ``since`` to
    ``until``: ``fetch`` one into a folder, ``put`` one computed tonight, ``close`` to delete
    those of days before ``since``. ``counts``: days found, computed (reduced from the logs),
    refused (``invalid_parts``), and partials expired."""

    store: Store
    profile: str
    fingerprint: str | Callable[[], str]
    since: date
    until: date
    counts: CacheCounts = field(default_factory=CacheCounts)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def root(self) -> str:
        return f"{self.profile}/work/cache/days"

    def _prefix(self, day: LogDay) -> str:
        with self._lock:
            if callable(self.fingerprint):
                self.fingerprint = self.fingerprint()
        return f"{self.root}/{self.fingerprint}/{day.day.isoformat()}"

    def holds(self, day: LogDay) -> bool:
        """Whether the store has a partial of the day for its listing (its manifest)."""
        return self.store.exists(f"{self._prefix(day)}/{day.listing}/{MANIFEST}")

    def fetch(self, day: LogDay, folder: Path) -> bool:
        """The day's partial into ``folder`` when the store holds one for its listing, checked
        (each file's sha256 against the manifest, the columns, the counts): whether it did. A
        day without a partial, or with one that does not check, is left to be reduced."""
        prefix = f"{self._prefix(day)}/{day.listing}"
        try:
            manifest = json.loads(self.store.get(f"{prefix}/{MANIFEST}", max_bytes=1 << 16))
        except ObjectNotFoundError:
            return False
        except (ValueError, RecursionError, EdgeQAError) as error:
            return self._refused(prefix, folder, error)
        try:
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise ValueError("not a manifest of this format")
            sums = manifest.get("sha256")
            if not isinstance(sums, Mapping) or set(sums) != set(FILES):
                raise ValueError("the manifest does not list the partial's files")
            folder.mkdir(parents=True, exist_ok=True)
            for name in FILES:
                self.store.get_file(f"{prefix}/{name}", folder / name)
                if _sha256(folder / name) != sums[name]:
                    raise ValueError(f"{name} is not the file its manifest names")
            _usable(folder)
        except (ValueError, RecursionError, OSError, EdgeQAError, KeyError) as error:
            return self._refused(prefix, folder, error)
        with self._lock:  # (days are fetched on threads)
            self.counts.found += 1
        return True

    def _refused(self, prefix: str, folder: Path, error: Exception) -> bool:
        log.warning("day partial %s is not usable, reduced again from the logs: %s", prefix, error)
        with self._lock:
            self.counts.invalid_parts += 1
        shutil.rmtree(folder, ignore_errors=True)
        return False

    def put(self, day: LogDay, folder: Path) -> None:
        """The day's partial computed tonight (``folder``) into the store, its manifest last;
        then the day's partials of other listings (its logs as they were) are deleted."""
        prefix = self._prefix(day)
        target = f"{prefix}/{day.listing}"
        for name in FILES:
            self.store.put_file(f"{target}/{name}", folder / name)
        manifest = {"format": FORMAT, "sha256": {name: _sha256(folder / name) for name in FILES}}
        self.store.put(f"{target}/{MANIFEST}", json.dumps(manifest, sort_keys=True).encode())
        for path in self.store.list(f"{prefix}/"):
            if not path.startswith(f"{target}/"):
                self._delete(path)

    def close(self) -> None:
        """Delete the partials of days before the window's first day (every fingerprint's)."""
        for path in self.store.list(f"{self.root}/"):
            parts = path[len(self.root) + 1 :].split("/")
            try:
                day = date.fromisoformat(parts[1]) if len(parts) > 2 else None
            except ValueError:
                continue
            if day is not None and day < self.since:
                if parts[-1] == MANIFEST:
                    self.counts.expired_parts += 1
                self._delete(path)

    def _delete(self, path: str) -> None:
        try:
            self.store.delete(path)
        except ObjectNotFoundError:
            pass
