"""The store interface every store implements (``store.py``: a folder; ``s3store.py``: S3),
with its errors, its retries and the bounded worker pool bulk transfers run on. Import it from
``base.store``, which re-exports it and opens a store by URI (``open_store``)."""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from base.errors import EdgeQAError

T = TypeVar("T")

DEFAULT_RETRIES = 4
DEFAULT_CONCURRENCY = 128  # EDGEQA_S3_CONCURRENCY's default (base/config.py StoreSettings)
DELETE_BATCH = 1000  # keys a DeleteObjects request takes at most


class StoreError(EdgeQAError, RuntimeError):
    """A store operation failed for good (after retries, or for a reason retrying cannot fix)."""


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The object does not exist."""


class PreconditionFailedError(StoreError):
    """A conditional write lost: the object changed (or appeared) since it was read."""


class TransientStoreError(StoreError):
    """A failure worth retrying."""


class ObjectTooLargeError(StoreError):
    """The object is larger than the reader allows (``max_bytes``); it was not read whole."""


def _bounded(data: bytes, max_bytes: int | None, path: str) -> bytes:
    if max_bytes is not None and len(data) > max_bytes:
        raise ObjectTooLargeError(f"{path} is larger than {max_bytes} bytes")
    return data


COPY_CHUNK = 1 << 20  # bytes read at a time when an object is written to a local file


def _copy_bounded(
    read: Callable[[int], bytes], out: BinaryIO, max_bytes: int | None, path: str
) -> int:
    """What ``read`` gives, a chunk at a time, written to ``out``; ``ObjectTooLargeError`` once
    past ``max_bytes`` (read no further); the bytes written."""
    written = 0
    while chunk := read(COPY_CHUNK):
        written += len(chunk)
        if max_bytes is not None and written > max_bytes:
            raise ObjectTooLargeError(f"{path} is larger than {max_bytes} bytes")
        out.write(chunk)
    return written


def backoff_s(attempt: int, base_s: float = 0.05) -> float:
    """Exponential backoff with jitter: the seconds to wait before retry ``attempt`` (from 0)."""
    return base_s * (2**attempt) * (0.5 + random.random())


def with_retries(fn: Callable[[], T], retries: int, base_s: float = 0.05) -> T:
    """Call ``fn``, retrying ``TransientStoreError`` up to ``retries`` times with backoff."""
    attempt = 0
    while True:
        try:
            return fn()
        except TransientStoreError:
            if attempt >= retries:
                raise
            time.sleep(backoff_s(attempt, base_s))
            attempt += 1


U = TypeVar("U")


def bounded_map(
    fn: Callable[[T], U], items: Iterable[T], workers: int, ahead: int = 4
) -> Iterator[U]:
    """``fn`` of each item, ``workers`` at a time, the results in the items' order; at most
    ``workers * ahead`` items taken from ``items`` and not yet handed back at once. An exception
    of ``fn`` is raised where its result would be."""
    if workers <= 1:
        yield from map(fn, items)
        return
    waiting: deque[Future[U]] = deque()
    source = iter(items)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for item in source:
                waiting.append(pool.submit(fn, item))
                if len(waiting) >= workers * ahead:
                    yield waiting.popleft().result()
            while waiting:
                yield waiting.popleft().result()
        finally:
            for future in waiting:
                future.cancel()


@dataclass(frozen=True)
class Listed:
    """An object a listing found: its path, size and when it was last written (epoch s)."""

    path: str
    size: int
    modified: float


@dataclass
class Transfer:
    """What a bulk write did: objects written, objects that were there already, bytes sent."""

    written: int = 0
    existed: int = 0
    bytes: int = 0

    def add(self, other: Transfer) -> None:
        self.written += other.written
        self.existed += other.existed
        self.bytes += other.bytes


Source = bytes | Path  # an object's bytes, or a local file holding them


def _size(data: Source) -> int:
    return len(data) if isinstance(data, bytes) else Path(data).stat().st_size


def _clean(path: str) -> str:
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"store path {path!r} must not contain '..'")
    return "/".join(parts)


def parquet_table(data: bytes, columns: list[str] | None = None) -> Any:
    """A Parquet file read from the store, as a ``pyarrow.Table`` (only ``columns``, if given:
    the others are not decoded), decoded on this thread: pyarrow's decoding threads can abort a
    process at exit ("terminate called without an active exception", apache/arrow#34314; 6 of
    10 runs of ``edgeqa release show`` here)."""
    import io

    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(data), columns=columns, use_threads=False)


def parquet_bytes(table: Any, compression: str = "snappy") -> bytes:
    """``table`` (a ``pyarrow.Table``) as the bytes of a Parquet file, to put in the store."""
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression=compression)
    return buffer.getvalue()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Store:
    """The interface; ``open_store(uri)`` returns a ``FileStore`` or an ``S3Store``."""

    uri: str
    retries: int = DEFAULT_RETRIES
    concurrency: int = DEFAULT_CONCURRENCY

    def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
        raise NotImplementedError

    def put_new(self, path: str, data: Source, content_type: str | None = None) -> bool:
        """Write ``data`` (bytes, or a local file's) only where no object is: True when written,
        False when one was there already (left as it is: objects are never overwritten)."""
        raise NotImplementedError

    def put_many(self, items: Iterable[tuple[str, Source, str | None]]) -> Transfer:
        """``put_new`` of each (path, data, content type), ``concurrency`` at a time."""

        def one(item: tuple[str, Source, str | None]) -> Transfer:
            path, data, kind = item
            written = self.put_new(path, data, kind)
            return Transfer(int(written), int(not written), _size(data) if written else 0)

        total = Transfer()
        for done in bounded_map(one, items, self.concurrency):
            total.add(done)
        return total

    def get_many(
        self, paths: Iterable[str], max_bytes: int | None = None
    ) -> Iterator[tuple[str, bytes | StoreError]]:
        """(path, its bytes or the ``StoreError`` reading it raised) for each of ``paths``, in
        order, ``concurrency`` read at a time."""

        def one(path: str) -> tuple[str, bytes | StoreError]:
            try:
                return path, self.get(path, max_bytes)
            except StoreError as error:
                return path, error

        return bounded_map(one, paths, self.concurrency)

    def delete_many(self, paths: Iterable[str]) -> int:
        """Delete every one of ``paths`` (missing ones are no error); how many were asked."""

        def one(path: str) -> int:
            self.delete(path)
            return 1

        return sum(bounded_map(one, paths, self.concurrency))

    def get(self, path: str, max_bytes: int | None = None) -> bytes:
        return self.get_with_etag(path, max_bytes)[0]

    def get_with_etag(self, path: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        """The object and its ETag; ``ObjectTooLargeError`` past ``max_bytes`` (read no further)."""
        raise NotImplementedError

    def get_file(self, path: str, local: Path, max_bytes: int | None = None) -> int:
        """The object written to the file ``local`` (replaced), a chunk at a time where the
        store can (a shard's index is up to 1 GiB), never past ``max_bytes``
        (``ObjectTooLargeError``); the bytes written."""
        data = self.get(path, max_bytes)
        Path(local).write_bytes(data)
        return len(data)

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def scan(self, prefix: str = "") -> Iterator[Listed]:
        """Every object under the folder ``prefix`` (recursively), lazily, in the store's order
        (S3: key order; a folder: one subfolder at a time, names sorted within it)."""
        raise NotImplementedError

    def folders(self, prefix: str = "") -> list[str]:
        """The names of the folders directly under the folder ``prefix``, sorted: one listing
        of names, not of everything under them (a release's million objects)."""
        start = len(_clean(prefix)) + 1 if _clean(prefix) else 0
        return sorted(
            {f.path[start:].split("/", 1)[0] for f in self.scan(prefix) if "/" in f.path[start:]}
        )

    def list(self, prefix: str = "") -> list[str]:
        """Every object path under the folder ``prefix`` (recursively), sorted."""
        return sorted(found.path for found in self.scan(prefix))

    def delete(self, path: str) -> None:
        raise NotImplementedError

    def put_if(
        self, path: str, data: bytes, etag: str | None, cache_control: str | None = None
    ) -> str:
        """Write ``data`` only if the object's ETag is still ``etag`` (``None``: it must not
        exist). Returns the new ETag; raises ``PreconditionFailedError`` otherwise.
        ``cache_control``: the ``Cache-Control`` the object is served with (on S3, and through
        the CDN in front of it; a folder has no headers).

        Tried once, never retried here: a write that committed but whose response was lost would
        fail its own retry's precondition and look like a lost race. ``TransientStoreError`` means
        the outcome is unknown; the caller settles it by reading the object back."""
        raise NotImplementedError

    def put_file(self, path: str, local: Path, content_type: str | None = None) -> None:
        self.put(path, Path(local).read_bytes(), content_type)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under the folder ``prefix`` as the listing finds them (deletes in
        bulk, never the whole listing held); how many."""
        return self.delete_many(found.path for found in self.scan(prefix))

    def child(self, prefix: str) -> Store:
        """The same store rooted at ``prefix``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
