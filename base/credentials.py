"""Credentials a request presents (``Authorization: Bearer <token>``), checked in constant time.

One comparison for every secret the services accept: the origin's API keys and both services'
``EDGEQA_METRICS_TOKEN`` (``metrics_refusal``: one rule for both services' ``/metrics``). Every
allowed secret is compared, each as a SHA-256 digest with ``hmac.compare_digest``, so neither the
time taken nor an early exit tells how much of a guess was right, nor which secret it came close
to.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
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


def metrics_refusal(request: Request, token: str) -> tuple[int, str] | None:
    """Why ``/metrics`` refuses ``request`` — (401, ...) without ``token`` as its bearer token,
    or, with no token configured, (403, ...) unless the TCP peer is this machine (what the
    metrics show, the traffic as it happens, is not for anyone who reaches the port) — else
    None."""
    if token:
        if matching_digest(bearer_token(request), (token,)) is None:
            return 401, "missing or invalid metrics token (Authorization: Bearer)"
        return None
    peer = request.client.host if request.client else ""
    try:
        local = ipaddress.ip_address(peer).is_loopback
    except ValueError:
        local = False
    if not local:
        return 403, "/metrics answers only this machine unless EDGEQA_METRICS_TOKEN is set"
    return None
