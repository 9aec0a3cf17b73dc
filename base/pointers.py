"""The signed pointer: which release is current, in what order, and until when it is fresh.

A release's own statement (``signing.py``) proves what a release holds, forever: on its own it
would let anyone who can write the store put back an older, validly signed ``current.json`` — a
release from before a revocation — and every reader would serve it again (a *rollback*), or keep
the store on one release for ever (a *freeze*). So the pointer is signed at every flip, by the
same keys, as a statement of its own (TUF's timestamp role, for one file):

    {"answers_root", "format": "edgeqa-pointer/1", "manifest_sha256", "not_after", "profile",
     "sequence", "version"}

- ``sequence`` grows with every pointer signed (a publish, a revocation's release, a rollback,
  ``edgeqa release renew``): the signing time in milliseconds since 1970, or the previous
  verified pointer's plus one when that is higher, so it keeps growing even when the pointer read
  before signing was itself rolled back. Every reader remembers the highest sequence it verified
  (``PointerMemory``: the edge and the origin in memory and on local disk, the web client in
  ``localStorage``, the Python client in its state) and refuses a lower one: a rollback is refused
  by every reader that has seen the newer pointer, including after a restart.
- ``not_after`` is when the pointer goes stale (``EDGEQA_POINTER_EXPIRES_S`` after signing; the
  nightly publish renews it). Past it, the edge and the origin still serve their release (they
  are the layers that must answer) but report it stale on ``/health`` and in metrics; browsers and
  the Python client skip the CDN for it (the edge and the origin answer instead).
- ``manifest_sha256`` and ``answers_root`` tie the pointer to one release's bytes: a pointer
  cannot be combined with another release's manifest or answer objects (mix-and-match).

A pointer signed before sequences existed carries the release's own statement: it is read as
sequence 0, never fresh, and refused by a reader that has verified any sequenced pointer.
``tests/vectors/proofs.json`` holds the Python and the web client to the same verdicts.

``current.json`` is read into ``Pointer`` and its statement into ``PointerStatement``, each
validated once (``manifest.Document``: written back exactly as read).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal, Self

from pydantic import StrictInt, StrictStr, model_validator

from base.manifest import Document, FormatError
from base.signing import (
    STATEMENT_FORMAT,
    SignatureError,
    Signer,
    canonical,
    sign_statement,
    verify_statement,
)

log = logging.getLogger(__name__)

POINTER_FORMAT: Final = "edgeqa-pointer/1"
DEFAULT_EXPIRES_S = 2 * 86400  # one missed nightly publish stays fresh
MAX_SEQUENCE = 2**53 - 1  # what a browser's numbers hold exactly


class RollbackError(SignatureError):
    """A validly signed pointer older than one this reader has already verified."""


class Pointer(Document):
    """``current.json``: which release is current. ``sequence`` and ``not_after`` are copies for
    people (readers trust only ``signed``, the signature object over a ``PointerStatement``);
    a pointer written before pointers were signed has none of the three. Fields in the order
    they are written (``publish.flip_pointer``)."""

    version: StrictStr
    manifest_sha256: StrictStr | None = None  # refused when missing (``release.py``)
    published_at: StrictStr | None = None
    parent: StrictStr | None = None
    rolled_back_from: StrictStr | None = None  # a rollback's: the version it replaced
    sequence: StrictInt | None = None
    not_after: StrictStr | None = None
    signed: Any = None  # checked with the keys (``signing.verify_statement``), not here


def _timestamp(value: str) -> datetime:
    found = datetime.fromisoformat(value)
    if found.tzinfo is None:
        raise ValueError("not_after has no time zone")
    return found


class PointerStatement(Document):
    """What a pointer's signature covers (``edgeqa-pointer/1``), or, in a pointer signed before
    sequences, the release's own statement (``edgeqa-release-statement/1``: no sequence, no
    expiry)."""

    answers_root: StrictStr
    format: Literal["edgeqa-pointer/1", "edgeqa-release-statement/1"]
    manifest_sha256: StrictStr
    not_after: StrictStr | None = None
    profile: StrictStr
    sequence: StrictInt | None = None
    version: StrictStr

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.format != POINTER_FORMAT:
            return self
        if self.sequence is None or not 1 <= self.sequence <= MAX_SEQUENCE:
            raise ValueError(f"sequence {self.sequence} is not a positive integer below 2^53")
        try:
            _timestamp(self.not_after or "")
        except ValueError as error:
            raise ValueError(f"not_after {self.not_after!r:.60}: {error}") from None
        return self

    @property
    def expires(self) -> datetime | None:
        """``not_after``; None for a release's own statement (never fresh)."""
        if self.format != POINTER_FORMAT or self.not_after is None:
            return None
        return _timestamp(self.not_after)


@dataclass(frozen=True)
class SignedPointer:
    """What a verified pointer says (its signed statement, never its unsigned fields)."""

    profile: str
    version: str
    manifest_sha256: str
    answers_root: str
    sequence: int  # 0: signed before sequences (a release's own statement)
    not_after: datetime | None  # None: never fresh

    def stale(self, now: datetime | None = None) -> str | None:
        """Why the pointer is stale at ``now`` (None while it is fresh)."""
        if self.not_after is None:
            return "the pointer carries no sequence or expiry (signed before edgeqa signed them)"
        if (now or datetime.now(UTC)) > self.not_after:
            return f"the pointer expired at {self.not_after.isoformat()} (nothing renewed it)"
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "sequence": self.sequence,
            "not_after": self.not_after.isoformat() if self.not_after else None,
        }


def pointer_statement(
    profile: str,
    version: str,
    manifest_sha256: str,
    answers_root: str,
    sequence: int,
    not_after: datetime,
) -> bytes:
    """The text a pointer's signature covers."""
    body = PointerStatement(
        answers_root=answers_root,
        format=POINTER_FORMAT,
        manifest_sha256=manifest_sha256,
        not_after=not_after.astimezone(UTC).isoformat(timespec="seconds"),
        profile=profile,
        sequence=sequence,
        version=version,
    )
    return canonical(body.as_dict())


def next_sequence(previous: int, now: datetime) -> int:
    """The sequence of a pointer signed at ``now`` after one of ``previous``."""
    return max(previous + 1, int(now.timestamp() * 1000))


def new_pointer(
    signer: Signer | None,
    profile: str,
    version: str,
    manifest_sha256: str,
    answers_root: str,
    previous: int,
    *,
    expires_s: float = DEFAULT_EXPIRES_S,
    now: datetime | None = None,
    **fields: Any,
) -> Pointer:
    """``current.json`` naming a release, signed by ``signer`` (unsigned when None) under the
    sequence after ``previous`` (the verified sequence of the pointer it replaces; 0 if none),
    fresh for ``expires_s``; ``fields``: what the pointer adds for people (parent, ...)."""
    if expires_s <= 0:
        raise ValueError("a pointer's expiry must be positive seconds")
    now = now or datetime.now(UTC)
    sequence = next_sequence(previous, now)
    not_after = now + timedelta(seconds=expires_s)
    signed = None
    if signer is not None:
        text = pointer_statement(
            profile, version, manifest_sha256, answers_root, sequence, not_after
        )
        signed = json.loads(sign_statement(text, signer))
    return Pointer.of(
        {
            "version": version,
            "manifest_sha256": manifest_sha256,
            "published_at": now.isoformat(timespec="seconds"),
            **fields,
            "sequence": sequence,  # copies for people; readers trust only the signed statement
            "not_after": not_after.isoformat(timespec="seconds"),
            **({"signed": signed} if signed is not None else {}),
        }
    )


def verify_pointer(
    pointer: Pointer | Any, profile: str, public_keys: tuple[str, ...]
) -> SignedPointer:
    """What ``pointer`` (a ``Pointer``, or a parsed ``current.json``) says, once its ``signed``
    statement verifies under one of ``public_keys`` for ``profile`` and names the release the
    pointer names; ``SignatureError`` otherwise."""
    try:
        pointer = Pointer.of(pointer)
    except FormatError as error:
        raise SignatureError(f"the pointer is malformed: {error}") from None
    found = verify_statement(pointer.signed, public_keys, (POINTER_FORMAT, STATEMENT_FORMAT))
    try:
        signed = PointerStatement.of(found)
    except FormatError as error:
        raise SignatureError(f"the pointer's signed statement: {error}") from None
    if signed.profile != profile:
        raise SignatureError("the pointer's signed statement is another profile's")
    if (signed.version, signed.manifest_sha256) != (pointer.version, pointer.manifest_sha256):
        raise SignatureError("the pointer's signed statement names another release")
    sequence = signed.sequence if signed.format == POINTER_FORMAT else None
    return SignedPointer(
        profile,
        signed.version,
        signed.manifest_sha256,
        signed.answers_root,
        sequence or 0,
        signed.expires,
    )


def signed_root(pointer: Any, profile: str, public_keys: tuple[str, ...]) -> str | None:
    """The ``answers_root`` a client may check answer objects against when the pointer verifies
    (``verify_pointer``), None otherwise; a client also refuses it when it is stale or older than
    one it verified before (``PointerMemory``). ``web/edgeqa.js`` (``signedPointer``) applies the
    same rules, on ``tests/vectors/proofs.json``."""
    try:
        return verify_pointer(pointer, profile, public_keys).answers_root
    except SignatureError:
        return None


def client_verdict(
    pointer: Any,
    profile: str,
    public_keys: tuple[str, ...],
    newest: tuple[int, str] | None = None,
    now: datetime | None = None,
) -> tuple[SignedPointer | None, str | None]:
    """What a client that reads the CDN concludes of ``pointer``, given the newest (sequence,
    manifest sha256) it verified before: (the pointer, None) when it may read answer objects
    under it, else (the pointer or None, the problem): ``unsigned`` (no trusted signature for
    this profile and release), ``rollback`` (older than ``newest``) or ``stale`` (expired, or
    never given an expiry). A client skips the CDN on any problem: the edge and the origin
    answer instead. ``web/edgeqa.js`` (``pointerVerdict``) is held to the same vectors."""
    try:
        signed = verify_pointer(pointer, profile, public_keys)
    except SignatureError:
        return None, "unsigned"
    if older(signed, newest):
        return signed, "rollback"
    return signed, ("stale" if signed.stale(now) else None)


def older(pointer: SignedPointer, newest: tuple[int, str] | None) -> bool:
    """Whether ``pointer`` is older than the newest (sequence, manifest sha256) verified before,
    or as old and names another release (two pointers signed under one sequence)."""
    if newest is None:
        return False
    sequence, sha = newest
    return pointer.sequence < sequence or (
        pointer.sequence == sequence and pointer.manifest_sha256 != sha
    )


class PointerMemory:
    """The newest pointer each reader verified, by where it was read (a store's ``current.json``):
    in memory and, given ``folder``, on local disk, one small file per pointer (so a restarted
    reader still refuses what it refused before). Thread-safe."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self._seen: dict[str, tuple[int, str]] = {}  # where -> (sequence, manifest sha256)
        self._lock = threading.Lock()

    def _file(self, where: str) -> Path | None:
        if self.folder is None:
            return None
        return self.folder / f"{hashlib.sha256(where.encode()).hexdigest()[:32]}.json"

    def newest(self, where: str) -> tuple[int, str] | None:
        """(sequence, manifest sha256) of the newest pointer verified at ``where``."""
        with self._lock:
            if where not in self._seen:
                found = self._read(where)
                if found is not None:
                    self._seen[where] = found
            return self._seen.get(where)

    def _read(self, where: str) -> tuple[int, str] | None:
        path = self._file(where)
        if path is None or not path.exists():
            return None
        try:
            state = json.loads(path.read_text())
            if state.get("where") != where:
                raise ValueError("it names another pointer")
            sequence, sha = state["sequence"], state["manifest_sha256"]
            if type(sequence) is not int or not isinstance(sha, str):
                raise ValueError("no sequence or manifest")
            return sequence, sha
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.error("ignoring the pointer memory %s: %s", path, error)
            return None

    def check(self, where: str, pointer: SignedPointer) -> None:
        """``RollbackError`` when ``pointer`` is older than the newest verified at ``where`` (or
        as old and names another release)."""
        newest = self.newest(where)
        if newest is not None and older(pointer, newest):
            raise RollbackError(
                f"{where} (sequence {pointer.sequence}, version {pointer.version}) is older than "
                f"a pointer already verified (sequence {newest[0]}): refused as a rollback"
            )

    def remember(self, where: str, pointer: SignedPointer) -> None:
        """Record ``pointer`` (checked first: ``RollbackError`` when it is older)."""
        self.check(where, pointer)
        with self._lock:
            self._seen[where] = (pointer.sequence, pointer.manifest_sha256)
            path = self._file(where)
        if path is None:
            return
        state = {
            "where": where,
            "sequence": pointer.sequence,
            "manifest_sha256": pointer.manifest_sha256,
            "version": pointer.version,
        }
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(state, out)
            os.replace(tmp, path)
        except OSError as error:  # remembered in memory still; a restart forgets it
            log.error("could not record the pointer memory %s: %s", path, error)


class PointerState:
    """One reader's view of one profile's pointer: the verified pointer of what it serves, and
    why the store's pointer is refused as a rollback (while it is).

    ``floor``: the high-water mark of a profile (``highwater.py``: the highest pointer sequence
    ever signed, read from outside the store; it raises ``RollbackError`` when it cannot be
    read). Given, a reader that serves nothing yet (started fresh, its memory empty) refuses a
    pointer below it, a pointer signed before sequences (a release's own statement) and an
    expired one: it serves nothing rather than what a bucket writer may have put back."""

    def __init__(
        self,
        public_keys: tuple[str, ...],
        memory: PointerMemory | None = None,
        floor: Callable[[str], int] | None = None,
    ) -> None:
        self.public_keys = public_keys
        self.memory = memory or PointerMemory()
        self.floor = floor
        self.served: SignedPointer | None = None
        self.rollback: str | None = None

    def verify(self, pointer: Pointer, profile: str, where: str) -> SignedPointer | None:
        """``pointer``'s signed statement, not older than one verified before at ``where``
        (None without public keys); ``SignatureError``, ``RollbackError`` for an older one
        (then reported stale until the store's pointer moves on) or, while nothing is served,
        one the high-water mark refuses."""
        if not self.public_keys:
            return None
        signed = verify_pointer(pointer, profile, self.public_keys)
        try:
            self.memory.check(where, signed)
            if self.served is None and self.floor is not None:
                self._fresh(signed, where)
        except RollbackError as error:
            self.rollback = str(error)
            raise
        self.rollback = None
        return signed

    def _fresh(self, signed: SignedPointer, where: str) -> None:
        """What a reader that serves nothing yet also refuses (``floor`` given)."""
        assert self.floor is not None
        mark = self.floor(signed.profile)
        if signed.sequence < mark:
            raise RollbackError(
                f"{where} (sequence {signed.sequence}, version {signed.version}) is below the "
                f"high-water mark {mark}: refused as a rollback, nothing served"
            )
        stale = signed.stale()
        if stale is not None:
            raise RollbackError(
                f"{where} (version {signed.version}): {stale}; a reader started fresh serves no "
                "stale pointer while a high-water mark is set"
            )

    def serve(self, where: str, signed: SignedPointer) -> None:
        self.memory.remember(where, signed)
        self.served = signed

    def stale(self) -> str | None:
        """Why what is served is stale (None while it is fresh, or unsigned): the store's pointer
        is refused as a rollback, or the served pointer expired."""
        if self.rollback is not None:
            return self.rollback
        return self.served.stale() if self.served is not None else None

    def health(self) -> dict[str, Any] | None:
        stale = self.stale()
        if self.served is None and stale is None:
            return None
        state = {**(self.served.describe() if self.served else {}), "stale": stale is not None}
        return {**state, "stale_reason": stale} if stale is not None else state
