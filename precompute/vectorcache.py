"""The night's vectors through the cache across nights (``nightcache.py``): those it holds read
from it, the rest embedded and kept, all handed to clustering in its order, a chunk at a time
(``docs/precompute.md``, "Incremental nights")."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import EdgeQAError
from edge_index.query_encoder import TOKENIZE_CHUNK
from precompute.logwindow import embedded_duckdb
from precompute.nightcache import NightCache

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from precompute.clustering import Encoder

log = logging.getLogger(__name__)

# vectors handed to clustering at a time: the chunks the embedder gives without a cache, so
# that what the inverted file trains on and samples is the same with the cache and without
VECTOR_CHUNK = TOKENIZE_CHUNK
_TOLERANCE = 1e-3  # a cached vector's length may be this far from 1


def vectors_with_cache(
    cache: NightCache,
    keys: Sequence[str],
    texts: Sequence[str],
    encoder: Callable[[], Encoder],
    progress: bool = False,
    memory_mb: int = 512,
) -> Iterator[np.ndarray]:
    """The unit vectors of ``texts`` (the wordings ``keys``, in the order clustering takes them),
    a chunk at a time: those the cache holds read from it, the rest embedded by ``encoder()``
    (made only when one is missing: a night whose wordings are all cached starts no Ray) and
    kept. The lookup runs in an embedded DuckDB in a temporary folder (it spills past
    ``memory_mb``): the night's vectors are never all held. A cached vector that is not finite,
    of unit length and of the night's dimension is not used (embedded again, and counted)."""
    from importlib.metadata import PackageNotFoundError

    n = len(keys)
    if n == 0:
        return
    try:
        cache.prefix  # noqa: B018 (the embedder's fingerprint, taken here)
    except (EdgeQAError, PackageNotFoundError, OSError) as error:
        log.warning("the embedder's fingerprint cannot be taken here, no vector cache: %s", error)
        yield from encoder()(texts, progress)
        return
    with tempfile.TemporaryDirectory(prefix="edgeqa-vectors-") as folder:
        con = embedded_duckdb(Path(folder), memory_mb, threads=1)
        try:
            misses, dim = _lookup(con, cache, keys)
            yield from _merged(con, cache, keys, texts, misses, dim, encoder, progress)
        finally:
            con.close()
    cache.close()


def _lookup(con: Any, cache: NightCache, keys: Sequence[str]) -> tuple[np.ndarray, int | None]:
    """Table ``hits`` (pos, vector, night: the latest cached vector of each of the night's
    wordings at ``pos``); the positions without one, ascending; the vectors' dimension."""
    import numpy as np
    import pyarrow as pa

    n = len(keys)
    night = pa.table(
        {"pos": pa.array(np.arange(n, dtype=np.int64)), "key": pa.array(keys, pa.string())}
    )
    con.register("night_in", night)
    con.execute("CREATE TABLE night AS SELECT * FROM night_in")
    con.unregister("night_in")
    dim = None
    for written, table in cache.tables(["key", "vector"], _vector_part):
        part = _valid(table, dim, cache)
        if part is None or not len(part):
            continue
        if dim is None:
            dim = part.schema.field("vector").type.list_size
            con.execute(f"CREATE TABLE cached (key VARCHAR, vector FLOAT[{dim}], night DATE)")
        con.register("part_in", part)
        try:
            con.execute(
                "INSERT INTO cached SELECT key, vector, ?::DATE FROM part_in "
                "WHERE key IN (SELECT key FROM night)",
                [written],
            )
        finally:
            con.unregister("part_in")
    if dim is None:
        con.execute("CREATE TABLE hits (pos BIGINT, vector FLOAT[1], night DATE)")
        return np.arange(n, dtype=np.int64), None
    con.execute(
        "CREATE TABLE hits AS SELECT DISTINCT ON (n.pos) n.pos, c.vector, c.night "
        "FROM night n JOIN cached c USING (key) ORDER BY n.pos, c.night DESC"
    )
    con.execute("DROP TABLE cached")
    ((found_count,),) = con.execute("SELECT count(*) FROM hits").fetchall()
    cache.counts.found = int(found_count)
    found = con.sql(
        "SELECT pos FROM night WHERE pos NOT IN (SELECT pos FROM hits) ORDER BY pos"
    ).to_arrow_table()
    misses = found.column("pos").to_numpy() if found.num_rows else np.zeros(0, dtype=np.int64)
    return np.asarray(misses, dtype=np.int64), dim


def _vector_part(schema: pa.Schema) -> bool:
    """A vector part's columns: the wording's key, its fp32 vector of a fixed size (the
    night's: ``_valid``)."""
    import pyarrow as pa

    vector = schema.field("vector").type
    return (
        schema.field("key").type == pa.string()
        and pa.types.is_fixed_size_list(vector)
        and vector.value_type == pa.float32()
    )


def _valid(part: pa.Table, dim: int | None, cache: NightCache) -> pa.Table | None:
    """The rows of a cached part whose vector may be used: fixed-size fp32 of the night's
    dimension, finite, of unit length (the rest are embedded again: ``counts.invalid``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = part.schema.field("vector").type
    if dim is not None and kind.list_size != dim:
        cache.counts.invalid += len(part)
        return None
    present = pc.and_(pc.is_valid(part.column("vector")), pc.is_valid(part.column("key")))
    cache.counts.invalid += len(part) - int(pc.sum(present).as_py() or 0)
    part = part.filter(present)
    values = part.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    values = values.reshape(len(part), kind.list_size)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(values, axis=1)
    good = np.isfinite(norms) & (np.abs(norms - 1.0) <= _TOLERANCE)
    cache.counts.invalid += int((~good).sum())
    return part.filter(pa.array(good))


def _merged(
    con: Any,
    cache: NightCache,
    keys: Sequence[str],
    texts: Sequence[str],
    misses: np.ndarray,
    dim: int | None,
    encoder: Callable[[], Encoder],
    progress: bool,
) -> Iterator[np.ndarray]:
    """Chunks of ``VECTOR_CHUNK`` vectors in position order: the cached ones (table ``hits``,
    read in order) and the embedded ones (the ``misses``, embedded in order) side by side; the
    embedded ones, and the cached ones about to fall out, kept."""
    import numpy as np
    import pyarrow as pa

    n = len(keys)
    fresh = _Rows(iter(()))
    if len(misses):
        fresh = _Rows(iter(encoder()([texts[p] for p in misses.tolist()], progress)))
    result = con.sql("SELECT pos, vector, night FROM hits ORDER BY pos")
    cached = _Rows(_hit_batches(result.to_arrow_reader(VECTOR_CHUNK), cache))
    for start in range(0, n, VECTOR_CHUNK):
        end = min(n, start + VECTOR_CHUNK)
        lo, hi = np.searchsorted(misses, [start, end])
        new_rows = misses[lo:hi]
        new_vectors = fresh.take(len(new_rows))
        out_dim = new_vectors.shape[1] if len(new_rows) else dim
        hit_rows, hit_vectors, hit_nights = cached.take_with(end - start - len(new_rows))
        chunk = np.empty((end - start, out_dim or 0), dtype=np.float32)
        if len(new_rows):
            chunk[new_rows - start] = new_vectors
        if len(hit_rows):
            if out_dim != hit_vectors.shape[1]:
                raise ValueError(
                    f"the embedder's vectors have {out_dim} dimensions, the cache's "
                    f"{hit_vectors.shape[1]}: {cache.prefix} holds another embedder's"
                )
            expected = np.setdiff1d(np.arange(start, end), new_rows, assume_unique=True)
            if not np.array_equal(hit_rows, expected):
                raise ValueError("the cached vectors did not come in the night's order")
            chunk[hit_rows - start] = hit_vectors
        keep = [(new_rows, new_vectors)]
        old = np.asarray([cache.stale(night) for night in hit_nights], dtype=bool)
        if old.any():
            keep.append((hit_rows[old], hit_vectors[old]))
            cache.counts.rewritten += int(old.sum())
        for rows, vectors in keep:
            if len(rows):
                cache.add(
                    pa.table(
                        {
                            "key": pa.array([keys[p] for p in rows.tolist()], pa.string()),
                            "vector": pa.FixedSizeListArray.from_arrays(
                                pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1]
                            ),
                        }
                    )
                )
        cache.counts.computed += len(new_rows)
        yield chunk
    fresh.done()


def _hit_batches(reader: Any, cache: NightCache) -> Iterator[tuple[np.ndarray, ...]]:
    import numpy as np

    for batch in reader:
        if not batch.num_rows:
            continue
        kind = batch.schema.field("vector").type
        vectors = batch.column(1).flatten().to_numpy(zero_copy_only=False)
        yield (
            batch.column(0).to_numpy(),
            vectors.reshape(batch.num_rows, kind.list_size).astype(np.float32, copy=False),
            np.asarray(batch.column(2).to_pylist(), dtype=object),
        )


class _Rows:
    """Rows pulled from an iterator of arrays (or of tuples of arrays, row-aligned), ``k`` at a
    time: at most one pulled chunk beyond what is taken is held."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self._chunks = chunks
        self._held: list[tuple[np.ndarray, ...]] = []
        self._count = 0

    def _pull(self, k: int) -> None:
        while self._count < k:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                raise ValueError(f"{k - self._count} more vectors were expected") from None
            parts = chunk if isinstance(chunk, tuple) else (chunk,)
            self._held.append(parts)
            self._count += len(parts[0])

    def take_with(self, k: int) -> tuple[np.ndarray, ...]:
        import numpy as np

        if k == 0:
            return (np.zeros(0, dtype=np.int64), np.zeros((0, 0), np.float32), np.zeros(0, object))
        self._pull(k)
        joined = tuple(np.concatenate(column) for column in zip(*self._held, strict=True))
        self._held = [tuple(column[k:] for column in joined)] if len(joined[0]) > k else []
        self._count -= k
        return tuple(column[:k] for column in joined)

    def take(self, k: int) -> np.ndarray:
        import numpy as np

        if k == 0:
            return np.zeros((0, 0), dtype=np.float32)
        (vectors,) = self.take_with(k)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def done(self) -> None:
        """Every row was taken and the iterator is spent (the embedder gave no extra vector)."""
        if self._count:
            raise ValueError(f"{self._count} vectors more than the wordings came")
        for _ in self._chunks:
            raise ValueError("more vectors than the wordings came")
