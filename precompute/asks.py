"""An ask's time: as the log window stores it (microseconds since the epoch, UTC) and what it
weighs in the ranking and in carried evidence (its recency)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from base.logs import as_utc


def recency_weight(ts: datetime, now: datetime, half_life_days: float) -> float:
    """What an ask counts for ``now``: ``0.5 ** (age / half_life)``, 1 for one not in the past."""
    return math.pow(0.5, max((now - ts).total_seconds(), 0.0) / 86400 / half_life_days)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(ts: datetime) -> int:
    """Microseconds since the epoch (UTC), exactly."""
    delta = as_utc(ts) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(value: int) -> datetime:
    """The instant ``value`` microseconds after the epoch (UTC), exactly (the k step converts
    every kept asker's: the epoch is made once)."""
    return _EPOCH + timedelta(microseconds=value)
