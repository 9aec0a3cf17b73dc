"""Credentials a request presents (``Authorization: Bearer <token>``), checked in constant time.

One comparison for every secret the services accept: the origin's API keys and both services'
``EDGEQA_METRICS_TOKEN``. Every allowed secret is compared, each as a SHA-256 digest with
``hmac.compare_digest``, so neither the time taken nor an early exit tells how much of a guess was
right, nor which secret it came close to.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.requests import Request


def bearer_token(request: Request) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; "" without one."""
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else ""


@functools.lru_cache(maxsize=8)
def _digests(secrets: tuple[str, ...]) -> tuple[bytes, ...]:
    """The secrets' digests, computed once per set of secrets (not per request)."""
    return tuple(hashlib.sha256(secret.encode()).digest() for secret in secrets)


def matching_digest(token: str, secrets: Sequence[str]) -> bytes | None:
    """``token``'s SHA-256 digest when it is one of ``secrets``, else None; every secret is
    compared, in constant time."""
    digest = hashlib.sha256(token.encode()).digest()
    ok = False
    for secret in _digests(tuple(secrets)):
        ok |= hmac.compare_digest(digest, secret)
    return digest if ok else None
