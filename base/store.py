"""One store interface over local folders (``file://``) and S3 (``s3://bucket/prefix``).

Paths inside a store are ``/``-separated and relative to its root. Objects are immutable by
convention except pointers (``current.json``), which change only through ``put_if``: a conditional
write that succeeds only when the pointer still has the ETag the writer read (S3 ``If-Match``, or
``If-None-Match: *`` for the first write; file stores compare under a file lock and replace by
rename). A lost race raises ``PreconditionFailedError``; the winner's write stands.

Bulk transfers (``put_many``, ``get_many``, ``delete_many``, ``delete_prefix``) keep
``concurrency`` requests in flight (``EDGEQA_S3_CONCURRENCY``, 128 by default; the S3 client's
connection pool is as large), a bounded number of items taken from their iterable at a time, so
a million objects are never a million futures; S3 deletes go in ``DeleteObjects`` batches of
1,000. ``put_new`` and ``put_many`` write an object only where none is (S3 ``If-None-Match: *``;
a file store links a written temporary file into place): what exists is never overwritten.
Listings are lazy (``scan``: S3's pages one at a time, a folder's names one folder at a time).

Transient failures (S3 5xx, throttling, dropped connections; ``EAGAIN``/``EIO`` on files) are
retried with exponential backoff and jitter, ``retries`` times. S3's endpoint comes from
``AWS_ENDPOINT_URL`` when set (boto3 reads it), credentials from the usual AWS environment.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from base.s3store import S3Store
from base.store_base import (
    COPY_CHUNK,
    DEFAULT_CONCURRENCY,
    DEFAULT_RETRIES,
    DELETE_BATCH,
    Listed,
    ObjectNotFoundError,
    ObjectTooLargeError,
    PreconditionFailedError,
    Source,
    Store,
    StoreError,
    T,
    Transfer,
    TransientStoreError,
    _bounded,
    _clean,
    _copy_bounded,
    backoff_s,
    bounded_map,
    parquet_bytes,
    parquet_table,
    sha256_hex,
    with_retries,
)

__all__ = [
    "COPY_CHUNK",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_RETRIES",
    "DELETE_BATCH",
    "FileStore",
    "Listed",
    "ObjectNotFoundError",
    "ObjectTooLargeError",
    "PreconditionFailedError",
    "S3Store",
    "Source",
    "Store",
    "StoreError",
    "Transfer",
    "TransientStoreError",
    "backoff_s",
    "bounded_map",
    "open_store",
    "parquet_bytes",
    "parquet_table",
    "sha256_hex",
    "with_retries",
]

_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EIO, errno.EBUSY, errno.EINTR}


def _file_call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except FileNotFoundError as error:
        raise ObjectNotFoundError(str(error)) from error
    except OSError as error:
        if error.errno in _TRANSIENT_ERRNOS:
            raise TransientStoreError(str(error)) from error
        raise StoreError(str(error)) from error


class FileStore(Store):
    """A local folder. Writes go to a temp file in the same folder, fsynced, then renamed."""

    def __init__(
        self, root: Path | str, retries: int = DEFAULT_RETRIES, concurrency: int = 8
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()
        self.retries = retries
        self.concurrency = concurrency  # a local disk: a few writers at once, not S3's hundreds

    def _path(self, path: str) -> Path:
        return self.root / _clean(path)

    def _write(self, target: Path, data: bytes | Path, replace: bool = True) -> bool:
        """``data``, or the file at that path (copied a block at a time), into ``target``
        through a temporary file: renamed over it (``replace``), or linked where no file is
        (atomic, and refused where one is: False, nothing written)."""
        temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        for attempt in range(3):  # a delete may take an empty folder between mkdir and open
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                handle = open(temp, "xb")
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        try:
            with handle as f:
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, f)
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(temp, target)
            else:
                os.link(temp, target)
            return True
        except FileExistsError:
            return False
        finally:
            temp.unlink(missing_ok=True)

    def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
        target = self._path(path)
        with_retries(lambda: _file_call(lambda: self._write(target, data)), self.retries)

    def put_file(self, path: str, local: Path, content_type: str | None = None) -> None:
        target, source = self._path(path), Path(local)
        with_retries(lambda: _file_call(lambda: self._write(target, source)), self.retries)

    def put_new(self, path: str, data: Source, content_type: str | None = None) -> bool:
        target = self._path(path)

        def create() -> bool:
            return not target.is_file() and self._write(target, data, replace=False)

        return with_retries(lambda: _file_call(create), self.retries)

    def get_with_etag(self, path: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        target = self._path(path)

        def read() -> bytes:
            with open(target, "rb") as f:
                return f.read() if max_bytes is None else f.read(max_bytes + 1)

        data = _bounded(with_retries(lambda: _file_call(read), self.retries), max_bytes, path)
        return data, sha256_hex(data)

    def get_file(self, path: str, local: Path, max_bytes: int | None = None) -> int:
        target = self._path(path)

        def copy() -> int:
            with open(target, "rb") as source, open(local, "wb") as out:
                return _copy_bounded(source.read, out, max_bytes, path)

        return with_retries(lambda: _file_call(copy), self.retries)

    def exists(self, path: str) -> bool:
        return self._path(path).is_file()

    def folders(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if _clean(prefix) else self.root
        if not base.is_dir():
            return []
        with os.scandir(base) as entries:
            return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))

    def scan(self, prefix: str = "") -> Iterator[Listed]:
        base = self._path(prefix) if _clean(prefix) else self.root
        if not base.is_dir():
            return
        root = str(self.root)
        # os.walk holds a folder's names; ``Path.rglob`` held a DirEntry for each of its files
        # and made a Path of each (a release's 500,000 answer objects: ~340 MB)
        for folder, subfolders, names in os.walk(base):
            subfolders.sort()
            relative = os.path.relpath(folder, root).replace(os.sep, "/")
            for name in sorted(names):
                if name.endswith((".tmp", ".lock")):
                    continue
                try:
                    status = os.stat(f"{folder}/{name}")
                except FileNotFoundError:  # deleted since the folder was read
                    continue
                path = name if relative == "." else f"{relative}/{name}"
                yield Listed(path, status.st_size, status.st_mtime)

    def delete(self, path: str) -> None:
        target = self._path(path)
        target.unlink(missing_ok=True)
        parent = target.parent
        while parent != self.root:
            try:
                parent.rmdir()  # only an empty folder; another delete may have taken it first
            except OSError:
                return
            parent = parent.parent

    def put_if(
        self, path: str, data: bytes, etag: str | None, cache_control: str | None = None
    ) -> str:
        from filelock import FileLock

        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target.parent / f".{target.name}.lock"), timeout=30):
            current = sha256_hex(target.read_bytes()) if target.is_file() else None
            if current != etag:
                raise PreconditionFailedError(
                    f"{self.uri}/{_clean(path)} changed since it was read "
                    f"(expected ETag {etag}, found {current})"
                )
            self._write(target, data)
        return sha256_hex(data)

    def child(self, prefix: str) -> FileStore:
        return FileStore(self._path(prefix), self.retries)


def open_store(uri: str, retries: int = DEFAULT_RETRIES, concurrency: int | None = None) -> Store:
    """``file:///abs/path``, ``file://./relative``, a plain path, or ``s3://bucket/prefix``.
    ``concurrency``: an S3 store's requests in flight in a bulk transfer (None:
    ``EDGEQA_S3_CONCURRENCY``)."""
    if not uri or not uri.strip():
        raise ValueError("store URI is empty")
    uri = uri.strip()
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URI {uri!r} names no bucket (s3://bucket/prefix)")
        if concurrency is None:
            from base.config import StoreSettings

            concurrency = StoreSettings.from_env().s3_concurrency
        return S3Store(parsed.netloc, parsed.path, retries, concurrency=concurrency)
    if parsed.scheme == "file":
        # file:///abs, file://./rel, file://rel
        path = unquote(parsed.netloc + parsed.path) if parsed.netloc else unquote(parsed.path)
        return FileStore(path, retries)
    if parsed.scheme == "":
        return FileStore(uri, retries)
    raise ValueError(f"store URI {uri!r}: scheme must be file:// or s3://")


# local files handed to a process at a time by ``put_files``
PROCESS_BATCH = 1_024


def put_files(
    store: Store, items: Iterable[tuple[str, Path, str | None]], processes: int
) -> Transfer:
    """``store.put_many`` of local files spread over ``processes`` processes, each opening the
    store again by its URI (its own client, ``concurrency`` requests in flight),
    ``PROCESS_BATCH`` files handed to each at a time as ``items`` are read (never all held);
    1: ``put_many`` here. A PUT costs its client ~2 ms of CPU, botocore building, signing and
    parsing it with the GIL held (measured: ``benchmarks/publish.py``), so one process writes
    at most ~500 objects a second whatever its threads."""
    if processes <= 1:
        return store.put_many(items)
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    source = iter(items)
    total = Transfer()
    opened = (store.uri, store.retries, store.concurrency)
    spawn = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with ProcessPoolExecutor(processes, mp_context=spawn) as pool:
        pending: set[Any] = set()  # futures of Transfers
        try:
            while True:
                while len(pending) < 2 * processes and (
                    batch := [(p, str(f), k) for p, f, k in islice(source, PROCESS_BATCH)]
                ):
                    pending.add(pool.submit(_put_batch, opened, batch))
                if not pending:
                    return total
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    total.add(future.result())
        except BaseException:
            for future in pending:  # what has not started is not started
                future.cancel()
            raise


_OPENED: dict[tuple[str, int, int], Store] = {}  # a ``put_files`` process's store, opened once


def _put_batch(opened: tuple[str, int, int], batch: list[tuple[str, str, str | None]]) -> Transfer:
    """In a ``put_files`` process: ``batch``'s files written to the store ``opened`` names."""
    if opened not in _OPENED:
        uri, retries, concurrency = opened
        _OPENED[opened] = open_store(uri, retries, concurrency)
    return _OPENED[opened].put_many((path, Path(file), kind) for path, file, kind in batch)
