"""What a request log keeps of a row: personal data never, and only text a file can hold.

A question in which ``policy.pii`` finds personal data is kept as ``[personal data: <kinds>]``
(its ``normalized`` form and key emptied), so raw personal data never reaches the spill folder or
the store; mining counts it from that marker (``redacted_kinds``). Every string is made valid
UTF-8 (a lone surrogate, which a client can send in JSON, becomes ``?``): one bad row must not
make a whole batch unwritable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_REDACTED = re.compile(r"\[personal data: ([a-z_]+(?:, [a-z_]+)*)\]")


def redacted(query: str) -> str:
    """The question, or ``[personal data: <kinds>]`` when it holds any."""
    from policy.pii import find_pii

    kinds = find_pii(query)
    return f"[personal data: {', '.join(kinds)}]" if kinds else query


def redacted_kinds(query: str) -> list[str] | None:
    """The kinds a redacted question named; None for a question that was not redacted."""
    match = _REDACTED.fullmatch(query)
    return match.group(1).split(", ") if match else None


def loggable(row: dict[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    """``row``'s ``columns`` as a log file keeps them (missing ones None)."""
    record = {
        c: v.encode("utf-8", "replace").decode("utf-8") if isinstance(v, str) else v
        for c, v in ((c, row.get(c)) for c in columns)
    }
    query = record.get("query")
    safe = redacted(query) if isinstance(query, str) and query else query
    if safe != query:
        record.update(query=safe, normalized="", key="")
    return record
