"""What a night keeps for the next ones: the text rules' verdicts and the wordings' vectors, by
content hash, so that a night over a window that moved by a day judges and embeds only what is
new (``docs/precompute.md``, "Incremental nights").

    <profile>/work/cache/verdicts/<rules>/<night>/<nnnnn>-<token>.parquet
        qhash (sha256 of the raw text), language, reason, kinds: no text
    <profile>/work/cache/vectors/<embedder>/<night>/<nnnnn>-<token>.parquet
        key (the wording's), vector (the embedder's fp32 vector of its normalized text)

``<rules>`` and ``<embedder>`` are fingerprints of what made the entries (``rules_fingerprint``:
the text rules' code, the Unicode tables and the language mined; ``embedder_fingerprint``:
every byte of the embedder's folder), so a changed rule or embedder never reads an old entry.
``<night>`` is the last day of the window that wrote the part. Each night writes what it had to
compute, and rewrites the entries it used from parts about to fall out (written by a night whose
window ended on or before tonight's first day); then it deletes the parts of nights before its
first day, of any fingerprint. So the cache holds about one window of entries, and one in use is
rewritten once a window, not every night.

A cache is an optimisation, never an input: an entry is a pure function of its content and its
fingerprint, so a night with the cache and one without produce the same questions (a test checks
it); a part that vanished while it was read (a concurrent night expiring it) is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import secrets
import tempfile
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.store import ObjectNotFoundError, Store, parquet_table

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from precompute.clustering import Encoder

log = logging.getLogger(__name__)

PART_ROWS = 32_768  # entries a part holds (vectors: 48 MiB at 384 dimensions)

# the modules whose code decides a text's verdict (``textrules.judge_texts``)
RULES_MODULES = (
    "precompute/textrules.py",
    "base/keys.py",
    "base/languages.py",
    "policy/pii.py",
    "policy/redaction.py",
    "policy/scripts.py",
    "policy/timeliness.py",
)


def rules_fingerprint(language: str | None) -> str:
    """What the text rules' verdicts depend on: their code, the Unicode tables of this Python
    and the language mined (a text of another language is not judged)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"{unicodedata.unidata_version}\0{language}\0".encode())
    for name in RULES_MODULES:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def _folder_digest(folder: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def embedder_fingerprint(spec: str, cache_dir: Path | None = None) -> str:
    """Every byte of the embedder's folder (its weights, tokenizer and pooling): a fine-tuned
    or upgraded embedder never reads the vectors of another."""
    from edge_index.embedder import resolve_embedder_path

    return _folder_digest(str(resolve_embedder_path(spec, cache_dir)))


@dataclass
class CacheCounts:
    """What a night's cache did: entries found, computed (and kept), rewritten (found in a
    part about to fall out), refused (``invalid``: not of the shape they must have; and whole
    parts, ``invalid_parts``: not Parquet of the cache's schema), parts expired."""

    found: int = 0
    computed: int = 0
    rewritten: int = 0
    invalid: int = 0
    invalid_parts: int = 0
    expired_parts: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class NightCaches:
    """The caches a night's mining reads and writes (None: that one is not kept)."""

    verdicts: NightCache | None = None
    vectors: NightCache | None = None

    @classmethod
    def of_night(
        cls,
        store: Store,
        profile: str,
        language: str | None,
        embedder: str,
        since: date,
        until: date,
        cache_dir: Path | None = None,
    ) -> NightCaches:
        """Both caches of ``profile``, for the night whose window is ``since`` to ``until``,
        under the fingerprints of tonight's text rules and embedder (``embedder``'s spec)."""
        return cls(
            NightCache(store, profile, "verdicts", rules_fingerprint(language), since, until),
            NightCache(
                store, profile, "vectors", embedder_fingerprint(embedder, cache_dir), since, until
            ),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            name: cache.counts.as_dict()
            for name, cache in (("verdicts", self.verdicts), ("vectors", self.vectors))
            if cache is not None
        }


@dataclass
class NightCache:
    """One kind of entry (``verdicts``, ``vectors``) under one fingerprint, for the night whose
    window is ``since`` to ``night``."""

    store: Store
    profile: str
    kind: str
    fingerprint: str
    since: date
    night: date
    counts: CacheCounts = field(default_factory=CacheCounts)
    _pending: list[pa.Table] = field(default_factory=list, init=False, repr=False)
    _pending_rows: int = field(default=0, init=False, repr=False)
    _written: int = field(default=0, init=False, repr=False)
    _token: str = field(default_factory=lambda: secrets.token_hex(4), init=False, repr=False)

    @property
    def root(self) -> str:
        return f"{self.profile}/work/cache/{self.kind}"

    @property
    def prefix(self) -> str:
        return f"{self.root}/{self.fingerprint}"

    def tables(
        self, columns: list[str], accepts: Callable[[pa.Schema], bool]
    ) -> Iterator[tuple[date, pa.Table]]:
        """Every part of this fingerprint (the night that wrote it, its table of ``columns``),
        one at a time. A part gone before it was read is skipped; one that is not Parquet, or
        whose columns' types ``accepts`` refuses, is skipped and counted (``invalid_parts``): a
        cache never stops a night."""
        import pyarrow as pa

        for path in sorted(self.store.list(f"{self.prefix}/")):
            written = _night_of(path, self.prefix)
            if written is None:
                continue
            try:
                table = parquet_table(self.store.get(path), columns)
            except ObjectNotFoundError:
                continue
            except (pa.ArrowException, KeyError, ValueError) as error:
                log.warning("cache part %s is not readable, skipped: %s", path, error)
                self.counts.invalid_parts += 1
                continue
            if not accepts(table.schema):
                log.warning("cache part %s is not of the cache's schema, skipped", path)
                self.counts.invalid_parts += 1
                continue
            yield written, table

    def stale(self, written: date) -> bool:
        """Whether an entry of the night ``written`` falls out before the next night: it is
        rewritten tonight if used."""
        return written <= self.since

    def add(self, table: pa.Table) -> None:
        """Entries to keep (computed tonight, or rewritten): written ``PART_ROWS`` a part."""
        if not len(table):
            return
        self._pending.append(table)
        self._pending_rows += len(table)
        if self._pending_rows >= PART_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows = [], 0
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        path = f"{self.prefix}/{self.night.isoformat()}/{self._written:05d}-{self._token}.parquet"
        self.store.put(path, buffer.getvalue())
        self._written += 1

    def close(self) -> None:
        """Write what is left, then delete the parts of nights before the window's first day
        (every fingerprint of this kind: an old rule's or embedder's entries go too)."""
        self._flush()
        for path in self.store.list(f"{self.root}/"):
            written = _night_of(path, self.root, fingerprinted=True)
            if written is not None and written < self.since:
                try:
                    self.store.delete(path)
                except ObjectNotFoundError:
                    continue
                self.counts.expired_parts += 1


def _night_of(path: str, prefix: str, fingerprinted: bool = False) -> date | None:
    """The night of a part's path under ``prefix`` (``[<fingerprint>/]<night>/<part>``)."""
    parts = path[len(prefix) + 1 :].split("/")
    if fingerprinted:
        parts = parts[1:]
    if len(parts) != 2 or not parts[1].endswith(".parquet"):
        return None
    try:
        return date.fromisoformat(parts[0])
    except ValueError:
        return None


VECTOR_CHUNK = 8192  # vectors handed to clustering at a time
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
    import duckdb

    n = len(keys)
    if n == 0:
        return
    with tempfile.TemporaryDirectory(prefix="edgeqa-vectors-") as folder:
        con = duckdb.connect(
            f"{folder}/vectors.duckdb",
            config={
                "memory_limit": f"{memory_mb}MB",
                "threads": 1,
                "temp_directory": f"{folder}/spill",
                "preserve_insertion_order": False,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
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
