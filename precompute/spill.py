"""What the mine stage makes as it goes and hands on whole, kept on local disk instead of in
its memory: the mined questions (``HotSpill``, read back in rank order) and the cluster report
(``ClusterSpill``, read back as made). A night of a million hot questions held ~5 KB of Python
objects each (their askers as sets and dicts); here the stage holds a part of
``SPILL_ROWS`` rows, and the rest is Parquet in a private folder the caller removes.

Both are ``RowSpill``s: rows of a Parquet schema, kept in memory up to a part and written to
``<folder>/<nnnnn>.parquet`` a part at a time. With an ``order`` (a key over rows) each part is
sorted before it is written and reading merges the parts (``heapq.merge`` over each part read
``READ_ROWS`` at a time, the parts written in row groups of as many): an external sort whose
memory is a part plus a row group a part.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precompute.questions import HotQuestion, cluster_report_schema, hot_schema, without_askers

if TYPE_CHECKING:
    import pyarrow as pa

SPILL_ROWS = 8192  # rows held before a part is written
READ_ROWS = 256  # rows read from each part at a time while they are merged


class RowSpill:
    """Rows (dicts) of ``schema``: ``append``, then iterate (as often as wanted). ``folder``:
    where the parts go (None: every row is held); ``order``: a key over rows (None: as
    appended)."""

    def __init__(
        self,
        schema: pa.Schema,
        folder: Path | None = None,
        order: Callable[[dict[str, Any]], Any] | None = None,
        order_columns: tuple[str, ...] = (),
    ) -> None:
        self._schema = schema
        self._folder = folder
        self._order = order
        self._order_columns = order_columns  # the columns ``order`` reads (for ``tables``)
        self._held: list[dict[str, Any]] = []
        self._parts: list[Path] = []
        self._count = 0
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def __len__(self) -> int:
        return self._count

    def append(self, row: dict[str, Any]) -> None:
        self._held.append(row)
        self._count += 1
        if self._folder is not None and len(self._held) >= SPILL_ROWS:
            self._write()

    def _write(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert self._folder is not None
        if self._order is not None:
            self._held.sort(key=self._order)
        path = self._folder / f"{len(self._parts):05d}.parquet"
        # row groups of READ_ROWS: a reader decodes a row group whole, and the merge keeps a
        # reader open on every part (one group a part: 8,192 questions held per part)
        table = pa.Table.from_pylist(self._held, schema=self._schema)
        pq.write_table(table, path, row_group_size=READ_ROWS)
        self._parts.append(path)
        self._held = []

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.rows()

    def rows(self, shape: Shape | None = None) -> Iterator[dict[str, Any]]:
        """Every row (in order), each ``shape``d first (a table's columns changed before its
        rows become dicts: ``questions.without_askers``; None: as they were added)."""
        import pyarrow as pa

        held = sorted(self._held, key=self._order) if self._order else list(self._held)
        if shape is not None and held:
            held = shape(pa.Table.from_pylist(held, schema=self._schema)).to_pylist()
        streams: list[Iterable[dict[str, Any]]] = [_read(path, shape) for path in self._parts]
        if self._order is None:
            return (row for stream in [*streams, held] for row in stream)
        return heapq.merge(*streams, held, key=self._order)

    def tables(self, limit: int | None = None, rows: int | None = None) -> Iterator[pa.Table]:
        """The first ``limit`` rows (None: all) in order, as tables of up to ``rows`` rows,
        never made Python dicts: the parts merged by their ``order_columns`` alone, each part
        read a row group at a time, the rows taken with Arrow (a mined question with its askers
        is ~520 µs as a dict and back, its rank columns ~1)."""
        import pyarrow as pa

        assert self._order is not None and self._order_columns, "tables() merges by an order"
        order, columns = self._order, list(self._order_columns)
        schema, rows = self._schema, rows or SPILL_ROWS
        sources = [_Part(_batches(path), schema) for path in self._parts]
        # each part's rank columns read a row group at a time beside its rows: never all held
        keys: list[Iterable[dict[str, Any]]] = [
            _read(path, columns=columns) for path in self._parts
        ]
        if self._held:
            held = sorted(self._held, key=order)
            sources.append(
                _Part(iter(pa.Table.from_pylist(held, schema=schema).to_batches()), schema)
            )
            keys.append(held)
        merged = heapq.merge(*[_keyed(part, at, order) for at, part in enumerate(keys)])
        taken = 0
        while picks := [
            at for _, at in islice(merged, rows if limit is None else min(rows, limit - taken))
        ]:
            counts = Counter(picks)
            starts, blocks, start = {}, [], 0
            for at in sorted(counts):
                starts[at] = start
                blocks.append(sources[at].take(counts[at]))
                start += counts[at]
            seen: Counter[int] = Counter()
            positions = []
            for at in picks:
                positions.append(starts[at] + seen[at])
                seen[at] += 1
            yield pa.concat_tables(blocks).take(pa.array(positions, pa.int64()))
            taken += len(picks)


def _keyed(
    rows: Iterable[dict[str, Any]], at: int, order: Callable[[dict[str, Any]], Any]
) -> Iterator[tuple[Any, int]]:
    """Each of a part's rows' place in the order, with the part's number."""
    return ((order(row), at) for row in rows)


class _Part:
    """A sorted part's rows handed out in order, ``take(n)`` at a time, as tables (a Parquet
    file's read a row group at a time)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> None:
        self._batches, self._schema = batches, schema
        self._rest: pa.Table | None = None

    def take(self, n: int) -> pa.Table:
        import pyarrow as pa

        blocks = [] if self._rest is None else [self._rest]
        held = sum(len(b) for b in blocks)
        while held < n:
            batch = next(self._batches)
            blocks.append(pa.Table.from_batches([batch], schema=self._schema))
            held += len(batch)
        table = pa.concat_tables(blocks)
        self._rest = table.slice(n)
        return table.slice(0, n)


Shape = Callable[["pa.Table"], "pa.Table"]


def _batches(path: Path, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """A part's rows (only ``columns``, if given), a row group of ``READ_ROWS`` at a time, no
    read-ahead: the merges keep one open on every part."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, pre_buffer=False).iter_batches(
        batch_size=READ_ROWS, columns=columns, use_threads=False
    )


def _read(
    path: Path, shape: Shape | None = None, columns: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    import pyarrow as pa

    for batch in _batches(path, columns):
        yield from (batch if shape is None else shape(pa.Table.from_batches([batch]))).to_pylist()


def rank(row: dict[str, Any]) -> tuple[float, int, str]:
    """A mined question's place (``hot_schema`` row): best score first, then most askers, then
    its key."""
    return (-row["score"], -row["users"], row["key"])


class HotSpill:
    """The mined questions, added in any order, read back in rank order (``rank``) as
    ``HotQuestion``s, the first ``limit`` of them (None: all; ``ranked``: all, each with
    whether it is within the limit):
    as ``hot/`` keeps them (``HotQuestion.as_row``), so a wording's ``more_weight`` (the
    run's alone) is not kept."""

    def __init__(self, folder: Path | None = None) -> None:
        self._rows = RowSpill(hot_schema(), folder, rank, ("score", "users", "key"))
        self.limit: int | None = None

    def __len__(self) -> int:
        count = len(self._rows)
        return count if self.limit is None else min(count, self.limit)

    def add(self, question: HotQuestion) -> None:
        self._rows.append(question.as_row())

    def __iter__(self) -> Iterator[HotQuestion]:
        return self.questions()

    def questions(self, askers: bool = True) -> Iterator[HotQuestion]:
        """The first ``limit`` questions in rank order; without ``askers``, their wordings'
        askers counted, not named (``questions.without_askers``: ~6× as fast a read)."""
        rows = self._rows.rows(None if askers else without_askers)
        return (HotQuestion.from_row(row) for row in islice(rows, self.limit))

    def tables(self, drop: Collection[str] = ()) -> Iterator[pa.Table]:
        """The first ``limit`` questions in rank order as ``hot_schema`` tables (as ``hot/``
        keeps them), never made Python objects, the clusters ``drop`` names left out."""
        import pyarrow as pa
        import pyarrow.compute as pc

        dropped = pa.array(sorted(drop), pa.string())
        for table in self._rows.tables(self.limit):
            yield table.filter(pc.invert(pc.is_in(table["key"], dropped))) if drop else table

    def ranked(self, askers: bool = True) -> Iterator[tuple[bool, HotQuestion]]:
        """Every question in rank order, each with whether it is within ``limit``: the first
        ``limit`` and the others in one read (a read of 500,000 questions is ~95 s of one
        thread with their askers; the others were read apart, after the first ``limit``
        again); without ``askers``, as ``questions``."""
        rows = self._rows.rows(None if askers else without_askers)
        for at, row in enumerate(rows):
            yield self.limit is None or at < self.limit, HotQuestion.from_row(row)


class ClusterSpill:
    """The cluster report's rows (``HotQuestion.report_row``), read back in the order they came,
    with the clusters dropped after mining (``relabel``) under their new status."""

    def __init__(self, folder: Path | None = None) -> None:
        self._rows = RowSpill(cluster_report_schema(), folder)
        self._status: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, row: dict[str, Any]) -> None:
        self._rows.append({"signed_users": None, "asns": None, **row})

    def relabel(self, clusters: Iterable[str], status: str) -> None:
        """The rows of ``clusters`` (their keys) read with ``status``."""
        self._status.update((key, status) for key in clusters)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in self._rows:
            status = self._status.get(row["cluster"]) if row["cluster"] is not None else None
            yield row if status is None else {**row, "status": status}
