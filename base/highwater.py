"""The high-water mark: the highest pointer and revocation-list sequences ever signed, kept
outside the store, where only the signer writes.

A signed ``current.json`` and a signed revocation list protect what they say, not that they are
the newest: whoever can write the bucket can put back an older, validly signed pair (a release
from before a revocation, the list from before it). Readers that saw the newer ones refuse the
old (``pointers.PointerMemory``), but a reader started fresh, and the nightly job that signs the
next release on top of what it reads, would take them. So every signer records, after each
write it signs, the sequence it signed here, and every signer and every reader started fresh
refuses a pointer or a list below it (``HighWaterError``, naming both numbers): nothing is
signed on top of a rolled-back store, and a fresh edge serves nothing rather than the old
release.

Where the mark lives (``EDGEQA_HIGH_WATER_URI``):

- ``dynamodb://TABLE``: one item per profile (``profile`` its key; ``pointer`` and
  ``revocations`` numbers), each raised by a conditional update (``x < :new``): concurrent
  signers never lower it. Terraform's ``signing`` module makes the table; only the signing role
  may write it, the edge and the origin may read it.
- ``ssm://PREFIX``: one String parameter per profile, ``/PREFIX/<profile>``, holding
  ``{"pointer": N, "revocations": N}``. SSM has no conditional write: a raise reads, compares and
  writes, so two signers racing may keep the lower of their two raises (the next signature
  raises it again); prefer DynamoDB where signers run concurrently.
- ``file:///path/marks.json``: a local run's, a JSON object by profile, raised under a file lock.

Raised after the write it records has landed (a failed flip raises nothing), never lowered. A
mark that cannot be read is an error, never zero: readers and signers stop rather than trust the
store alone. Recovering from a store-side rollback: put the newest objects back (the bucket
keeps object versions), or sign a new pointer with ``edgeqa release rollback VERSION``,
which signs above the mark.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlparse

from base.pointers import MAX_SEQUENCE, Pointer, RollbackError, verify_pointer
from base.signing import SignatureError

SCHEMES: Final = ("file", "ssm", "dynamodb")
FIELDS: Final = ("pointer", "revocations")
MAX_MARKS_BYTES = 1 << 20


class HighWaterError(RollbackError):
    """A pointer or revocation list below the sequence already signed, or a mark that cannot be
    read or written."""


@dataclass(frozen=True)
class Marks:
    """The highest sequences signed for one profile (0: none recorded)."""

    pointer: int = 0
    revocations: int = 0

    @classmethod
    def of(cls, found: Any, where: str) -> Marks:
        if not isinstance(found, dict):
            raise HighWaterError(f"the high-water mark at {where} is not an object")
        values = {}
        for name in FIELDS:
            value = found.get(name, 0)
            if type(value) is not int or not 0 <= value <= MAX_SEQUENCE:
                raise HighWaterError(f"the high-water mark at {where}: {name} is not a sequence")
            values[name] = value
        return cls(**values)


class HighWater(Protocol):
    """Where one deployment's marks are kept (``open_high_water``)."""

    uri: str

    def read(self, profile: str) -> Marks: ...

    def raise_to(self, profile: str, field: str, sequence: int) -> None:
        """Record ``sequence`` as ``field``'s mark unless one as high is recorded already."""


def _checked(field: str, sequence: int) -> None:
    if field not in FIELDS:
        raise ValueError(f"no high-water field {field!r}")
    if type(sequence) is not int or not 1 <= sequence <= MAX_SEQUENCE:
        raise ValueError(f"{sequence!r} is not a sequence")


class FileHighWater:
    """Marks in a local JSON file (``file://``), raised under an exclusive lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uri = path.as_uri()
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        try:
            with self.path.open("rb") as found:
                data = found.read(MAX_MARKS_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as error:
            raise HighWaterError(f"cannot read the high-water mark {self.path}: {error}") from None
        try:
            if len(data) > MAX_MARKS_BYTES:
                raise ValueError(f"over {MAX_MARKS_BYTES} bytes")
            marks = json.loads(data)
            if not isinstance(marks, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError) as error:
            raise HighWaterError(f"the high-water mark {self.path} is damaged: {error}") from None
        return marks

    def read(self, profile: str) -> Marks:
        return Marks.of(self._load().get(profile, {}), f"{self.uri} ({profile})")

    def raise_to(self, profile: str, field: str, sequence: int) -> None:
        _checked(field, sequence)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock, open(f"{self.path}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                marks = self._load()
                entry = {**Marks.of(marks.get(profile, {}), self.uri).__dict__}
                if entry[field] >= sequence:
                    return
                marks[profile] = {**entry, field: sequence}
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    json.dump(marks, out, sort_keys=True)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
        except OSError as error:
            raise HighWaterError(
                f"cannot record the high-water mark {self.path}: {error}"
            ) from None


class SsmHighWater:
    """Marks in SSM String parameters, ``/<prefix>/<profile>`` (``ssm://``)."""

    def __init__(self, prefix: str, client: Any = None) -> None:
        self.prefix = "/" + prefix.strip("/")
        self.uri = f"ssm:/{self.prefix}"
        self._client = client or _client("ssm", self.uri)

    def _name(self, profile: str) -> str:
        return f"{self.prefix}/{profile}"

    def read(self, profile: str) -> Marks:
        from botocore.exceptions import BotoCoreError, ClientError

        name = self._name(profile)
        try:
            found = self._client.get_parameter(Name=name)["Parameter"]["Value"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ParameterNotFound":
                return Marks()
            raise HighWaterError(f"cannot read the high-water mark {name}: {error}") from None
        except BotoCoreError as error:
            raise HighWaterError(f"cannot read the high-water mark {name}: {error}") from None
        try:
            return Marks.of(json.loads(found), name)
        except (ValueError, RecursionError) as error:
            raise HighWaterError(f"the high-water mark {name} is damaged: {error}") from None

    def raise_to(self, profile: str, field: str, sequence: int) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        _checked(field, sequence)
        marks = self.read(profile)
        if getattr(marks, field) >= sequence:
            return
        value = json.dumps({**marks.__dict__, field: sequence}, sort_keys=True)
        try:
            self._client.put_parameter(
                Name=self._name(profile), Value=value, Type="String", Overwrite=True
            )
        except (BotoCoreError, ClientError) as error:
            raise HighWaterError(
                f"cannot record the high-water mark {self._name(profile)}: {error}"
            ) from None


class DynamoHighWater:
    """Marks in a DynamoDB table, one item per profile, raised by conditional updates
    (``dynamodb://``)."""

    def __init__(self, table: str, client: Any = None) -> None:
        self.table = table
        self.uri = f"dynamodb://{table}"
        self._client = client or _client("dynamodb", self.uri)

    def read(self, profile: str) -> Marks:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            item = self._client.get_item(
                TableName=self.table, Key={"profile": {"S": profile}}, ConsistentRead=True
            ).get("Item")
        except (BotoCoreError, ClientError) as error:
            raise HighWaterError(f"cannot read the high-water mark {self.uri}: {error}") from None
        found: dict[str, Any] = {}
        for name in FIELDS:
            if item and name in item:
                try:
                    found[name] = int(item[name]["N"])
                except (KeyError, TypeError, ValueError):
                    raise HighWaterError(
                        f"{self.uri} ({profile}): {name} is not a number"
                    ) from None
        return Marks.of(found, f"{self.uri} ({profile})")

    def raise_to(self, profile: str, field: str, sequence: int) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        _checked(field, sequence)
        try:
            self._client.update_item(
                TableName=self.table,
                Key={"profile": {"S": profile}},
                UpdateExpression="SET #f = :v",
                ConditionExpression="attribute_not_exists(#f) OR #f < :v",
                ExpressionAttributeNames={"#f": field},
                ExpressionAttributeValues={":v": {"N": str(sequence)}},
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return  # one as high is recorded already
            raise HighWaterError(f"cannot record the high-water mark {self.uri}: {error}") from None
        except BotoCoreError as error:
            raise HighWaterError(f"cannot record the high-water mark {self.uri}: {error}") from None


def _client(service: str, uri: str) -> Any:
    """boto3's client of ``service``; ``HighWaterError`` naming ``uri`` when it cannot be made
    (no region configured, say)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.client(service)
    except BotoCoreError as error:
        raise HighWaterError(f"cannot reach the high-water mark {uri}: {error}") from None


def parse_high_water(uri: str) -> tuple[str, str] | None:
    """(scheme, the file's path, the parameter prefix or the table) of ``uri``; None for "";
    ``ValueError`` naming what is wrong with any other."""
    uri = uri.strip()
    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise ValueError(f"{uri!r:.200} is not a file://, ssm:// or dynamodb:// URI")
    if parsed.scheme == "file":
        if parsed.netloc or not parsed.path.startswith("/") or parsed.path.endswith("/"):
            raise ValueError(f"{uri!r:.200}: a file:// high-water mark names an absolute file")
        return "file", parsed.path
    name = (parsed.netloc + parsed.path).strip("/")
    if not name:
        raise ValueError(f"{uri!r:.200} names no {parsed.scheme} table or parameter")
    if parsed.scheme == "dynamodb" and "/" in name:
        raise ValueError(f"{uri!r:.200}: a dynamodb:// high-water mark names one table")
    return parsed.scheme, name


def open_high_water(uri: str) -> HighWater | None:
    """The marks ``uri`` names (``EDGEQA_HIGH_WATER_URI``, ``parse_high_water``); None for ""."""
    parsed = parse_high_water(uri)
    if parsed is None:
        return None
    scheme, name = parsed
    if scheme == "file":
        return FileHighWater(Path(name))
    return SsmHighWater(name) if scheme == "ssm" else DynamoHighWater(name)


def refuse_below(what: str, sequence: int, mark: int, uri: str) -> None:
    """``HighWaterError`` when ``what`` (sequence ``sequence``) is below ``mark``."""
    if sequence < mark:
        raise HighWaterError(
            f"{what} has sequence {sequence}, below the high-water mark {mark} recorded at {uri}: "
            "the store was rolled back (or written by another signer); refused, nothing signed"
        )


def checked_sequence(
    pointer: Pointer | None,
    profile: str,
    public_keys: tuple[str, ...],
    high_water: HighWater | None,
) -> int:
    """The signed sequence of ``pointer``, the current one a signer replaces or builds on (0: none,
    or none ``public_keys`` verify): ``HighWaterError`` once a mark is recorded for ``profile``
    and the pointer is missing, does not verify, or is below it."""
    mark = high_water.read(profile).pointer if high_water is not None else 0
    uri = high_water.uri if high_water is not None else ""
    what = f"{profile}/current.json"
    if pointer is None:
        refuse_below(f"{what} (missing)", 0, mark, uri)
        return 0
    what = f"{what} ({pointer.version})"
    if not public_keys:
        refuse_below(f"{what}, not verified (no public keys)", 0, mark, uri)
        return 0
    try:
        sequence = verify_pointer(pointer, profile, public_keys).sequence
    except SignatureError as error:
        refuse_below(f"{what}, which does not verify ({error})", 0, mark, uri)
        return 0
    refuse_below(what, sequence, mark, uri)
    return sequence


def list_floor_of(high_water: HighWater | None, profile: str, floor: int = 0) -> int:
    """The lowest revocation-list sequence a signer or a build may take for ``profile``: the
    mark's, or ``floor`` (the list the current release was built with) when higher."""
    mark = high_water.read(profile).revocations if high_water is not None else 0
    return max(mark, floor)
