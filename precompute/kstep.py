"""Mining's k step, cluster by cluster, on processes: rules 6-8 for each candidate cluster.

For each cluster whose wordings' askers may add up to k (``mining._qualifying`` drops the others
first, from counts alone), ``judge_cluster`` decides, from its wordings alone: below k (its
askers, each identity once: rule 6), an unverified crowd (rule 6's crowd rule), or what it may
publish (rule 7, ``safetext.publishable_parts``) and its score (rule 8). That is all but one
decision: a question built from k-safe tokens may not take a key in use, which depends on the
clusters before it (the night's keys and the questions built before); the judgement carries the
built question's candidates, best first, and ``mining`` takes the first whose key is free, in
the clusters' order, as one process did. So the result is the same on any number of processes.

The wordings go to the processes as they come out of the window's database (``Wordings.picked``):
Arrow tables of whole clusters (``cluster_chunks``, ``CHUNK_WORDINGS`` wordings or so), each
turned into ``Phrasing``s and judged there (``judge_chunk``), at most two chunks a process in
flight; the judgements come back in order. Processes are started (spawned: the mining process
holds DuckDB's and torch's threads) only for more than ``MANY_WORDINGS`` candidate wordings and
``MIN_PROCESSES`` CPUs or more; else the clusters are judged in this process, with the same
functions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from precompute.asks import recency_weight
from precompute.config import MiningConfig
from precompute.questions import Phrasing, askers_count, crowd
from precompute.safetext import publishable_parts

if TYPE_CHECKING:
    import pyarrow as pa

# wordings handed to a process at a time (whole clusters: a chunk may hold more)
CHUNK_WORDINGS = 4096
# candidate wordings from which the k step starts processes (fewer: this process judges them)
MANY_WORDINGS = 50_000
# the fewest processes worth starting: the mining process takes every judgement back (4.5 KB a
# cluster of the synthetic logs: 22,707 clusters/s, against 4,593 judged/s by one process), so on
# 2 CPUs two processes judged no faster than one (0.92x, ``scale.py --kstep 300000``)
MIN_PROCESSES = 4


@dataclass
class Judged:
    """What rules 6-8 decided of a cluster: ``status`` ``below_k``, ``unverified_crowd`` or
    ``qualifying`` (reached k with a verified crowd); how many wordings it has and their rows
    (``hits``); its askers, signed users and ASes; and, qualifying, what it publishes
    (``published``, or else the built question's ``candidates``, best first), what it holds
    back (``rare``: rare tokens of each) and its score. No wording comes back but those."""

    status: str
    count: int
    hits: int
    users: int = 0
    signers: int = 0
    asns: int = 0
    score: float = 0.0
    published: list[Phrasing] = field(default_factory=list)
    held_back: list[Phrasing] = field(default_factory=list)
    rare: dict[str, int] = field(default_factory=dict)
    candidates: list[str] = field(default_factory=list)


def askers_and_score(
    wordings: Sequence[Phrasing], now: datetime, half_life_days: float
) -> tuple[int, float]:
    """A cluster's askers (each identity once, whichever wordings it typed) and its score: over
    its distinct users, each one's latest ask's recency weight, scaled down when they come from
    fewer networks than users. The askers beyond those kept count and weigh per wording."""
    latest: dict[str, datetime] = {}
    networks: set[str] = set()
    more_users = more_networks = 0
    more_weight = 0.0
    for wording in wordings:
        networks |= wording.networks
        for user, ts in wording.latest_by_user.items():
            if user not in latest or ts > latest[user]:
                latest[user] = ts
        more_users += wording.more_users
        more_networks += wording.more_networks
        more_weight += wording.more_weight
    user_count = len(latest) + more_users
    users = askers_count(user_count, len(networks) + more_networks)
    weight = sum(recency_weight(ts, now, half_life_days) for ts in latest.values()) + more_weight
    return users, weight * (users / max(user_count, 1))  # many users from few networks weigh as few


def judge_cluster(wordings: list[Phrasing], config: MiningConfig, now: datetime) -> Judged:
    """Rules 6-8 for one cluster, from its wordings alone (see the module's docstring)."""
    count, hits = len(wordings), sum(w.hits for w in wordings)
    users, score = askers_and_score(wordings, now, config.half_life_days)
    if users < config.k:
        return Judged("below_k", count, hits, users)
    signers, asns = crowd(wordings)
    if not config.verified_crowd(signers, asns):
        return Judged("unverified_crowd", count, hits, users, signers, asns)
    published, held_back, rare, candidates = publishable_parts(wordings, config)
    return Judged(
        "qualifying", count, hits, users, signers, asns, score, published, held_back, rare,
        candidates,
    )  # fmt: skip


def judge_chunk(
    batch: pa.Table, sizes: Sequence[int], config: MiningConfig, now: datetime
) -> list[Judged]:
    """``judge_cluster`` for each cluster of ``batch`` (``Wordings.picked``'s rows: ``sizes[i]``
    wordings for the i-th cluster, in order)."""
    from precompute.reduction import phrasings_of

    members = phrasings_of(batch)
    if len(members) != sum(sizes):
        raise ValueError(f"a chunk of {len(members)} wordings for clusters of {sum(sizes)}")
    judged, at = [], 0
    for size in sizes:
        judged.append(judge_cluster(members[at : at + size], config, now))
        at += size
    return judged


def cluster_chunks(
    batches: Iterable[pa.Table], sizes: Iterable[int], wordings: int = CHUNK_WORDINGS
) -> Iterator[tuple[pa.Table, list[int]]]:
    """``batches`` of wordings (clusters' rows back to back, ``sizes`` each) cut into tables of
    whole clusters, of ``wordings`` wordings or a little more, with their clusters' sizes."""
    import pyarrow as pa

    source = iter(batches)
    pending: list[pa.Table] = []
    have = 0  # rows in pending
    chunk: list[int] = []
    rows = 0  # rows of pending the chunk's clusters hold

    def cut() -> pa.Table:
        nonlocal pending, have
        table = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
        rest = table.slice(rows)
        pending, have = ([rest] if rest.num_rows else []), rest.num_rows
        return table.slice(0, rows)

    for size in sizes:
        while have < rows + size:
            try:
                batch = next(source)
            except StopIteration:
                raise ValueError(f"the wordings ran out: {have} rows for {rows + size}") from None
            pending.append(batch)
            have += batch.num_rows
        chunk.append(size)
        rows += size
        if rows >= wordings:
            yield cut(), chunk
            chunk, rows = [], 0
    if chunk:
        yield cut(), chunk


def judge_all(
    chunks: Iterable[tuple[pa.Table, list[int]]],
    config: MiningConfig,
    now: datetime,
    workers: int = 1,
) -> Iterator[Judged]:
    """``judge_chunk`` over ``chunks`` (``cluster_chunks``), each cluster's judgement in order;
    on ``workers`` processes when more than one, at most two chunks each in flight."""
    if workers <= 1:
        for batch, sizes in chunks:
            yield from judge_chunk(batch, sizes, config, now)
        return
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # never a fork of a threaded process
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque[Future[list[Judged]]] = deque()
        for batch, sizes in chunks:
            pending.append(pool.submit(judge_chunk, batch, sizes, config, now))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
