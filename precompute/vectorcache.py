"""The night's vectors through the cache across nights (``nightcache.py``): those it holds read
from it, the rest embedded and kept, all handed to clustering in its order, a chunk at a time
(``docs/precompute.md``, "Incremental nights").

The lookup reads the cache a part at a time and writes each vector it finds to a local file, at
its wording's place in the night's order; clustering's chunks are then read from that file in
order, the misses embedded into their places. The process holds a part and a chunk, never the
night's vectors: a DuckDB join and sort of the vectors (what this was before) grew the process by
758 MB for 500,000 wordings, with a 256 MB budget; the file is 1.5 KB a wording of local disk."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from base.errors import EdgeQAError
from precompute.clustering import Texts
from precompute.nightcache import NightCache
from semantic.batch import TOKENIZE_CHUNK

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
    keys: Sequence[str] | pa.Array | pa.ChunkedArray,
    texts: Sequence[str],
    encoder: Callable[[], Encoder],
    progress: bool = False,
) -> Iterator[np.ndarray]:
    """The unit vectors of ``texts`` (the wordings ``keys``, in the order clustering takes them),
    a chunk at a time: those the cache holds read from it, the rest embedded by ``encoder()``
    (made only when one is missing: a night whose wordings are all cached starts no Ray) and
    kept. The cached ones wait in a file in a private temporary folder: the night's vectors
    are never all held. A cached vector that is not finite, of unit length and of the night's
    dimension is not used (embedded again, and counted)."""
    from importlib.metadata import PackageNotFoundError

    import pyarrow as pa

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    elif not isinstance(keys, pa.Array):
        keys = pa.array(keys, pa.string())
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
        path = Path(folder) / "vectors.f32"
        nights, dim = _lookup(cache, keys, path)
        yield from _merged(cache, keys, texts, path, nights, dim, encoder, progress)
    cache.close()


def _lookup(cache: NightCache, keys: pa.Array, path: Path) -> tuple[np.ndarray, int | None]:
    """Every cached vector of the night's wordings (the latest night's, where several parts
    hold one) written into ``path`` at its position in ``keys`` (fp32 rows of the vectors'
    dimension; a wording with none is a hole); per position the night its vector was written
    (days since 0001-01-01; 0: none), and the dimension (None: none found).

    The night's keys are indexed once (``KeyIndex``: sorted 64-bit numbers) and each part's
    keys looked up in it, so a part costs its own size: probing every night's key against each
    part (Arrow's ``index_in``, what this was) cost the night's keys times the cache's parts, 8 h
    at a billion log rows a week. The vectors found are written into the file as an array
    (a memory map), not one call each."""
    import numpy as np
    import pyarrow as pa

    n = len(keys)
    nights = np.zeros(n, dtype=np.int64)
    dim = None
    pool = pa.default_memory_pool()
    index = KeyIndex(keys)
    path.touch()
    mapped: np.memmap | None = None
    for written, table in cache.tables(["key", "vector"], _vector_part):
        found = _valid(table, dim, cache)
        del table
        if found is None or not len(found[0]):
            continue
        part_keys, vectors = found
        if dim is None:
            dim = vectors.shape[1]
            with open(path, "r+b") as out:
                out.truncate(n * dim * 4)  # holes read as zeros; written only where found
            mapped = np.memmap(path, dtype=np.float32, mode="r+", shape=(n, dim))
        assert mapped is not None
        rows, at = index.find(part_keys)  # the part's rows found, and their places tonight
        day = written.toordinal()
        later = nights[at] < day  # a later night's vector is kept
        rows, at = rows[later], at[later]
        mapped[at] = vectors[rows]
        nights[at] = day
        del found, part_keys, vectors
        # Arrow's allocator keeps what a part freed unless asked: 16 parts of 32,768 vectors
        # left the process 400 MB larger than what it held
        pool.release_unused()
    if mapped is not None:
        mapped.flush()
        del mapped
    cache.counts.found = int((nights > 0).sum())
    return nights, dim


# a byte's value as a hexadecimal digit; 255: not one
_HEX = bytes(int(chr(b), 16) if chr(b) in "0123456789abcdefABCDEF" else 255 for b in range(256))


def _prefixes(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each key as a 64-bit number: its first 16 hexadecimal digits (wording keys are sha256
    digests in hex: ``base/keys.py``), vectorized; any other key's 8-byte BLAKE2b digest, one at
    a time (none, but in a test or a damaged part). And which keys are there (not null)."""
    import hashlib

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    heads = pc.utf8_slice_codeunits(keys, 0, 16)
    ok = pc.fill_null(pc.equal(pc.binary_length(heads), 16), False)
    fixed = pc.if_else(ok, heads, "0" * 16).cast(pa.binary(16))
    if isinstance(fixed, pa.ChunkedArray):
        fixed = fixed.combine_chunks()
    data = np.frombuffer(fixed.buffers()[1], np.uint8)
    digits = data[fixed.offset * 16 : (fixed.offset + len(fixed)) * 16].reshape(-1, 16)
    nibbles = np.frombuffer(_HEX, np.uint8)[digits]
    hexed = ok.to_numpy(zero_copy_only=False) & (nibbles < 16).all(axis=1)
    value = np.zeros(len(fixed), dtype=np.uint64)
    for column in range(16):
        value = (value << np.uint64(4)) | (nibbles[:, column] & 15).astype(np.uint64)
    present = pc.is_valid(keys).to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(present & ~hexed).tolist():
        digest = hashlib.blake2b(str(keys[row]).encode(), digest_size=8).digest()
        value[row] = int.from_bytes(digest, "big")
    return value, present


class KeyIndex:
    """The night's keys, sorted once by their 64-bit number (``_prefixes``): a part's keys are
    found in it by binary search, each match checked whole (keys that share a number are all
    looked at)."""

    def __init__(self, keys: pa.Array) -> None:
        import numpy as np

        numbers, present = _prefixes(keys)
        self.keys = keys
        self.order = np.flatnonzero(present)[np.argsort(numbers[present], kind="stable")]
        self.sorted = numbers[self.order]

    def find(self, part_keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``part_keys`` that are night keys, and those keys' positions."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        numbers, present = _prefixes(part_keys)
        low = np.searchsorted(self.sorted, numbers, side="left")
        high = np.searchsorted(self.sorted, numbers, side="right")
        runs = np.where(present, high - low, 0)
        rows = np.repeat(np.arange(len(numbers)), runs)  # a row per candidate: almost always 1
        starts = np.repeat(low - np.cumsum(runs) + runs, runs)
        positions = self.order[starts + np.arange(len(rows))] if len(rows) else rows
        same = pc.equal(self.keys.take(pa.array(positions)), part_keys.take(pa.array(rows)))
        exact = same.to_numpy(zero_copy_only=False).astype(bool)
        return rows[exact], positions[exact]


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


def _valid(
    part: pa.Table, dim: int | None, cache: NightCache
) -> tuple[pa.Array, np.ndarray] | None:
    """The keys and vectors (rows of a 2-D fp32 array) of a cached part's rows whose vector may
    be used: fixed-size fp32 of the night's dimension, finite, of unit length (the rest are
    embedded again: ``counts.invalid``); the part copied only where a row is left out."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = part.schema.field("vector").type
    if dim is not None and kind.list_size != dim:
        cache.counts.invalid += len(part)
        return None
    present = pc.and_(pc.is_valid(part.column("vector")), pc.is_valid(part.column("key")))
    missing = len(part) - int(pc.sum(present).as_py() or 0)
    if missing:
        cache.counts.invalid += missing
        part = part.filter(present)
    keys = part.column("key").combine_chunks()
    values = part.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    values = values.reshape(len(part), kind.list_size)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(values, axis=1)
    good = np.isfinite(norms) & (np.abs(norms - 1.0) <= _TOLERANCE)
    if not good.all():
        cache.counts.invalid += int((~good).sum())
        keys, values = keys.filter(pa.array(good)), values[good]
    return keys, values


def _merged(
    cache: NightCache,
    keys: pa.Array,
    texts: Sequence[str],
    path: Path,
    nights: np.ndarray,
    dim: int | None,
    encoder: Callable[[], Encoder],
    progress: bool,
) -> Iterator[np.ndarray]:
    """Chunks of ``VECTOR_CHUNK`` vectors in position order: the cached ones read from ``path``
    and the embedded ones (the positions without one, embedded in order) side by side; the
    embedded ones, and the cached ones about to fall out, kept."""
    import numpy as np
    import pyarrow as pa

    n = len(keys)
    misses = np.flatnonzero(nights == 0)
    fresh = _Rows(iter(()))
    if len(misses):
        fresh = _Rows(iter(encoder()(Texts(texts).take(misses), progress)))
    with open(path, "rb") as stored:
        for start in range(0, n, VECTOR_CHUNK):
            end = min(n, start + VECTOR_CHUNK)
            lo, hi = np.searchsorted(misses, [start, end])
            new_rows = misses[lo:hi]
            new_vectors = fresh.take(len(new_rows))
            out_dim = new_vectors.shape[1] if len(new_rows) else dim
            hit_rows = np.setdiff1d(np.arange(start, end), new_rows, assume_unique=True)
            if len(hit_rows) and out_dim != dim:
                raise ValueError(
                    f"the embedder's vectors have {out_dim} dimensions, the cache's "
                    f"{dim}: {cache.prefix} holds another embedder's"
                )
            chunk = np.empty((end - start, out_dim or 0), dtype=np.float32)
            if len(hit_rows):
                assert dim is not None
                size = (end - start) * dim * 4
                block = np.frombuffer(os.pread(stored.fileno(), size, start * dim * 4), np.float32)
                chunk[:] = block.reshape(end - start, dim)
            if len(new_rows):
                chunk[new_rows - start] = new_vectors
            keep = [(new_rows, new_vectors)]
            old = np.asarray(
                [cache.stale(date.fromordinal(int(d))) for d in nights[hit_rows]], dtype=bool
            )
            if old.any():
                keep.append((hit_rows[old], chunk[hit_rows[old] - start]))
                cache.counts.rewritten += int(old.sum())
            for rows, vectors in keep:
                if len(rows):
                    cache.add(
                        pa.table(
                            {
                                "key": keys.take(pa.array(rows)),
                                "vector": pa.FixedSizeListArray.from_arrays(
                                    pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1]
                                ),
                            }
                        )
                    )
            cache.counts.computed += len(new_rows)
            yield chunk
    fresh.done()


class _Rows:
    """Vectors pulled from an iterator of 2-D arrays, ``k`` rows at a time: at most one pulled
    chunk beyond what is taken is held."""

    def __init__(self, chunks: Iterator[np.ndarray]) -> None:
        self._chunks = chunks
        self._held: list[np.ndarray] = []
        self._count = 0

    def take(self, k: int) -> np.ndarray:
        import numpy as np

        if k == 0:
            return np.zeros((0, 0), dtype=np.float32)
        while self._count < k:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                raise ValueError(f"{k - self._count} more vectors were expected") from None
            self._held.append(chunk)
            self._count += len(chunk)
        joined = np.concatenate(self._held)
        self._held = [joined[k:]] if len(joined) > k else []
        self._count -= k
        return np.ascontiguousarray(joined[:k], dtype=np.float32)

    def done(self) -> None:
        """Every row was taken and the iterator is spent (the embedder gave no extra vector)."""
        if self._count:
            raise ValueError(f"{self._count} vectors more than the wordings came")
        for _ in self._chunks:
            raise ValueError("more vectors than the wordings came")
