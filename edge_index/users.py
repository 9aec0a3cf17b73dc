"""Who asked: the salted hash that request logs store instead of an identity, defined once.

Both services (the edge and the origin) log who asked so that the nightly mining can count
distinct users. The raw identity is the ``x-edgeqa-user`` header, else the ``user`` the request
body names (the OpenAI API's field), else the client's address; what is stored is its
HMAC-SHA256 under a secret salt (``EDGEQA_USER_SALT``), never the identity itself. Every replica
must share the salt for counts to join across processes: ``edgeqa edge serve`` and ``edgeqa origin
serve`` refuse to log requests without one (``check_salt``); elsewhere (tests, one-process tools) a
random per-process salt is used and a warning logged.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.requests import Request

log = logging.getLogger(__name__)

USER_HEADER = "x-edgeqa-user"
MIN_SALT_CHARS = 16
_PROCESS_SALT = secrets.token_bytes(32)


def check_salt(salt: str) -> None:
    """Refuse to serve (and log) with no salt or a guessable one: ``ConfigError``."""
    from edge_index.config import ConfigError

    if len(salt) < MIN_SALT_CHARS:
        raise ConfigError(
            f"EDGEQA_USER_SALT must be a secret of at least {MIN_SALT_CHARS} characters, the same "
            "on every edge and origin replica (e.g. `openssl rand -hex 32`): without it each "
            "process hashes users differently and one user counts once per process toward the "
            "k distinct users a published answer needs. --no-logs serves without one."
        )


def hash_user(user: str, salt: bytes) -> str:
    """The salted hash stored instead of a user identity (HMAC-SHA256, 32 hex chars)."""
    if not user:
        return ""
    return hmac.new(salt, user.encode("utf-8"), "sha256").hexdigest()[:32]


class UserHasher:
    """Hashes who asked, with the salt the service was started with."""

    def __init__(self, salt: str | bytes = "") -> None:
        if not salt:
            log.warning("EDGEQA_USER_SALT is not set: hashing users with a random per-process salt")
            salt = _PROCESS_SALT
        self.salt = salt.encode("utf-8") if isinstance(salt, str) else salt

    def __call__(self, user: str) -> str:
        return hash_user(user, self.salt)

    def of_request(self, request: Request, claimed: str | None = None) -> str:
        """The hashed user of an HTTP request; ``claimed``: the user the body names."""
        raw = (
            request.headers.get(USER_HEADER)
            or claimed
            or (request.client.host if request.client else "")
        )
        return self(raw)
