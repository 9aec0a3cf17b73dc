"""Carried evidence: the asks behind the parent release's clusters, merged into tonight's.

Answers served from the CDN are never logged, so a published question would drop below k the
night after and come back the night after that. The wordings of the clusters the parent
release's run mined, published or held back (its private ``hot/``: hashed users, networks,
signed users and autonomous systems with the time of their latest ask), are carried into
tonight's log window (``logwindow.py``), which merges them per user (signed or not), network and
AS, keeping the latest ask. Here, before that: today's text rules are applied to each carried
wording again (a rule added since may exclude it), and an ask older than ``carry_half_lives``
half-lives (weight ``0.5 ** carry_half_lives``, 1/16: 28 days at the default 7-day half-life)
is dropped, so a cluster nobody asks for fades out. The parent's wordings are read a part of
``hot/`` at a time (``parent.parent_phrasings``) and what is carried is held as Arrow, made a
batch at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from precompute.asks import recency_weight, to_us
from precompute.config import MiningConfig
from precompute.textrules import text_problem

if TYPE_CHECKING:
    import pyarrow as pa

    from precompute.questions import Phrasing

BATCH_ROWS = 65_536  # carried rows held as Python lists before they become an Arrow batch


def carried_schemas() -> dict[str, pa.Schema]:
    """The tables of carried evidence a window takes (``carry.py``): wordings, and each
    user's (network's, AS's) latest ask of each, ts in µs since the epoch, and whether the user
    was signed."""
    import pyarrow as pa

    string, integer = pa.string(), pa.int64()
    return {
        "carried": pa.schema([("key", string), ("normalized", string), ("question", string)]),
        "carried_users": pa.schema(
            [("key", string), ("user", string), ("ts", integer), ("signed", pa.bool_())]
        ),
        "carried_networks": pa.schema([("key", string), ("network", string), ("ts", integer)]),
        "carried_asns": pa.schema([("key", string), ("asn", string), ("ts", integer)]),
    }


@dataclass
class Carried:
    """The carried evidence, as the log window takes it (``tables``), and what carrying it
    counted: wordings left out by a text rule, by reason; wordings carried (with an ask young
    enough); asks dropped as too old."""

    tables: dict[str, pa.Table]
    excluded_phrasings: dict[str, int] = field(default_factory=dict)
    carried_phrasings: int = 0
    expired_users: int = 0


def carry(parent: Iterable[Phrasing], config: MiningConfig, now: datetime) -> Carried:
    """The parent run's wordings (``parent``) that still count tonight."""
    import pyarrow as pa

    floor = math.pow(0.5, config.carry_half_lives)
    schemas = carried_schemas()
    columns: dict[str, dict[str, list[Any]]] = {
        name: {f.name: [] for f in schema} for name, schema in schemas.items()
    }
    batches: dict[str, list[pa.RecordBatch]] = {name: [] for name in schemas}
    done = Carried({})

    def young(times: Mapping[str, datetime]) -> dict[str, datetime]:
        return {
            name: ts
            for name, ts in times.items()
            if recency_weight(ts, now, config.half_life_days) >= floor
        }

    def flush(name: str) -> None:  # the Python lists into Arrow, a batch at a time
        batches[name].append(pa.record_batch(columns[name], schema=schemas[name]))
        columns[name] = {f.name: [] for f in schemas[name]}

    for old in parent if config.carry_half_lives > 0 else ():
        problem = text_problem(old.question)  # today's rules, which may be stricter
        if problem:
            done.excluded_phrasings[problem[0]] = done.excluded_phrasings.get(problem[0], 0) + 1
            continue
        users = young(old.latest_by_user)
        done.expired_users += len(old.latest_by_user) - len(users)
        if not users:
            continue
        done.carried_phrasings += 1
        for name, value in (("key", old.key), ("normalized", old.normalized)):
            columns["carried"][name].append(value)
        columns["carried"]["question"].append(old.question)
        for who, asks in (
            ("user", users),
            ("network", young(old.latest_by_network)),
            ("asn", young(old.latest_by_asn)),
        ):
            table = f"carried_{who}s"
            for name, ts in asks.items():
                columns[table]["key"].append(old.key)
                columns[table][who].append(name)
                columns[table]["ts"].append(to_us(ts))
                if who == "user":
                    columns[table]["signed"].append(name in old.latest_by_signer)
        for name in schemas:
            if len(columns[name]["key"]) >= BATCH_ROWS:
                flush(name)
    for name in schemas:
        flush(name)
    done.tables = {
        name: pa.Table.from_batches(batches[name], schema=schema)
        for name, schema in schemas.items()
    }
    return done
