"""What k-anonymity of published text means, read from the logs independently of mining: who
typed each content token, and the tokens that fewer than k people typed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from policy.pii import find_pii
from semantic.guard import content_tokens


def typed_by(rows: Iterable[dict[str, Any]]) -> dict[str, set[str]]:
    """Each content token of the logged questions -> the users who typed it (in single-turn,
    successful rows without personal data: the asks mining reads)."""
    users: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if (row.get("turns") or 1) > 1 or (row.get("status") or 200) >= 400:
            continue
        if find_pii(row["query"]):
            continue
        for token in content_tokens(row["query"]):
            users[token].add(row["user"])
    return users


def rare_tokens(rows: Iterable[dict[str, Any]], k: int) -> set[str]:
    """The tokens typed by at least one and fewer than ``k`` people."""
    return {token for token, users in typed_by(rows).items() if len(users) < k}
