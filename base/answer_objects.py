"""The exact tier on the CDN: answer objects addressed by their content, shared by every release
that holds them, and each release's key index, which says which object answers each key and
proves it to the release's signed ``answers_root`` (``docs/release-format.md#answer-objects``).

    <profile>/a/<sha256[:2]>/<sha256>.json              an answer object (``object_path``)
    <profile>/releases/<version>/k/<key[:3]>.json       a bucket of the key index (``bucket_path``)

An answer object holds what a client shows and checks (key, profile, answer, dates) and nothing
of the release, so an answer unchanged since the parent release is the same object, written
once. A bucket lists its keys' objects (``<key> <sha256>`` lines, sorted) with a Merkle proof of
its leaf; the answers root is the root over the buckets. Every client applies one rule before
showing an answer (``bucket_problem``, ``answer_object_problem``; ``web/edgeqa.js`` mirrors
both, on ``tests/vectors/answer_objects.json`` and ``proofs.json``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from base.proofs import leaf, proof_root

KEY_DIGITS = 3  # a bucket per 3 hex digits of the key: 4,096, ~244 keys each at a million
OBJECT_FIELDS = ("answer", "expires_at", "generated_at", "key", "profile")
BUCKET_FIELDS = ("profile", "version", "bucket", "entries")  # a bucket's leaf, in this order
MAX_BUCKET_BYTES = 4 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENTRY = re.compile(r"([0-9a-f]{64}) ([0-9a-f]{64})")


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def answer_object(row: dict[str, Any], profile: str) -> bytes:
    """The object served for one phrasing's key: its bytes are its address (``object_path``)."""
    return canonical_json(
        {
            "answer": row["answer"],
            "expires_at": row["expires_at"].isoformat(),
            "generated_at": row["generated_at"].isoformat(),
            "key": row["key"],
            "profile": profile,
        }
    )


def object_path(sha256: str) -> str:
    """Where the object of digest ``sha256`` lives, under ``<profile>/``: 256 folders."""
    return f"a/{sha256[:2]}/{sha256}.json"


def bucket_of(key: str) -> str:
    return key[:KEY_DIGITS]


def bucket_path(bucket: str) -> str:
    """Where a bucket of the key index lives, under ``<profile>/releases/<version>/``."""
    return f"k/{bucket}.json"


def bucket_entries(pairs: Iterable[tuple[str, str]]) -> str:
    """The ``entries`` text of a bucket: a ``<key> <sha256>`` line per (key, digest), in the
    order given (sorted by key)."""
    return "".join(f"{key} {digest}\n" for key, digest in pairs)


def bucket_leaf(profile: str, version: str, bucket: str, entries: str) -> bytes:
    """A bucket's leaf in the answers tree (``proofs.leaf`` over ``BUCKET_FIELDS``)."""
    return leaf([profile, version, bucket, entries])


def bucket_file(profile: str, version: str, bucket: str, entries: str, proof: list[str]) -> bytes:
    return canonical_json(
        {
            "bucket": bucket,
            "entries": entries,
            "profile": profile,
            "proof": proof,
            "version": version,
        }
    )


def bucket_problem(
    obj: Any, bucket: str, profile: str, version: str, root: str | None
) -> str | None:
    """Why a bucket fetched from the CDN must not be read for ``bucket`` of ``profile``'s
    ``version`` (``malformed``, ``bucket``, ``profile``, ``version``, ``proof``), or None. ``root``:
    the signed ``answers_root`` (None: the proof is not checked, for a reader that holds the
    release's manifest under a verified chain)."""
    if not isinstance(obj, dict) or not all(isinstance(obj.get(n), str) for n in BUCKET_FIELDS):
        return "malformed"
    for name, expected in (("bucket", bucket), ("profile", profile), ("version", version)):
        if obj[name] != expected:
            return name
    if root is not None:
        try:
            found = bucket_leaf(profile, version, bucket, obj["entries"])
        except UnicodeEncodeError:
            return "malformed"
        if proof_root(found, obj.get("proof")) != root:
            return "proof"
    return None


def bucket_entry(obj: dict[str, Any], key: str) -> str | None:
    """The digest of ``key``'s object in a checked bucket, or None when the bucket lists none."""
    entries = obj["entries"]
    at = entries.find(f"{key} ") if _HEX64.fullmatch(key or "") else -1
    while at > 0 and entries[at - 1] != "\n":  # a match inside a line is no entry
        at = entries.find(f"{key} ", at + 1)
    if at < 0:
        return None
    found = _ENTRY.match(entries, at)
    return found.group(2) if found else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def answer_object_problem(
    data: bytes, key: str, profile: str, sha256: str, now_s: float
) -> str | None:
    """Why the object fetched for ``key`` (its bytes: ``data``; the digest its checked bucket
    names: ``sha256``) must not be shown (``digest``, ``malformed``, ``key``, ``profile``,
    ``expired``), or None when it may: a forged, cached or misplaced object, or one past its
    ``expires_at``, sends the question on to the next layer."""
    from datetime import datetime

    if hashlib.sha256(data).hexdigest() != sha256:
        return "digest"
    try:  # strict UTF-8 (a leading BOM dropped) and plain JSON, as a browser reads it
        obj = json.loads(data.decode("utf-8-sig"), parse_constant=_no_constant)
    except ValueError:
        return "malformed"
    if not isinstance(obj, dict) or not isinstance(obj.get("answer"), str):
        return "malformed"
    for name, expected in (("key", key), ("profile", profile)):
        if obj.get(name) != expected:
            return name
    try:
        expires = datetime.fromisoformat(str(obj["expires_at"]))
    except (KeyError, ValueError):
        return "malformed"
    if expires.tzinfo is None:
        return "malformed"
    return "expired" if expires.timestamp() <= now_s else None
