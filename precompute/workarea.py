"""A run's work area in the output store: what one stage leaves for the next.

    <profile>/work/<run>/hot/<nnnnn>.parquet   the mined questions, in rank order, ``HOT_PART_ROWS``
                                               a part (mine; ``questions.hot_schema``)
    <profile>/work/<run>/mined.json            mine's result: counts, profile, run (mine)
    <profile>/work/<run>/clusters/<nnnnn>.parquet
                                               a row per cluster that reached k: askers, wordings
                                               published and held back, and why (mine;
                                               ``questions.cluster_report_schema``)
    <profile>/work/<run>/profile.json          what the answers depend on (mine)
    <profile>/work/<run>/reused/<nnnnn>.parquet
                                               the answers taken as they are (the operator's, the
                                               parent release's) of the questions of ``hot/``'s
                                               part <nnnnn> (mine; ``generate.answer_schema``)
    <profile>/work/<run>/gen/<nnnnn>.parquet   one generated partition each (generate)
    <profile>/work/<run>/attempts/<nnnnn>-<worker>-<t>.json
                                               a worker started generating it (generate)
    <profile>/work/<run>/built.json            the release build wrote where it is served (build)
    <profile>/work/cache/...                   the text rules' verdicts and the wordings' vectors,
                                               kept across runs (mine: ``nightcache.py``)

``run`` is a digest of the profile, the mined questions and the parent release, so the same input
always maps to the same work area: a rerun (an Airflow retry, the same night again before it is
published) finds what is done and reuses it.
Stages may run on different machines; the store is all they share.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import EdgeQAError
from base.manifest import Manifest
from base.store import Store, parquet_bytes, parquet_table

if TYPE_CHECKING:
    import pyarrow as pa

    from precompute.questions import HotQuestion

# mined questions a part of ``hot/`` holds: a million questions are 123 objects, each read
# whole by a stage that needs it (a part of the night, never the night at once)
HOT_PART_ROWS = 8192


@dataclass(frozen=True)
class WorkArea:
    store: Store
    profile: str
    run: str

    @property
    def prefix(self) -> str:
        return work_prefix(self.profile, self.run)

    def put_reused(self, parts: Iterable[pa.Table]) -> int:
        """Write the answers this run takes instead of generating (tables of
        ``generate.answer_schema``, the ``i``-th the answers to questions of ``hot/``'s ``i``-th
        part) as ``reused/``, each beside its part of ``hot/`` (an empty one not written),
        replacing what was there; the rows written."""
        self.store.delete_prefix(f"{self.prefix}/reused/")
        return sum(self.put_reused_part(part, table) for part, table in enumerate(parts))

    def put_reused_part(self, part: int, table: pa.Table) -> int:
        """``reused/``'s part ``part`` (the answers to ``hot/``'s part ``part``; not written
        when empty): its rows. ``put_reused`` writes them all, what was there removed."""
        if table.num_rows:
            self.put_table(self._part("reused", part), table)
        return table.num_rows

    def reused_parts(self) -> Iterator[pa.Table]:
        """Every answer the run takes as it is, a part at a time."""
        for path in sorted(self.store.list(f"{self.prefix}/reused/")):
            yield self.get_table(path)

    def partition(self, index: int) -> str:
        return f"{self.prefix}/gen/{index:05d}.parquet"

    def attempt(self, index: int, worker: str) -> None:
        """Record that ``worker`` (``host:pid``) starts generating partition ``index``."""
        started = time.time()
        name = re.sub(r"[^A-Za-z0-9.-]+", "-", worker)
        record = {"partition": index, "worker": worker, "started": started}
        self.put_json(f"attempts/{index:05d}-{name}-{started:.6f}.json", record)

    def attempts(self) -> dict[int, list[dict[str, Any]]]:
        """Every recorded attempt, by partition (``attempt``)."""
        found: dict[int, list[dict[str, Any]]] = {}
        for path in self.store.list(f"{self.prefix}/attempts"):
            record = json.loads(self.store.get(path))
            found.setdefault(int(record["partition"]), []).append(record)
        return found

    def attempted(self) -> list[int]:
        """The partition of every recorded attempt, from the objects' names (one listing)."""
        return [
            int(path.rsplit("/", 1)[-1].split("-", 1)[0])
            for path in self.store.list(f"{self.prefix}/attempts")
        ]

    def put_hot(
        self,
        hot: Iterable[HotQuestion],
        each_part: Callable[[int, list[HotQuestion]], None] | None = None,
    ) -> int:
        """Write the mined questions, in order, as ``hot/`` (``HOT_PART_ROWS`` a part, replacing
        what was there); the number of questions. ``each_part(i, questions)``: handed each
        part's questions as it is written, without their askers (what is written beside it:
        ``reused/``), so they are read once. ``put_hot_tables`` of their rows."""
        import pyarrow as pa

        from precompute.questions import hot_schema

        def tables() -> Iterator[pa.Table]:
            it = iter(hot)
            while questions := list(itertools.islice(it, HOT_PART_ROWS)):
                yield pa.Table.from_pylist([q.as_row() for q in questions], schema=hot_schema())

        return self.put_hot_tables(tables(), each_part)

    def put_hot_tables(
        self,
        tables: Iterable[pa.Table],
        each_part: Callable[[int, list[HotQuestion]], None] | None = None,
    ) -> int:
        """``put_hot`` of the mined questions as ``hot_schema`` tables, in order (``HotSpill.
        tables``): the parts cut and written with Arrow, the questions never Python objects
        with their askers; ``each_part`` is handed each part's questions without them
        (``questions.without_askers``: what ``reused/`` needs)."""
        import pyarrow as pa

        from precompute.questions import HotQuestion, hot_schema, without_askers

        schema = hot_schema()
        self.store.delete_prefix(f"{self.prefix}/hot/")
        waiting: list[pa.Table] = []
        held = part = count = 0

        def write(table: pa.Table) -> None:
            nonlocal part, count
            if each_part is not None:
                lean = without_askers(table).to_pylist()
                each_part(part, [HotQuestion.from_row(row) for row in lean])
            self.put_table(self._part("hot", part), table)
            part, count = part + 1, count + len(table)

        for table in tables:
            waiting.append(table.select(schema.names).cast(schema))
            held += len(table)
            while held >= HOT_PART_ROWS:
                whole = pa.concat_tables(waiting).combine_chunks()
                write(whole.slice(0, HOT_PART_ROWS))
                waiting, held = [whole.slice(HOT_PART_ROWS)], held - HOT_PART_ROWS
        if held or not part:  # an empty night still has its empty part
            write(pa.concat_tables(waiting).combine_chunks() if waiting else schema.empty_table())
        return count

    def put_clusters(self, rows: Iterable[dict[str, Any]]) -> str:
        """Write the cluster report (``HotQuestion.report_row``s) as ``clusters/``,
        ``HOT_PART_ROWS`` a part (replacing what was there); where it is."""
        from precompute.questions import cluster_report_schema

        self._put_parts("clusters", rows, cluster_report_schema())
        return f"{self.prefix}/clusters/"

    def clusters(self) -> Iterator[dict[str, Any]]:
        """The cluster report's rows, a part read at a time."""
        for path in sorted(self.store.list(f"{self.prefix}/clusters/")):
            yield from self.get_table(path).to_pylist()

    def _put_parts(self, name: str, rows: Iterable[dict[str, Any]], schema: pa.Schema) -> int:
        """``rows`` as the dataset ``name/<nnnnn>.parquet``, ``HOT_PART_ROWS`` a part, in order
        (what was there replaced; an empty one still has its empty part); the rows written."""
        import pyarrow as pa

        batch: list[dict[str, Any]] = []
        part = count = 0
        self.store.delete_prefix(f"{self.prefix}/{name}/")
        for row in rows:
            batch.append(row)
            if len(batch) == HOT_PART_ROWS:
                self.put_table(self._part(name, part), pa.Table.from_pylist(batch, schema=schema))
                part, count, batch = part + 1, count + len(batch), []
        if batch or not part:
            self.put_table(self._part(name, part), pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
        return count

    def _part(self, name: str, index: int) -> str:
        return f"{self.prefix}/{name}/{index:05d}.parquet"

    def hot_tables(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """The mined questions, a part at a time, in order (only ``columns``, if given). Raises
        ``ObjectNotFoundError`` when the run has none (mined before ``hot/`` was Parquet)."""
        from base.store import ObjectNotFoundError

        parts = sorted(self.store.list(f"{self.prefix}/hot/"))
        if not parts:
            raise ObjectNotFoundError(f"{self.prefix}/hot/")
        for path in parts:
            yield self.get_table(path, columns)

    def hot(self, askers: bool = True) -> Iterator[HotQuestion]:
        """Every mined question, in order, a part read at a time; without ``askers``, its
        wordings' askers counted, not named (``questions.without_askers``: what a build needs)."""
        from precompute.questions import HotQuestion, without_askers

        for table in self.hot_tables():
            for row in (table if askers else without_askers(table)).to_pylist():
                yield HotQuestion.from_row(row)

    def put_json(self, name: str, value: Any) -> None:
        self.store.put(f"{self.prefix}/{name}", json.dumps(value, sort_keys=True).encode())

    def get_json(self, name: str) -> Any:
        return json.loads(self.store.get(f"{self.prefix}/{name}"))

    def put_table(self, path: str, table: pa.Table) -> None:

        self.store.put(path, parquet_bytes(table))

    def get_table(self, path: str, columns: list[str] | None = None) -> pa.Table:
        """The table at ``path`` (only ``columns``, if given); raises ``ObjectNotFoundError`` when
        ``path`` is not there."""
        return parquet_table(self.store.get(path), columns)


def empty_answers(store: Store, prefix: str, manifest: Manifest) -> int:
    """Rows of the release at ``prefix`` (``manifest``) whose answer is empty: each shard's rows
    read to a temporary file, their answers a batch at a time."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    empty = 0
    with tempfile.TemporaryDirectory(prefix="edgeqa-answers-") as folder:
        local = Path(folder) / "rows.parquet"
        for shard in manifest.shards:
            store.get_file(f"{prefix}/{shard.rows.path}", local, shard.rows.size_bytes)
            with pq.ParquetFile(local) as rows:
                for batch in rows.iter_batches(8192, columns=["answer"], use_threads=False):
                    stripped = pc.utf8_trim_whitespace(batch.column(0).fill_null(""))
                    empty += pc.sum(pc.equal(pc.utf8_length(stripped), 0)).as_py() or 0
    return empty


class PartitionReader:
    """The questions of generation's partitions (``size`` of ``hot/``'s ``count`` questions
    each, in order) and the answers the run reuses for them, read from the work area a part of
    ``hot/`` at a time: what a worker needs of the run, never the run. The last parts read are
    kept (a worker is handed neighbouring partitions: one read of a part serves up to
    ``HOT_PART_ROWS / size`` of them)."""

    def __init__(self, work: WorkArea, size: int, count: int, keep: int = 2) -> None:
        if size < 1:
            raise ValueError(f"a partition of {size} questions")
        self.work, self.size, self.count, self.keep = work, size, count, keep
        self._parts: dict[tuple[str, int], pa.Table | None] = {}

    def _table(self, name: str, part: int) -> pa.Table | None:
        """Part ``part`` of ``name`` (``hot``: its key and question; ``reused``: None when no
        answer of it is reused)."""
        from base.store import ObjectNotFoundError

        if (name, part) in self._parts:
            found = self._parts.pop((name, part))
        elif name == "hot":
            found = self.work.get_table(self.work._part(name, part), ["key", "question"])
        else:
            try:
                found = self.work.get_table(self.work._part(name, part))
            except ObjectNotFoundError:  # no answer of this part is reused
                found = None
        self._parts[(name, part)] = found  # the newest last
        while len(self._parts) > 2 * self.keep:
            self._parts.pop(next(iter(self._parts)))
        return found

    @property
    def partitions(self) -> int:
        return -(-self.count // self.size)

    def _spans(self, index: int) -> Iterator[tuple[int, int, int]]:
        """(part, first row, row after) of ``hot/`` for partition ``index``."""
        if not 0 <= index < self.partitions:
            raise IndexError(f"partition {index} of {self.partitions}")
        start, stop = index * self.size, min((index + 1) * self.size, self.count)
        for part in range(start // HOT_PART_ROWS, (stop - 1) // HOT_PART_ROWS + 1):
            low = max(start, part * HOT_PART_ROWS) - part * HOT_PART_ROWS
            yield part, low, min(stop, (part + 1) * HOT_PART_ROWS) - part * HOT_PART_ROWS

    def questions(self, index: int) -> tuple[list[str], list[str]]:
        """Partition ``index``'s keys and questions, in order. Raises ``ObjectNotFoundError``
        when a part of ``hot/`` it needs is not there, ``ValueError`` when one is short."""
        keys: list[str] = []
        questions: list[str] = []
        for part, low, high in self._spans(index):
            table = self._table("hot", part)
            assert table is not None  # a missing part of hot/ raised
            if table.num_rows < high:
                raise ValueError(f"hot/ part {part} has {table.num_rows} questions, not {high}")
            table = table.slice(low, high - low)
            keys += table.column("key").to_pylist()
            questions += table.column("question").to_pylist()
        return keys, questions

    def reused(self, index: int, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The reused answers of partition ``index``'s ``keys``, by key."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = pa.array(sorted(set(keys)), pa.string())
        found: dict[str, dict[str, Any]] = {}
        for part, _, _ in self._spans(index):
            table = self._table("reused", part)
            if table is None or not table.num_rows:
                continue
            taken = table.filter(pc.is_in(table.column("key"), value_set=wanted))
            found.update({row["key"]: row for row in taken.to_pylist()})
        return found


def work_prefix(profile: str, run: str) -> str:
    return f"{profile}/work/{run}"


# a run as the stages after mine are handed it on a command line: ``<profile>/<run>``
_RUN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,127})/([0-9a-f]{8,64})")


def parse_run(text: str) -> tuple[str, str]:
    """``(profile, run)`` of ``<profile>/<run>`` (what ``edgeqa precompute stage --run`` takes);
    ``EdgeQAError`` for anything else (a path that would leave the profile's work area)."""
    found = _RUN.fullmatch(text or "")
    if not found or ".." in found.group(1):
        raise EdgeQAError(f"{text!r} is not a run: <profile>/<run>, as the mine stage printed it")
    return found.group(1), found.group(2)
