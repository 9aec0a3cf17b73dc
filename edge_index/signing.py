"""Release signatures: who may publish what the edge and the origin serve.

The sha256 chain (``release.py``) proves a release is whole, not who wrote it: anyone who can
write the store can publish a release that hashes correctly. The nightly job therefore signs each
release's ``manifest.json`` with an Ed25519 key (``EDGEQA_SIGNING_KEY``) into ``manifest.sig``
beside it; readers holding the public keys (``EDGEQA_RELEASE_PUBLIC_KEYS``, several during a
rotation) refuse a release that is unsigned or signed by any other key. Since the manifest holds
the sha256 of every shard and every row the sha256 of its answer object, one signature covers
every byte of the release.

Keys are raw 32-byte Ed25519 keys, base64-encoded (``generate_keypair``; ``edgeqa keys``).
``manifest.sig`` is ``{"alg": "ed25519", "key_id", "signature"}``; ``key_id`` is the first 16 hex
digits of the public key's sha256 (to tell keys apart in logs, never trusted for verification).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable

from edge_index.errors import EdgeQAError

SIGNATURE = "manifest.sig"
MAX_SIGNATURE_BYTES = 4096


class SignatureError(EdgeQAError, ValueError):
    """A key is malformed, or a manifest is unsigned or not signed by a trusted key."""


def _raw(key: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(key.strip(), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise SignatureError(f"{what} must be a base64 raw Ed25519 key (32 bytes)")
    return raw


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


def public_key_of(private_key: str) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.from_private_bytes(_raw(private_key, "EDGEQA_SIGNING_KEY"))
    public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return base64.b64encode(public).decode()


def parse_public_keys(value: str) -> tuple[str, ...]:
    """``EDGEQA_RELEASE_PUBLIC_KEYS``: comma-separated base64 keys; ``SignatureError`` if bad."""
    keys = tuple(k.strip() for k in value.split(",") if k.strip())
    for key in keys:
        _raw(key, "each of EDGEQA_RELEASE_PUBLIC_KEYS")
    return keys


def sign_manifest(manifest: bytes, private_key: str) -> bytes:
    """The ``manifest.sig`` object for ``manifest`` (its exact bytes)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.from_private_bytes(_raw(private_key, "EDGEQA_SIGNING_KEY"))
    signature = base64.b64encode(private.sign(manifest)).decode()
    body = {"alg": "ed25519", "key_id": key_id(public_key_of(private_key)), "signature": signature}
    return json.dumps(body, sort_keys=True).encode()


def verify_manifest(manifest: bytes, signature: bytes | None, public_keys: Iterable[str]) -> str:
    """The key id that signed ``manifest``; ``SignatureError`` when ``signature`` (the
    ``manifest.sig`` object, None when absent) is not a valid signature by one of the keys."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if signature is None:
        raise SignatureError("the release is unsigned (no manifest.sig)")
    try:
        body = json.loads(signature)
        raw = base64.b64decode(body["signature"], validate=True)
        if body.get("alg") != "ed25519" or len(raw) != 64:
            raise ValueError("not an Ed25519 signature")
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error) as error:
        raise SignatureError(f"manifest.sig is malformed: {error}") from None
    for key in public_keys:
        try:
            Ed25519PublicKey.from_public_bytes(_raw(key, "a public key")).verify(raw, manifest)
            return key_id(key)
        except InvalidSignature:
            continue
    raise SignatureError("manifest.sig is not a signature of this manifest by a trusted key")
