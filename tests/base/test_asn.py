"""The AS table: iptoasn.com's file as downloaded (gzipped TSV, IPv4 and IPv6) read locally,
every address found in its range, anything else unknown, a broken file refused by line."""

from __future__ import annotations

import gzip
import ipaddress
from pathlib import Path

import pytest

from base.asn import AsnTable, read_asn_table
from base.config import ConfigError

# the lines of ip2asn-combined.tsv: first, last, AS number, country, AS description
LINES = (
    "1.0.0.0\t1.0.0.255\t13335\tUS\tCLOUDFLARENET\n"
    "1.0.1.0\t1.0.3.255\t0\tNone\tNot routed\n"
    "3.0.0.0\t3.127.255.255\t16509\tUS\tAMAZON-02\n"
    "2001:db8::\t2001:db8:0:ffff:ffff:ffff:ffff:ffff\t64496\tZZ\tDOC-A\n"
    "2001:db8:1::\t2001:db8:1:ffff:ffff:ffff:ffff:ffff\t64497\tZZ\tDOC-B\n"
)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_addresses_are_found_in_their_ranges(tmp_path: Path) -> None:
    path = tmp_path / "ip2asn-combined.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(LINES)
    table = read_asn_table(path)
    assert len(table) == 5
    # five regions of one cloud: one AS
    assert {table.lookup(_ip(a)) for a in ("3.0.0.1", "3.64.1.1", "3.127.255.255")} == {16509}
    assert table.lookup(_ip("1.0.0.7")) == 13335
    assert table.lookup(_ip("1.0.2.1")) == 0  # not routed: unknown
    assert table.lookup(_ip("3.128.0.0")) == 0  # past every range
    assert table.lookup(_ip("0.0.0.1")) == 0  # before every range
    assert table.lookup(_ip("2001:db8::42")) == 64496
    assert table.lookup(_ip("2001:db8:1:5::1")) == 64497
    assert table.lookup(_ip("2001:db8:2::1")) == 0
    assert table.lookup(_ip("::ffff:3.1.2.3")) == 16509  # an IPv4 viewer seen over IPv6
    # a comma-separated file with a header reads the same
    csv = tmp_path / "asn.csv"
    csv.write_text("start,end,asn\n" + LINES.replace("\t", ","))
    assert read_asn_table(csv).lookup(_ip("3.2.1.0")) == 16509


def test_a_broken_table_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "asn.tsv"
    path.write_text(LINES + "3.128.0.0\tnot-an-address\t16509\n")
    with pytest.raises(ConfigError, match=r"EDGEQA_ASN_TABLE: .*asn\.tsv: "):
        read_asn_table(path)
    path.write_text(LINES + "4.0.0.0\t4.0.0.255\tAS-many\n")
    with pytest.raises(ConfigError, match="line 6"):
        read_asn_table(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_asn_table(tmp_path / "missing.tsv")
    with pytest.raises(ValueError, match="not an address range"):
        AsnTable([("3.0.0.9", "3.0.0.1", 16509)])
