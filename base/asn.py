"""Autonomous systems: which network operator announces a viewer's address, from a local table.

Mining can require a question's askers to come from several autonomous systems
(``EDGEQA_MIN_ASNS``): five /24s rented in five regions of one cloud are one AS, so they count
once. The services look the viewer's AS up in a table the operator supplies
(``EDGEQA_ASN_TABLE``) and log it hashed (``users.Asker.asn``); nothing is downloaded at run time,
and without a table nothing is looked up (the AS rule is then off, or publishes nothing).

The table is a text file, optionally gzipped, one address range a line: first address, last
address, AS number, separated by tabs or commas; further columns (country, the AS's name) and
lines starting with ``#`` are ignored. iptoasn.com's ``ip2asn-combined.tsv.gz`` (public domain,
IPv4 and IPv6) is in this form as downloaded; a MaxMind GeoLite2-ASN CSV converts to it with
one line of ``awk``. AS number 0 (not routed) means unknown.

Lookups bisect sorted arrays: IPv4 ranges by address, IPv6 ranges by their first 64 bits (routed
IPv6 prefixes are /48 or shorter, so no two ASes share a /64). ~500,000 ranges take ~10 MB.
"""

from __future__ import annotations

import bisect
import gzip
import ipaddress
from array import array
from collections.abc import Iterable
from pathlib import Path

from base.config import ConfigError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AsnTable:
    """Address ranges and the AS announcing each: ``lookup(address)``, 0 when unknown."""

    def __init__(self, ranges: Iterable[tuple[str, str, int]]) -> None:
        v4: list[tuple[int, int, int]] = []
        v6: list[tuple[int, int, int]] = []
        for first, last, asn in ranges:
            start, end = ipaddress.ip_address(first), ipaddress.ip_address(last)
            if start.version != end.version or int(end) < int(start):
                raise ValueError(f"{first}-{last} is not an address range")
            if start.version == 4:
                v4.append((int(start), int(end), asn))
            else:
                v6.append((int(start) >> 64, int(end) >> 64, asn))
        self._v4 = _Ranges(v4)
        self._v6 = _Ranges(v6)

    def __len__(self) -> int:
        return len(self._v4) + len(self._v6)

    def lookup(self, address: Address) -> int:
        """The AS number announcing ``address``; 0 when the table has none."""
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is None:
                return self._v6.find(int(address) >> 64)
            address = address.ipv4_mapped
        return self._v4.find(int(address))


class _Ranges:
    """Non-overlapping ``[start, end] -> asn`` ranges, sorted by start (``array``: 20 bytes a
    range instead of ~100 as Python ints)."""

    def __init__(self, ranges: list[tuple[int, int, int]]) -> None:
        ranges.sort()
        self.starts = array("Q", (r[0] for r in ranges))
        self.ends = array("Q", (r[1] for r in ranges))
        self.asns = array("L", (r[2] for r in ranges))

    def __len__(self) -> int:
        return len(self.starts)

    def find(self, value: int) -> int:
        at = bisect.bisect_right(self.starts, value) - 1
        return self.asns[at] if at >= 0 and value <= self.ends[at] else 0


def _fields(line: str) -> list[str]:
    return [f.strip() for f in (line.split("\t") if "\t" in line else line.split(","))]


def read_asn_table(path: str | Path) -> AsnTable:
    """The table at ``path`` (see the module); ``ConfigError`` naming the file and the line
    when it is not one."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    ranges = []
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip() or line.startswith("#"):
                    continue
                fields = _fields(line)
                try:
                    asn = int(fields[2].upper().removeprefix("AS"))
                    if not 0 <= asn < 2**32:
                        raise ValueError("not a 32-bit AS number")
                    ipaddress.ip_address(fields[0])
                except (IndexError, ValueError):
                    if number == 1:
                        continue  # a header line
                    raise ConfigError(
                        f"EDGEQA_ASN_TABLE: {path} line {number} is not "
                        "'first address, last address, AS number'"
                    ) from None
                ranges.append((fields[0], fields[1], asn))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"EDGEQA_ASN_TABLE: cannot read {path}: {error}") from None
    try:
        return AsnTable(ranges)
    except ValueError as error:
        raise ConfigError(f"EDGEQA_ASN_TABLE: {path}: {error}") from None
