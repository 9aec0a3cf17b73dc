"""Who asked: identities a client cannot mint, viewers from the trusted proxy chain only, and the
k-anonymity they feed: forged ids publish nothing, real people do."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from base.config import ConfigError, EdgeSettings, parse_networks
from base.logreader import read_logs
from base.logs import LogWriter
from base.store import FileStore
from base.users import UserHasher, mint_user_token, user_hasher
from edge_index.server.app import create_app
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
from precompute.config import MiningConfig
from precompute.mining import mine
from tests.serving import Server

if TYPE_CHECKING:
    from base.asn import AsnTable

SECRET = "s" * 40
QUESTION = "How do I change my delivery address?"


def _request(peer: str, headers: dict[str, str] | list[tuple[str, str]] | None = None) -> Request:
    """A request from ``peer``; ``headers`` as pairs may repeat a name, one line each."""
    pairs = list(headers.items()) if isinstance(headers, dict) else headers or []
    raw = [(k.lower().encode(), v.encode()) for k, v in pairs]
    return Request({"type": "http", "headers": raw, "client": (peer, 5000), "method": "GET"})


def test_client_supplied_ids_count_only_when_signed() -> None:
    users, peer = UserHasher("salt-0123456789abcdef", SECRET), "198.51.100.7"
    forged = {
        users.of_request(_request("198.51.100.7", {"x-edgeqa-user": f"u{i}"})) for i in range(5)
    }
    assert len(forged) == 1  # five made-up ids from one address: one asker, the address
    tokens = [mint_user_token(f"u{i}", SECRET) for i in range(5)]
    signed = {users.of_request(_request("198.51.100.7", {"x-edgeqa-user": t})).user for t in tokens}
    assert len(signed) == 5
    # the body's user field is held to the same rule
    by_body = users.of_request(_request("198.51.100.7"), claimed=tokens[0]).user
    assert by_body == users.of_request(_request("198.51.100.7", {"x-edgeqa-user": tokens[0]})).user
    # signed with another secret, expired, or not a token at all: the address again
    address = users.of_request(_request("198.51.100.7")).user
    expired = mint_user_token("u0", SECRET, ttl_s=-120)  # past the minute of allowed skew
    for bad in (mint_user_token("u0", "o" * 40), expired, "u0", "a.b.c", "x" * 10_000):
        assert users.of_request(_request("198.51.100.7", {"x-edgeqa-user": bad})).user == address
    # without a secret no client id counts, signed or not
    assert len({UserHasher("salt-0123456789abcdef").of_request(
        _request("198.51.100.7", {"x-edgeqa-user": t})).user for t in tokens}) == 1  # fmt: skip
    # an API key is one backend: its calls are one asker unless it signs its users
    assert users.of_request(_request("198.51.100.7"), key_id="k1").user != address
    with pytest.raises(ValueError, match="at least 32"):
        mint_user_token("u0", "short")
    # a backend clock a little ahead still counts its users
    import jwt

    now = int(time.time())
    ahead = jwt.encode({"sub": "u9", "iat": now + 5, "exp": now + 600}, SECRET, "HS256")
    address = users.of_request(_request(peer)).user
    assert users.of_request(_request(peer, {"x-edgeqa-user": ahead})).user != address
    # a token without iat, or one that lives longer than a day, counts nothing
    forever = jwt.encode({"sub": "u9", "iat": now, "exp": now + 86_401}, SECRET, "HS256")
    no_iat = jwt.encode({"sub": "u9", "exp": now + 600}, SECRET, "HS256")
    for bad in (forever, no_iat):
        assert users.of_request(_request(peer, {"x-edgeqa-user": bad})).user == address
    with pytest.raises(ValueError, match="at most"):
        mint_user_token("u0", SECRET, ttl_s=2 * 86_400)


def test_the_viewer_comes_from_trusted_proxies_only() -> None:
    trusting = UserHasher("salt-0123456789abcdef", "", parse_networks("10.0.0.0/8, 192.0.2.1"))
    spoofed = {"x-forwarded-for": "203.0.113.5", "cloudfront-viewer-address": "203.0.113.6:443"}
    # a client's own forwarding headers are never believed
    assert str(trusting.viewer(_request("198.51.100.7", spoofed))) == "198.51.100.7"
    # from a trusted proxy: CloudFront's viewer header, else the right-most untrusted hop
    assert str(trusting.viewer(_request("10.1.2.3", spoofed))) == "203.0.113.6"
    chain = {"x-forwarded-for": "203.0.113.99, 203.0.113.5, 10.0.0.9"}
    assert str(trusting.viewer(_request("10.1.2.3", chain))) == "203.0.113.5"
    assert str(trusting.viewer(_request("192.0.2.1", {"x-forwarded-for": "junk"}))) == "192.0.2.1"
    for header in ("[2001:db8::1]:443", "2001:db8::1:443", "2001:db8::1:54321"):
        v6 = {"cloudfront-viewer-address": header}  # CloudFront writes IPv6 unbracketed
        assert str(trusting.viewer(_request("10.1.2.3", v6))) == "2001:db8::1", header
    # one network per /24 (IPv4) or /48 (IPv6)
    net = [trusting.of_request(_request(a)).network for a in ("203.0.113.5", "203.0.113.250")]
    assert net[0] == net[1] and net[0] != trusting.of_request(_request("203.0.114.5")).network
    with pytest.raises(ConfigError, match="EDGEQA_TRUSTED_PROXIES"):
        EdgeSettings.from_env({"EDGEQA_TRUSTED_PROXIES": "10.0.0.0/8, not-a-network"})
    with pytest.raises(ConfigError, match="EDGEQA_IDENTITY_SECRET"):
        EdgeSettings.from_env({"EDGEQA_IDENTITY_SECRET": "too-short"})


def _logged(
    tmp_path: Path, trusted: str, asks: list[tuple[str, list[tuple[str, str]]]]
) -> list[tuple[str, str]]:
    """Each of ``asks`` (peer, header lines) looks ``QUESTION`` up at the real edge app behind
    ``trusted`` proxies; the (user, network) the request log holds for each, in order."""
    store = FileStore(tmp_path / "store")
    unused = lambda: pytest.fail("no release is served: nothing to embed")  # noqa: E731
    watcher = ReleaseWatcher(store, "p", unused, poll_s=3600, metrics_prefix=EDGE_METRICS)
    users = UserHasher("salt-0123456789abcdef", SECRET, parse_networks(trusted))
    logs = LogWriter(store, source="edge", flush_interval_s=0)
    app = create_app(watcher, logs, users=users)
    for i, (peer, headers) in enumerate(asks):
        client = TestClient(app, client=(peer, 5000))
        lines = [*headers, ("x-edgeqa-tenant", str(i))]  # which ask a log row is
        response = client.get("/v1/lookup", params={"q": QUESTION}, headers=lines)
        assert response.status_code == 404  # nothing published: a miss, logged
    logs.close()
    today = datetime.now(UTC).date()
    rows = {r["tenant"]: r for r in read_logs(store, today - timedelta(days=1), today)}
    assert len(rows) == len(asks)
    tenants = [users(f"tenant:{i}") for i in range(len(asks))]  # logged hashed, as users are
    return [(rows[t]["user"], rows[t]["network"]) for t in tenants]


def test_one_ipv6_host_is_one_asker_whatever_address_of_its_64_it_uses(tmp_path: Path) -> None:
    # one host is routed a /64 and may use any address in it (privacy addresses rotate at will)
    same_64 = ["2001:db8:1:2::1", "2001:db8:1:2:8a5c:1f:e3:9", "2001:db8:1:2:ffff:ffff:ffff:ffff"]
    other_64 = "2001:db8:1:3::1"  # another host of the same /48 site
    users = UserHasher("salt-0123456789abcdef", SECRET)
    askers = [users.of_request(_request(peer)) for peer in [*same_64, other_64]]
    assert len({a.user for a in askers[:3]}) == 1 and askers[3].user != askers[0].user
    assert len({a.network for a in askers}) == 1  # one /48: one network, as before
    # behind an API key each host is still one asker
    keyed = {users.of_request(_request(peer), key_id="k1").user for peer in [*same_64, other_64]}
    assert len(keyed) == 2
    # what the edge service logs (and mining counts): the same asker for the whole /64
    logged = _logged(tmp_path, "", [(peer, []) for peer in [*same_64, other_64]])
    assert len({user for user, _ in logged[:3]}) == 1 and logged[3][0] != logged[0][0]
    assert logged[0][0] == askers[0].user
    # IPv4 is unchanged: each address one asker, each /24 one network
    v4 = [users.of_request(_request(peer)) for peer in ("203.0.113.5", "203.0.113.6")]
    assert v4[0].user != v4[1].user and v4[0].network == v4[1].network


def test_an_ipv4_mapped_peer_is_its_ipv4_address(tmp_path: Path) -> None:
    # a dual-stack socket reports an IPv4 proxy as ::ffff:10.0.0.1: still the trusted proxy
    trusting = UserHasher("salt-0123456789abcdef", SECRET, parse_networks("10.0.0.0/8"))
    chain = {"x-forwarded-for": "203.0.113.99, 203.0.113.5"}
    assert str(trusting.viewer(_request("::ffff:10.0.0.1", chain))) == "203.0.113.5"
    assert str(trusting.viewer(_request("::ffff:198.51.100.7", chain))) == "198.51.100.7"
    # a proxy listed IPv4-mapped matches the same peers
    mapped = UserHasher("salt-0123456789abcdef", SECRET, parse_networks("::ffff:10.0.0.0/104"))
    assert str(mapped.viewer(_request("10.0.0.1", chain))) == "203.0.113.5"
    # through the edge app: the hop left of the mapped proxy is the asker, in its own /24
    logged = _logged(
        tmp_path,
        "10.0.0.0/8",
        [
            ("::ffff:10.0.0.1", [("x-forwarded-for", "203.0.113.5")]),
            ("203.0.113.5", []),
            ("::ffff:203.0.113.6", []),
        ],
    )
    assert logged[0] == logged[1]
    assert logged[2][1] == logged[1][1] and logged[2][0] != logged[1][0]


def test_x_forwarded_for_is_read_over_every_header_line(tmp_path: Path) -> None:
    trusting = UserHasher("salt-0123456789abcdef", SECRET, parse_networks("10.0.0.0/8"))
    # the client's forged line first, the trusted proxy's appended line second
    lines = [("x-forwarded-for", "198.51.100.66"), ("x-forwarded-for", "203.0.113.5")]
    assert str(trusting.viewer(_request("10.0.0.2", lines))) == "203.0.113.5"
    # the right-most untrusted hop over all lines, past trusted ones in any line
    hops = [("x-forwarded-for", "198.51.100.66, 203.0.113.5"), ("x-forwarded-for", "10.0.0.9")]
    assert str(trusting.viewer(_request("10.0.0.2", hops))) == "203.0.113.5"
    # a forged trusted address in the first line does not make the chain the client's
    trusted_first = [("x-forwarded-for", "10.9.9.9"), ("x-forwarded-for", "203.0.113.5")]
    assert str(trusting.viewer(_request("10.0.0.2", trusted_first))) == "203.0.113.5"
    # junk in any line: believe none of it
    junk = [("x-forwarded-for", "203.0.113.5"), ("x-forwarded-for", "junk")]
    assert str(trusting.viewer(_request("10.0.0.2", junk))) == "10.0.0.2"
    # through the edge app, the lines as a client and a proxy send them
    logged = _logged(tmp_path, "10.0.0.0/8", [("10.0.0.2", lines), ("203.0.113.5", [])])
    assert logged[0] == logged[1]


def _asks(
    embedder: Any,
    tmp_path: Path,
    askers: list[dict[str, str]],
    asn_table: AsnTable | None = None,
    config: MiningConfig | None = None,
) -> bool:
    """Each of ``askers`` (request headers) looks ``QUESTION`` up at an edge behind a trusted
    proxy (the test client, on loopback), which looks viewers' ASes up in ``asn_table``; whether
    the nightly mining (``config``: k=5 and the default crowd rule) would publish it."""
    store = FileStore(tmp_path / "store")
    watcher = ReleaseWatcher(store, "p", embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    users = UserHasher("salt-0123456789abcdef", SECRET, parse_networks("127.0.0.1"), asn_table)
    logs = LogWriter(store, source="edge", flush_interval_s=0)
    with Server(create_app(watcher, logs, users=users)) as server:
        for headers in askers:
            response = httpx.get(f"{server.url}/v1/lookup", params={"q": QUESTION}, headers=headers)
            assert response.status_code == 404  # nothing published yet: a miss, logged
    logs.close()
    today = datetime.now(UTC).date()
    rows = [
        {**r, "tier": "generated", "status": 200}  # what the origin logs for the same ask
        for r in read_logs(store, today - timedelta(days=1), today)
    ]
    assert len(rows) == len(askers)
    config = config or MiningConfig(cluster_threshold=0.9, k=5)
    hot, _ = mine(rows, None, config, datetime.now(UTC))
    return any(h.question == QUESTION for h in hot)


def test_five_forged_ids_publish_nothing_and_five_real_people_do(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # one client, five made-up ids and forwarding chains; the proxy appends the address it saw
    forged = [
        {"x-edgeqa-user": f"user-{i}", "x-forwarded-for": f"203.0.{i}.1, 198.51.100.7"}
        for i in range(5)
    ]
    assert not _asks(embedder, tmp_path / "forged", forged)
    one_office = [
        {"x-edgeqa-user": mint_user_token(f"user-{i}", SECRET), "x-forwarded-for": f"203.0.113.{i}"}
        for i in range(5)
    ]
    assert not _asks(embedder, tmp_path / "office", one_office)  # five people, one /24
    real = [
        {"x-edgeqa-user": mint_user_token(f"user-{i}", SECRET), "x-forwarded-for": f"203.0.{i}.9"}
        for i in range(5)
    ]
    assert _asks(embedder, tmp_path / "real", real)


def test_five_networks_of_one_attacker_publish_nothing_and_real_people_still_do(  # type: ignore[no-untyped-def]
    embedder, tmp_path: Path
) -> None:
    """Five /24s are five cloud regions or free tunnels away: through a real edge, its logs and
    the nightly mining, an attacker's five addresses publish nothing he wrote, and five people
    the deployment signed tokens for, from five /24s, still publish their question. Where the
    AS rule is on, five /24s of one AS count as one, five ASes as five."""
    rented = [{"x-forwarded-for": f"203.0.{i}.1"} for i in range(5)]  # no token: addresses
    assert not _asks(embedder, tmp_path / "rented", rented)
    people = [
        {"x-edgeqa-user": mint_user_token(f"user-{i}", SECRET), "x-forwarded-for": f"203.0.{i}.9"}
        for i in range(5)
    ]
    assert _asks(embedder, tmp_path / "people", people)

    # 203.0.0.0-203.0.4.255 is one cloud's AS; 198.51.100.0/24 and on, one AS each
    from base.asn import read_asn_table

    table_path = tmp_path / "ip2asn.tsv"
    table_path.write_text(
        "203.0.0.0\t203.0.4.255\t64500\tZZ\tRENT-A-CLOUD\n"
        + "".join(
            f"198.51.{100 + i}.0\t198.51.{100 + i}.255\t{64510 + i}\tZZ\tISP\n" for i in range(5)
        )
    )
    table = read_asn_table(table_path)
    by_as = MiningConfig(cluster_threshold=0.9, k=5, min_asns=3)
    assert not _asks(embedder, tmp_path / "one-as", people, table, by_as)  # signed, one cloud
    spread = [
        {
            "x-edgeqa-user": mint_user_token(f"user-{i}", SECRET),
            "x-forwarded-for": f"198.51.{100 + i}.9",
        }
        for i in range(5)
    ]
    assert _asks(embedder, tmp_path / "five-ases", spread, table, by_as)
    # the deployment's settings name the table; the services hash the AS like the network
    settings = EdgeSettings.from_env(
        {"EDGEQA_ASN_TABLE": str(table_path), "EDGEQA_USER_SALT": "salt-0123456789abcdef"}
    )
    asker = user_hasher(settings).of_request(_request("198.51.100.7"))
    assert asker.asn == user_hasher(settings)("as:64510") and not asker.signed
    assert user_hasher(settings).of_request(_request("192.0.2.1")).asn == ""  # not in the table


def test_one_identity_cannot_fill_a_night() -> None:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    base = {"ts": now, "turns": 1, "tier": "generated", "status": 200}
    flood = [
        {**base, "user": "attacker", "network": "n0", "query": f"Buy cheap thing number {i}?"}
        for i in range(50)
    ]
    config = MiningConfig(cluster_threshold=0.9, k=1, max_rows_per_user=10, min_signed_users=0)
    hot, report = mine(flood, None, config, now)
    assert len(hot) == 10 and report.excluded_rows["over_user_share"] == 40
