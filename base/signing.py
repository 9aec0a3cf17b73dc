"""Release signatures: who may publish what the edge, the origin and the browsers serve.

The sha256 chain (``release.py``) proves a release is whole, not who wrote it: anyone who can
write the store can publish a release that hashes correctly. The nightly job therefore signs a
short *statement* for each release with an Ed25519 key into ``manifest.sig`` beside its manifest:

    {"answers_root", "format": "edgeqa-release-statement/1", "manifest_sha256", "profile",
     "version"}

(canonical JSON). The manifest holds the sha256 of every shard and every row the sha256 of its
answer object, so through ``manifest_sha256`` one signature covers every byte the edge and the
origin read; through ``answers_root`` (``proofs.py``) it covers every answer object a browser
reads. Publishing signs ``current.json`` too (``pointers.py``: the same release, plus a sequence
and an expiry, against rollback and freeze), so a browser needs nothing but the pointer and one
object. Readers hold the public keys
(``EDGEQA_RELEASE_PUBLIC_KEYS``, several during a rotation) and refuse a release that is unsigned
or signed by any other key.

The statement is small on purpose: AWS KMS signs at most 4 KiB (``KmsSigner``,
``EDGEQA_SIGNING_KMS_KEY``: the private key never leaves KMS); ``LocalSigner`` holds a raw key
(``EDGEQA_SIGNING_KEY``, ``edgeqa keys generate``). Public keys are base64, raw (32 bytes) or the
SubjectPublicKeyInfo DER that KMS's GetPublicKey returns (44 bytes); they are kept raw.

``manifest.sig`` is ``{"alg": "ed25519", "key_id", "statement", "signature"}``: ``statement`` is
the exact signed text, ``key_id`` the first 16 hex digits of the public key's sha256 (to tell keys
apart in logs, never trusted for verification).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from typing import Any, Protocol

from base.errors import EdgeQAError

SIGNATURE = "manifest.sig"
MAX_SIGNATURE_BYTES = 4096
STATEMENT_FORMAT = "edgeqa-release-statement/1"
# SubjectPublicKeyInfo of an Ed25519 key, before its 32 raw bytes (RFC 8410)
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


class SignatureError(EdgeQAError, ValueError):
    """A key is malformed, or a release is unsigned or not signed by a trusted key."""


def _raw(key: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(key.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == 44 and raw.startswith(_SPKI_PREFIX):
        raw = raw[len(_SPKI_PREFIX) :]
    if len(raw) != 32:
        raise SignatureError(f"{what} must be a base64 Ed25519 key (32 raw bytes or 44 DER)")
    return raw


def normalize_public_key(key: str) -> str:
    """``key`` (raw or DER, base64) as base64 of its 32 raw bytes."""
    return base64.b64encode(_raw(key, "a public key")).decode()


def key_id(public_key: str) -> str:
    return hashlib.sha256(_raw(public_key, "the public key")).hexdigest()[:16]


def generate_keypair() -> tuple[str, str]:
    """A new (private, public) key pair, base64."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    private_bytes = private.private_bytes(
        raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    public_bytes = private.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
    return base64.b64encode(private_bytes).decode(), base64.b64encode(public_bytes).decode()


def parse_public_keys(value: str) -> tuple[str, ...]:
    """``EDGEQA_RELEASE_PUBLIC_KEYS``: comma-separated base64 keys, returned raw;
    ``SignatureError`` if one is bad."""
    keys = [k.strip() for k in value.split(",") if k.strip()]
    try:
        return tuple(normalize_public_key(k) for k in keys)
    except SignatureError:
        raise SignatureError(
            "each of EDGEQA_RELEASE_PUBLIC_KEYS must be a base64 Ed25519 public key "
            "(32 raw bytes, or the 44-byte DER KMS GetPublicKey returns)"
        ) from None


class Signer(Protocol):
    """Signs release statements; ``public_key`` is base64 raw."""

    public_key: str

    def sign(self, message: bytes) -> bytes: ...


class LocalSigner:
    """A raw Ed25519 private key held by this process (``EDGEQA_SIGNING_KEY``)."""

    def __init__(self, private_key: str) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self._key = Ed25519PrivateKey.from_private_bytes(_raw(private_key, "EDGEQA_SIGNING_KEY"))
        public = self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public_key = base64.b64encode(public).decode()

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


class KmsSigner:
    """An AWS KMS key of spec ECC_NIST_EDWARDS25519 (``EDGEQA_SIGNING_KMS_KEY``: its id, ARN or
    alias); each ``sign`` is one KMS Sign call (ED25519_SHA_512, the message itself)."""

    def __init__(self, key: str, client: Any = None) -> None:
        import boto3

        self.key = key
        self._client = client or boto3.client("kms")
        described = self._client.get_public_key(KeyId=key)
        if described.get("KeySpec") != "ECC_NIST_EDWARDS25519":
            raise SignatureError(
                f"KMS key {key} is {described.get('KeySpec')}, not ECC_NIST_EDWARDS25519"
            )
        self.public_key = normalize_public_key(base64.b64encode(described["PublicKey"]).decode())

    def sign(self, message: bytes) -> bytes:
        answer = self._client.sign(
            KeyId=self.key, Message=message, MessageType="RAW", SigningAlgorithm="ED25519_SHA_512"
        )
        return bytes(answer["Signature"])


def signer_from(private_key: str = "", kms_key: str = "") -> Signer | None:
    """The signer the settings name (a KMS key wins); None = publish unsigned."""
    if kms_key:
        return KmsSigner(kms_key)
    return LocalSigner(private_key) if private_key else None


def canonical(body: dict[str, Any]) -> bytes:
    """``body`` as the exact text a statement signs: JSON, sorted keys, no spaces."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def writer_keys(signer: Signer | None, public_keys: tuple[str, ...], what: str) -> tuple[str, ...]:
    """The keys a writer verifies what it read with (the readers' and its signer's own) before
    it signs a new version of it; ``SignatureError`` naming ``what`` when readers check
    signatures (``public_keys``) and nothing can sign."""
    if signer is None and public_keys:
        raise SignatureError(
            f"{what} is signed: set EDGEQA_SIGNING_KEY or EDGEQA_SIGNING_KMS_KEY "
            "(readers hold EDGEQA_RELEASE_PUBLIC_KEYS)"
        )
    return verifying_keys(signer, public_keys)


def verifying_keys(signer: Signer | None, public_keys: tuple[str, ...]) -> tuple[str, ...]:
    """The readers' keys and ``signer``'s own: what a writer verifies what it read with."""
    return (*public_keys, signer.public_key) if signer else public_keys


def statement(profile: str, version: str, manifest_sha256: str, answers_root: str) -> bytes:
    """The text a release's signature covers."""
    body = {
        "answers_root": answers_root,
        "format": STATEMENT_FORMAT,
        "manifest_sha256": manifest_sha256,
        "profile": profile,
        "version": version,
    }
    return canonical(body)


def sign_statement(text: bytes, signer: Signer) -> bytes:
    """The ``manifest.sig`` object for the statement ``text``."""
    body = {
        "alg": "ed25519",
        "key_id": key_id(signer.public_key),
        "statement": text.decode(),
        "signature": base64.b64encode(signer.sign(text)).decode(),
    }
    return json.dumps(body, sort_keys=True).encode()


def verify_statement(
    signature: Any, public_keys: Iterable[str], formats: tuple[str, ...] = (STATEMENT_FORMAT,)
) -> dict[str, Any]:
    """The statement ``signature`` (the ``manifest.sig`` object, as bytes or parsed; None when
    absent) signs, parsed; ``SignatureError`` unless one of the keys signed it and it is of one
    of ``formats`` (a release statement; ``pointers.py`` reads pointer statements too)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if signature is None:
        raise SignatureError("the release is unsigned (no manifest.sig)")
    try:
        body = json.loads(signature) if isinstance(signature, bytes | str) else signature
        raw = base64.b64decode(body["signature"], validate=True)
        text = body["statement"].encode()
        if body.get("alg") != "ed25519" or len(raw) != 64:
            raise ValueError("not an Ed25519 signature")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, binascii.Error) as e:
        raise SignatureError(f"manifest.sig is malformed: {e}") from None
    for key in public_keys:
        try:
            Ed25519PublicKey.from_public_bytes(_raw(key, "a public key")).verify(raw, text)
        except InvalidSignature:
            continue
        found = json.loads(text)
        if not isinstance(found, dict) or found.get("format") not in formats:
            raise SignatureError(f"the signed statement is not one of {', '.join(formats)}")
        return found
    raise SignatureError("manifest.sig is not a signature by a trusted key")
