"""API keys (``Authorization: Bearer <key>`` or ``x-api-key``) and the metrics token
(``Authorization: Bearer <token>``), checked in constant time (``base/credentials.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request

from base.credentials import bearer_token, matching_digest, metrics_refusal
from origin.server.protocol import APIError


def check_api_key(request: Request, keys: Sequence[str]) -> str | None:
    """Raise 401 unless the request carries one of ``keys`` (no keys: the API is open); the
    matching key's id (a hash prefix: what logs may name), None when the API is open."""
    if not keys:
        return None
    token = bearer_token(request) or request.headers.get("x-api-key", "")
    digest = matching_digest(token, keys)
    if digest is None:
        raise _unauthorized("missing or invalid API key", "invalid_api_key")
    return digest.hex()[:16]


def check_metrics_token(request: Request, token: str) -> None:
    """Raise 401 unless the request carries ``token`` as its bearer token; without one, 403
    unless it comes from this machine (``credentials.metrics_refusal``)."""
    refused = metrics_refusal(request, token)
    if refused is None:
        return
    status, message = refused
    if status == 401:
        raise _unauthorized(message, "invalid_metrics_token")
    raise APIError(status, message, None, "permission_error", "metrics_off_loopback")


def _unauthorized(message: str, code: str) -> APIError:
    return APIError(
        401, message, None, "authentication_error", code, headers={"www-authenticate": "Bearer"}
    )
