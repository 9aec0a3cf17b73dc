"""Who asked: the identity a request counts as, and the salted hashes logs store instead, defined
once for both services.

The nightly mining publishes a question only when k distinct people asked it, so an identity must
be something a client cannot mint at will. In order:

1. A user token the deployment signed (``x-edgeqa-user`` header, or the body's ``user`` field):
   an HS256 JWT with ``sub``, ``iat`` and ``exp`` at most ``MAX_TOKEN_LIFETIME_S`` (a day) apart,
   signed with ``EDGEQA_IDENTITY_SECRET`` by the backend that knows its users
   (``mint_user_token``): a leaked token counts its user for a day at most. Anything else in those
   fields is ignored.
2. The API key the request authenticated with (the origin's ``EDGEQA_API_KEYS``), with the viewer's
   host: a key serves many people, so each host behind it counts once.
3. The viewer's host: its IPv4 address, or its IPv6 /64 (``network_key``). One IPv6 subscriber or
   machine is routed a whole /64 and may use any address in it (privacy addresses rotate by
   design), so the /128 would let one host be as many askers as it likes.

The viewer is the TCP peer, or, when the peer is one of ``EDGEQA_TRUSTED_PROXIES`` (CIDRs: the
load balancer's subnets), CloudFront's ``CloudFront-Viewer-Address`` header, else the right-most
``X-Forwarded-For`` hop that is not a trusted proxy, over all of that header's lines in order (a
proxy may append a line of its own after the client's forged one). A client's own forwarding
headers are never believed. An IPv4-mapped IPv6 address (``::ffff:10.0.0.1``, what a dual-stack
socket reports for an IPv4 peer) is read as the IPv4 address, wherever it appears.

Logs keep ``user``, HMAC-SHA256 of the identity under ``EDGEQA_USER_SALT``, and ``network``, the
same of the viewer's /24 (IPv4) or /48 (IPv6): mining counts a phrasing's askers as the fewer of
its distinct users and distinct networks, so neither one identity nor one network counts twice.
They also keep ``signed`` (the identity is a signed user token: mining requires
``EDGEQA_MIN_SIGNED_USERS`` of those per published text, as five /24s are easy to rent and an
account of the deployment is not) and ``asn``, the same HMAC of the viewer's autonomous system
when ``EDGEQA_ASN_TABLE`` names a table (``asn.py``; "" otherwise or when unknown).
The origin's per-asker shares and its online cache's k count the same hashed identity, and its
per-network shares and the cache's k the same hashed ``network`` (the cache's k, like mining's, is
the fewer of distinct identities and distinct networks).
The ``x-edgeqa-tenant`` header is kept the same way (``tenant``): a tenant's name is the
deployment's customer, not something a log reader needs.
``edgeqa edge serve`` and ``edgeqa origin serve`` refuse to log without a salt (``check_salt``);
elsewhere (tests, one-process tools) a random per-process salt is used and a warning logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from base.config import MIN_SECRET_CHARS, ConfigError, Network, SharedSettings, parse_networks

if TYPE_CHECKING:
    from starlette.requests import Request

    from base.asn import AsnTable

log = logging.getLogger(__name__)

USER_HEADER = "x-edgeqa-user"
TENANT_HEADER = "x-edgeqa-tenant"
VIEWER_HEADER = "cloudfront-viewer-address"
FORWARDED_HEADER = "x-forwarded-for"
MIN_SALT_CHARS = 16
_PROCESS_SALT = secrets.token_bytes(32)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# prefix lengths (IPv4, IPv6) of one host, which counts as one asker, and of one network
HOST_BITS = (32, 64)
MAX_TOKEN_LIFETIME_S = 86_400  # a user token's exp - iat, at most
NETWORK_BITS = (24, 48)
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")  # IPv4-mapped IPv6 addresses


def check_salt(salt: str) -> None:
    """Refuse to serve (and log) with no salt or a guessable one: ``ConfigError``."""
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


def mint_user_token(user: str, secret: str, ttl_s: float = 3600.0) -> str:
    """What a deployment's backend hands its frontend for ``x-edgeqa-user``: an HS256 JWT naming
    the (already authenticated) ``user``, expiring in ``ttl_s`` seconds."""
    import jwt

    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"the identity secret must have at least {MIN_SECRET_CHARS} characters")
    if ttl_s > MAX_TOKEN_LIFETIME_S:
        raise ValueError(f"a user token lives at most {MAX_TOKEN_LIFETIME_S} s")
    now = int(time.time())
    return jwt.encode({"sub": user, "iat": now, "exp": now + int(ttl_s)}, secret, "HS256")


def _verified_user(token: str | None, secret: str) -> str | None:
    """The ``sub`` of a valid, unexpired token signed with ``secret``, issued (``iat``) at most
    ``MAX_TOKEN_LIFETIME_S`` before it expires; None otherwise."""
    if not token or not secret or len(token) > 4096:
        return None
    import jwt

    try:
        claims = jwt.decode(
            token, secret, algorithms=["HS256"], options={"require": ["exp", "iat"]}, leeway=60
        )  # a minute of clock skew between the backend that signs and the service
    except jwt.PyJWTError:
        return None
    lifetime = claims["exp"] - claims["iat"]
    if not isinstance(lifetime, int | float) or lifetime > MAX_TOKEN_LIFETIME_S:
        return None
    subject = claims.get("sub")
    return subject if isinstance(subject, str) and subject else None


def network_key(address: Address, bits: tuple[int, int] = HOST_BITS) -> str:
    """``address``'s block as text: its first ``bits[0]`` bits (IPv4) or ``bits[1]`` (IPv6).
    A whole address is written bare (``203.0.113.5``), a block as a network
    (``2001:db8:1:2::/64``). The one place an asker's host (``HOST_BITS``) or network
    (``NETWORK_BITS``) is decided."""
    prefix = bits[0] if address.version == 4 else bits[1]
    if prefix == address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network((address, prefix), strict=False))


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (``::ffff:10.0.0.1``) as the IPv4 address it stands for."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _unmapped_network(network: Network) -> Network:
    """A trusted proxy written IPv4-mapped (``::ffff:10.0.0.0/104``) as its IPv4 network, since
    addresses are compared unmapped."""
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
        low_32 = int(network.network_address) & 0xFFFFFFFF
        return ipaddress.IPv4Network((low_32, network.prefixlen - 96))
    return network


def _address(text: str, with_port: bool = False) -> Address | None:
    """An address from ``1.2.3.4``, ``1.2.3.4:5678``, ``[::1]:80`` or ``::1``; None if not one.
    ``with_port``: the text always ends in ``:port`` (CloudFront-Viewer-Address writes IPv6
    without brackets: ``2001:db8::1:443``). IPv4-mapped IPv6 comes back as IPv4."""
    text = text.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif with_port or text.count(":") == 1:
        text = text.rpartition(":")[0]
    try:
        return _unmapped(ipaddress.ip_address(text))
    except ValueError:
        return None


def _forwarded_hops(request: Request) -> list[str]:
    """Every ``X-Forwarded-For`` hop, over all the header's lines in the order received (repeated
    lines are one comma-separated list: RFC 9110, 5.3). ``headers.get`` reads the first line
    only: the client's own, when a proxy appends a line of its own after it."""
    lines = request.headers.getlist(FORWARDED_HEADER)
    return ",".join(lines).split(",") if lines else []


@dataclass(frozen=True)
class Asker:
    """Who a request counts as, hashed: ``user`` (the identity), ``network`` (the viewer's
    /24 or /48; "" when unknown), ``asn`` (the viewer's autonomous system; "" when unknown or
    no table is configured); and ``signed``: the identity is a user token the deployment
    signed, not an address."""

    user: str
    network: str
    signed: bool = False
    asn: str = ""

    def log_fields(self) -> dict[str, str | bool]:
        """The request-log columns (``base/logs.py``) this asker fills."""
        return {"user": self.user, "network": self.network, "signed": self.signed, "asn": self.asn}


class UserHasher:
    """Decides and hashes who asked, with the service's salt, identity secret and proxies."""

    def __init__(
        self,
        salt: str | bytes = "",
        identity_secret: str = "",
        trusted_proxies: Iterable[Network] = (),
        asn_table: AsnTable | None = None,
    ) -> None:
        if not salt:
            log.warning("EDGEQA_USER_SALT is not set: hashing users with a random per-process salt")
            salt = _PROCESS_SALT
        self.salt = salt.encode("utf-8") if isinstance(salt, str) else salt
        self.identity_secret = identity_secret
        self.trusted_proxies = tuple(_unmapped_network(net) for net in trusted_proxies)
        self.asn_table = asn_table

    def __call__(self, user: str) -> str:
        return hash_user(user, self.salt)

    def tenant(self, request: Request) -> str:
        """The request's ``x-edgeqa-tenant``, hashed as users are ("" without one): what logs
        and the origin's per-tenant scopes keep of it."""
        tenant = request.headers.get(TENANT_HEADER, "")
        return self(f"tenant:{tenant}") if tenant else ""

    def _trusted(self, address: Address | None) -> bool:
        return address is not None and any(address in net for net in self.trusted_proxies)

    def viewer(self, request: Request) -> Address | None:
        """The viewer's address: the peer unless the peer is a trusted proxy (see the module)."""
        peer = _address(request.client.host) if request.client else None
        if not self._trusted(peer):
            return peer
        cloudfront = _address(request.headers.get(VIEWER_HEADER, ""), with_port=True)
        if cloudfront is not None:
            return cloudfront
        hops = [_address(h) for h in _forwarded_hops(request)]
        for hop in reversed(hops):
            if hop is None:
                return peer  # a malformed chain: believe none of it
            if not self._trusted(hop):
                return hop
        return peer

    def of_request(
        self, request: Request, claimed: str | None = None, key_id: str | None = None
    ) -> Asker:
        """The hashed asker of an HTTP request; ``claimed``: the body's ``user`` field;
        ``key_id``: the API key it authenticated with, if any."""
        viewer = self.viewer(request)
        signed = _verified_user(request.headers.get(USER_HEADER), self.identity_secret)
        signed = signed or _verified_user(claimed, self.identity_secret)
        host = network_key(viewer) if viewer is not None else None
        if signed is not None:
            identity = f"user:{signed}"
        elif key_id:  # one key serves many people: each host behind it is one asker
            identity = f"key:{key_id}|ip:{host}"
        else:
            identity = f"ip:{host}" if host is not None else ""
        network = asn = ""
        if viewer is not None:
            network = self(f"net:{network_key(viewer, NETWORK_BITS)}")
            number = self.asn_table.lookup(viewer) if self.asn_table is not None else 0
            asn = self(f"as:{number}") if number else ""
        return Asker(self(identity), network, signed is not None, asn)


def user_hasher(settings: SharedSettings) -> UserHasher:
    """Who asked, as the deployment's settings decide it (the AS table read once, here)."""
    from base.asn import read_asn_table

    return UserHasher(
        settings.user_salt,
        settings.identity_secret,
        parse_networks(settings.trusted_proxies),
        read_asn_table(settings.asn_table) if settings.asn_table else None,
    )
