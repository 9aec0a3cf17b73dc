"""``s3://bucket/prefix`` through boto3 (``store_base.Store``'s interface; ``open_store`` in
``store.py`` opens one): conditional writes, bulk transfers on a connection pool as large as the
requests in flight, ``DeleteObjects`` batches, lazy listings page by page."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from base.store_base import (
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
    TransientStoreError,
    _bounded,
    _clean,
    _copy_bounded,
    bounded_map,
    with_retries,
)

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
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        self.bucket = bucket
        self.prefix = _clean(prefix)
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.retries = retries
        self.concurrency = concurrency
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
                    # as many connections as requests in flight: botocore's default pool of 10
                    # would queue the rest
                    max_pool_connections=concurrency,
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

    def folders(self, prefix: str = "") -> list[str]:
        """A delimited listing: a page holds up to 1,000 folder names."""
        full = self._key(prefix) if _clean(prefix) else self.prefix
        full = f"{full}/" if full else ""
        found: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page: dict[str, Any] = self._call(
                lambda kw=kwargs: self.client.list_objects_v2(**kw),  # type: ignore[misc]
                prefix,
            )
            found += [p["Prefix"][len(full) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
            if not page.get("IsTruncated"):
                return sorted(found)
            token = page["NextContinuationToken"]

    def scan(self, prefix: str = "") -> Iterator[Listed]:
        """A page (1,000 keys) asked for at a time, as the caller reaches it."""
        full = self._key(prefix) if _clean(prefix) else self.prefix
        full = f"{full}/" if full else ""
        strip = len(self.prefix) + 1 if self.prefix else 0
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
                modified = item.get("LastModified")
                stamp = modified.timestamp() if modified is not None else 0.0
                yield Listed(item["Key"][strip:], int(item.get("Size", 0)), stamp)
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def delete(self, path: str) -> None:
        self._call(lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(path)), path)

    def delete_many(self, paths: Iterable[str]) -> int:
        """``DeleteObjects`` batches of 1,000 keys, ``concurrency`` batches in flight; a key the
        batch could not delete for a transient reason is tried again in its own batch."""

        def batch(chunk: list[str]) -> int:
            keys = [{"Key": self._key(path)} for path in chunk]

            def once() -> None:
                response = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True}
                )
                errors = response.get("Errors") or []
                if errors:
                    first = errors[0]
                    code = str(first.get("Code", ""))
                    failed = {e.get("Key") for e in errors}
                    keys[:] = [k for k in keys if k["Key"] in failed]  # a retry asks only these
                    if code in _TRANSIENT_CODES or code.startswith("5"):
                        raise TransientStoreError(f"{self.uri}: {first.get('Key')}: {code}")
                    raise StoreError(f"{self.uri}: deleting {first.get('Key')}: {code}")

            self._call(once, chunk[0])
            return len(chunk)

        def chunks() -> Iterator[list[str]]:
            source = iter(paths)
            while chunk := list(islice(source, DELETE_BATCH)):
                yield chunk

        return sum(bounded_map(batch, chunks(), max(1, self.concurrency // 8)))

    def put_new(self, path: str, data: Source, content_type: str | None = None) -> bool:
        extra = {"ContentType": content_type} if content_type else {}

        def write() -> bool:
            try:
                if isinstance(data, Path):
                    with open(data, "rb") as body:  # streamed; a retry opens it again
                        self.client.put_object(
                            Bucket=self.bucket,
                            Key=self._key(path),
                            Body=body,
                            IfNoneMatch="*",
                            **extra,
                        )
                else:
                    self.client.put_object(
                        Bucket=self.bucket,
                        Key=self._key(path),
                        Body=data,
                        IfNoneMatch="*",
                        **extra,
                    )
            except Exception as error:  # sorted by _call; a 412 is an answer here
                if _precondition(error) == "412":
                    return False
                if _precondition(error) == "409":  # another conditional write of it in progress
                    raise TransientStoreError(f"{self.uri}/{_clean(path)}: 409") from error
                raise
            return True

        return self._call(write, path)

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
        return S3Store(self.bucket, self._key(prefix), self.retries, self.client, self.concurrency)


def _precondition(error: Exception) -> str | None:
    """``"412"`` when a botocore error is S3 refusing a conditional write (the object is there),
    ``"409"`` when another conditional write of the same key is in progress (AWS: retry), else
    None."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    code = str(response.get("Error", {}).get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    if code in ("PreconditionFailed", "412") or status == "412":
        return "412"
    if code == "ConditionalRequestConflict" or status == "409":
        return "409"
    return None
