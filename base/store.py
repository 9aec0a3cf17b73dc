"""One store interface over local folders (``file://``) and S3 (``s3://bucket/prefix``).

Paths inside a store are ``/``-separated and relative to its root. Objects are immutable by
convention except pointers (``current.json``), which change only through ``put_if``: a conditional
write that succeeds only when the pointer still has the ETag the writer read (S3 ``If-Match``, or
``If-None-Match: *`` for the first write; file stores compare under a file lock and replace by
rename). A lost race raises ``PreconditionFailedError``; the winner's write stands.

Transient failures (S3 5xx, throttling, dropped connections; ``EAGAIN``/``EIO`` on files) are
retried with exponential backoff and jitter, ``retries`` times. S3's endpoint comes from
``AWS_ENDPOINT_URL`` when set (boto3 reads it), credentials from the usual AWS environment.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import unquote, urlparse

from base.errors import EdgeQAError

T = TypeVar("T")

DEFAULT_RETRIES = 4


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

    def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
        raise NotImplementedError

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

    def list(self, prefix: str = "") -> list[str]:
        """Every object path under the folder ``prefix`` (recursively), sorted."""
        raise NotImplementedError

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
        paths = self.list(prefix)
        for path in paths:
            self.delete(path)
        return len(paths)

    def child(self, prefix: str) -> Store:
        """The same store rooted at ``prefix``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


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

    def __init__(self, root: Path | str, retries: int = DEFAULT_RETRIES) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()
        self.retries = retries

    def _path(self, path: str) -> Path:
        return self.root / _clean(path)

    def _write(self, target: Path, data: bytes | Path) -> None:
        """``data``, or the file at that path (copied a block at a time), into ``target``."""
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        try:
            with open(temp, "wb") as f:
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, f)
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)

    def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
        target = self._path(path)
        with_retries(lambda: _file_call(lambda: self._write(target, data)), self.retries)

    def put_file(self, path: str, local: Path, content_type: str | None = None) -> None:
        target, source = self._path(path), Path(local)
        with_retries(lambda: _file_call(lambda: self._write(target, source)), self.retries)

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

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if _clean(prefix) else self.root
        if not base.is_dir():
            return []
        found = []
        root = str(self.root)
        # os.walk holds a folder's names; ``Path.rglob`` held a DirEntry for each of its files
        # and made a Path of each (a staged release's 500,000 answer objects: ~340 MB)
        for folder, _, names in os.walk(base):
            relative = os.path.relpath(folder, root).replace(os.sep, "/")
            for name in names:
                if not name.endswith((".tmp", ".lock")) and os.path.isfile(f"{folder}/{name}"):
                    found.append(name if relative == "." else f"{relative}/{name}")
        found.sort()
        return found

    def delete(self, path: str) -> None:
        target = self._path(path)
        target.unlink(missing_ok=True)
        parent = target.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
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


_TRANSIENT_CODES = {
    "500",
    "502",
    "503",
    "504",
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
}


class S3Store(Store):
    """``s3://bucket/prefix`` through boto3 (endpoint from ``AWS_ENDPOINT_URL`` when set)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        retries: int = DEFAULT_RETRIES,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = _clean(prefix)
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.retries = retries
        if client is None:
            import boto3
            from botocore.config import Config

            # retries are ours (uniform across stores, and testable); botocore tries once
            client = boto3.client(
                "s3",
                config=Config(
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    connect_timeout=5,
                    read_timeout=60,
                ),
            )
        self.client = client

    def _key(self, path: str) -> str:
        path = _clean(path)
        return f"{self.prefix}/{path}" if self.prefix else path

    def _call(self, fn: Callable[[], T], path: str, retries: int | None = None) -> T:
        from botocore.exceptions import BotoCoreError, ClientError, ConnectionError

        def attempt() -> T:
            try:
                return fn()
            except ClientError as error:
                code = str(error.response.get("Error", {}).get("Code", ""))
                status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
                if code in ("NoSuchKey", "404", "NotFound"):
                    raise ObjectNotFoundError(f"{self.uri}/{_clean(path)} does not exist") from None
                if code in ("PreconditionFailed", "412") or status == "412":
                    raise PreconditionFailedError(
                        f"{self.uri}/{_clean(path)} changed since it was read"
                    ) from None
                if code in ("ConditionalRequestConflict", "409"):
                    raise PreconditionFailedError(
                        f"{self.uri}/{_clean(path)}: a concurrent conditional write is in progress"
                    ) from None
                if code in _TRANSIENT_CODES or status.startswith("5"):
                    raise TransientStoreError(f"{self.uri}/{_clean(path)}: {code}") from error
                raise StoreError(f"{self.uri}/{_clean(path)}: {code}: {error}") from error
            except (ConnectionError, BotoCoreError) as error:
                raise TransientStoreError(f"{self.uri}/{_clean(path)}: {error}") from error

        return with_retries(attempt, self.retries if retries is None else retries)

    def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
        extra = {"ContentType": content_type} if content_type else {}
        self._call(
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=self._key(path), Body=data, **extra
            ),
            path,
        )

    def get_with_etag(self, path: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        where = f"{self.uri}/{_clean(path)}"

        def fetch() -> tuple[bytes, str]:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
            body = response["Body"]
            try:
                if max_bytes is not None and response.get("ContentLength", 0) > max_bytes:
                    raise ObjectTooLargeError(f"{where} is larger than {max_bytes} bytes")
                data = body.read() if max_bytes is None else body.read(max_bytes + 1)
            finally:
                body.close()
            return _bounded(data, max_bytes, where), response["ETag"]

        return self._call(fetch, path)

    def get_file(self, path: str, local: Path, max_bytes: int | None = None) -> int:
        where = f"{self.uri}/{_clean(path)}"

        def fetch() -> int:  # a retry writes the file again from its start
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
            body = response["Body"]
            try:
                if max_bytes is not None and response.get("ContentLength", 0) > max_bytes:
                    raise ObjectTooLargeError(f"{where} is larger than {max_bytes} bytes")
                with open(local, "wb") as out:
                    return _copy_bounded(body.read, out, max_bytes, where)
            finally:
                body.close()

        return self._call(fetch, path)

    def exists(self, path: str) -> bool:
        try:
            self._call(
                lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(path)), path
            )
        except ObjectNotFoundError:
            return False
        return True

    def _iter_keys(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix) if _clean(prefix) else self.prefix
        full = f"{full}/" if full else ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            page: dict[str, Any] = self._call(
                lambda kw=kwargs: self.client.list_objects_v2(**kw),  # type: ignore[misc]
                prefix,
            )
            for item in page.get("Contents", []):
                yield item["Key"]
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def list(self, prefix: str = "") -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        return sorted(key[strip:] for key in self._iter_keys(prefix))

    def delete(self, path: str) -> None:
        self._call(lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(path)), path)

    def put_if(
        self, path: str, data: bytes, etag: str | None, cache_control: str | None = None
    ) -> str:
        extra = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        if cache_control is not None:
            extra["CacheControl"] = cache_control

        def write() -> str:
            response = self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(path),
                Body=data,
                ContentType="application/json",
                **extra,
            )
            return str(response["ETag"])

        return self._call(write, path, retries=0)

    def put_file(self, path: str, local: Path, content_type: str | None = None) -> None:
        from boto3.s3.transfer import TransferConfig

        extra = {"ContentType": content_type} if content_type else None
        config = TransferConfig(multipart_threshold=64 * 1024 * 1024)
        self._call(
            lambda: self.client.upload_file(
                str(local), self.bucket, self._key(path), ExtraArgs=extra, Config=config
            ),
            path,
        )

    def child(self, prefix: str) -> S3Store:
        return S3Store(self.bucket, self._key(prefix), self.retries, self.client)


def open_store(uri: str, retries: int = DEFAULT_RETRIES) -> Store:
    """``file:///abs/path``, ``file://./relative``, a plain path, or ``s3://bucket/prefix``."""
    if not uri or not uri.strip():
        raise ValueError("store URI is empty")
    uri = uri.strip()
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"store URI {uri!r} names no bucket (s3://bucket/prefix)")
        return S3Store(parsed.netloc, parsed.path, retries)
    if parsed.scheme == "file":
        # file:///abs, file://./rel, file://rel
        path = unquote(parsed.netloc + parsed.path) if parsed.netloc else unquote(parsed.path)
        return FileStore(path, retries)
    if parsed.scheme == "":
        return FileStore(uri, retries)
    raise ValueError(f"store URI {uri!r}: scheme must be file:// or s3://")
