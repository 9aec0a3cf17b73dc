"""API keys: ``Authorization: Bearer <key>`` or ``x-api-key``, checked in constant time."""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Sequence

from starlette.requests import Request

from origin.server.protocol import APIError


@functools.lru_cache(maxsize=4)
def _digests(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    """The keys' digests, computed once per set of keys (not per request)."""
    return tuple(hashlib.sha256(key.encode()).digest() for key in keys)


def check_api_key(request: Request, keys: Sequence[str]) -> str | None:
    """Raise 401 unless the request carries one of ``keys`` (no keys: the API is open); the
    matching key's id (a hash prefix: what logs may name), None when the API is open.

    Every key is compared, each in constant time, on digests of equal length, so neither the
    time taken nor an early exit tells how much of a guess was right."""
    if not keys:
        return None
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    token = token or request.headers.get("x-api-key", "")
    digest = hashlib.sha256(token.encode()).digest()
    ok = False
    for key in _digests(tuple(keys)):
        ok |= hmac.compare_digest(digest, key)
    if not ok:
        raise APIError(
            401,
            "missing or invalid API key",
            None,
            "authentication_error",
            "invalid_api_key",
            headers={"www-authenticate": "Bearer"},
        )
    return digest.hex()[:16]
