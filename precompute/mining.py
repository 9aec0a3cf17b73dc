"""Hot-question mining: which logged questions may be published, and which matter most.

Rules (``docs/precompute.md``, "Mining rules"), applied in this order, every exclusion counted
by reason:
1. ``failed_request``: rows whose request was rejected or failed (status >= 400, tier
   ``rejected``/``error``) do not count as asks.
   ``edge_miss``: an edge lookup that missed is not counted, the origin logs the same ask.
2. ``multi_turn``: ``turns > 1`` rows never publish (the question depends on the conversation).
3. ``pii``: a query with personal data (``edge_index.pii``) never publishes, counted per kind.
   ``time_sensitive``: nor one whose answer changes with the time it is asked
   (``edge_index.timeliness``: "today", "the latest", prices, weather, scores...), counted per kind.
4. ``invalid_query``: empty or over-long after normalizing (the key spec refuses it).
   ``over_user_share``: past ``max_rows_per_user`` rows from one user, or ``max_rows_per_network``
   from one network, in the window, the rest of theirs do not count: no one identity or network
   fills the night's release.
5. ``below_k``: a phrasing (one key) asked by fewer than ``k`` distinct askers is dropped; its
   askers are the fewer of its distinct users and its distinct networks (the viewer's /24 or /48,
   ``edge_index/users.py``), so neither one identity nor one network counts twice. Applied per
   phrasing, before clustering, so that every text that reaches the edge was typed by at least
   ``k`` people.
6. Near-duplicate phrasings that passed are clustered (embedder + FAISS inner product, cosine >=
   ``cluster_threshold``, numbers must match); the cluster is answered once, its canonical
   question being its most common phrasing (most distinct users, then most asks).
7. Ranking: over the cluster's distinct users, each contributes ``0.5 ** (age / half_life)`` of
   their latest ask — distinct users × recency decay, scaled down when they come from fewer
   networks than users. ``below_top_n``: clusters past ``top_n``.

Carried evidence (``carry``): answers served from the CDN are never logged, so a published
question would drop below ``k`` the night after and come back the night after that. Before rule 5,
the phrasings the parent release's run mined (its private ``hot.json``: hashed users and networks
with the time of their latest ask) are merged in, per user and per network, keeping the latest
time; an ask older than ``carry_half_lives`` half-lives (weight ``0.5 ** carry_half_lives``, 1/16:
28 days at the default 7-day half-life) is dropped, so a cluster nobody asks for fades out. The
text rules (3-4) are applied to carried phrasings again; rules 5-7 apply to them as to logged ones.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from edge_index.guard import numbers
from edge_index.keys import InvalidQueryError, key, normalize
from edge_index.pii import find_pii
from edge_index.redaction import redacted_kinds
from edge_index.timeliness import time_sensitive
from precompute.config import MiningConfig

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@dataclass
class Phrasing:
    key: str
    normalized: str
    question: str  # the most common raw form
    users: set[str]
    hits: int
    latest_by_user: dict[str, datetime]
    networks: set[str] = field(default_factory=set)
    latest_by_network: dict[str, datetime] = field(default_factory=dict)

    @property
    def askers(self) -> int:
        """Distinct people, as far as the logs can tell: users and networks, the fewer."""
        return min(len(self.users), len(self.networks)) if self.networks else len(self.users)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "normalized": self.normalized,
            "question": self.question,
            "users": sorted(self.users),
            "hits": self.hits,
            "latest_by_user": {u: t.isoformat() for u, t in self.latest_by_user.items()},
            "networks": sorted(self.networks),
            "latest_by_network": {n: t.isoformat() for n, t in self.latest_by_network.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Phrasing:
        latest = {u: datetime.fromisoformat(t) for u, t in d["latest_by_user"].items()}
        users, networks = set(d["users"]), set(d.get("networks", ()))
        by_network = {
            n: datetime.fromisoformat(t) for n, t in d.get("latest_by_network", {}).items()
        }
        if networks - set(by_network):  # mined before networks were dated: as old as the oldest ask
            oldest = min(latest.values())
            by_network.update({n: oldest for n in networks - set(by_network)})
        return cls(
            d["key"], d["normalized"], d["question"], users, d["hits"], latest, networks, by_network
        )


@dataclass
class HotQuestion:
    """A cluster of phrasings answered once."""

    canonical: Phrasing
    phrasings: list[Phrasing]  # canonical first
    users: int
    hits: int
    score: float

    @property
    def key(self) -> str:
        return self.canonical.key

    @property
    def question(self) -> str:
        return self.canonical.question

    def as_dict(self) -> dict[str, Any]:
        return {
            "phrasings": [p.as_dict() for p in self.phrasings],  # canonical first
            "users": self.users,
            "hits": self.hits,
            "score": self.score,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HotQuestion:
        phrasings = [Phrasing.from_dict(p) for p in d["phrasings"]]
        return cls(phrasings[0], phrasings, d["users"], d["hits"], d["score"])


@dataclass
class MiningReport:
    rows: int = 0
    excluded_rows: dict[str, int] = field(default_factory=dict)
    pii_by_kind: dict[str, int] = field(default_factory=dict)
    time_sensitive_by_kind: dict[str, int] = field(default_factory=dict)
    phrasings: int = 0
    excluded_phrasings: dict[str, int] = field(default_factory=dict)
    phrasings_kept: int = 0
    clusters: int = 0
    merged_phrasings: int = 0
    published_clusters: int = 0
    # carried evidence: the parent release it came from, its phrasings merged in (with at least
    # one ask young enough), the (phrasing, user) asks they added to the logs', and those too old
    carried_from: str | None = None
    carried_phrasings: int = 0
    carried_users: int = 0
    expired_users: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _exclude(counts: dict[str, int], reason: str, n: int = 1) -> None:
    counts[reason] = counts.get(reason, 0) + n


def recency_weight(ts: datetime, now: datetime, half_life_days: float) -> float:
    """What an ask counts for ``now``: ``0.5 ** (age / half_life)``, 1 for one not in the past."""
    return math.pow(0.5, max((now - ts).total_seconds(), 0.0) / 86400 / half_life_days)


def text_problem(query: str) -> tuple[str, list[str]] | None:
    """Rules 3-4 on a question's text: (reason, kinds) when it may not be published."""
    kinds = redacted_kinds(query) or find_pii(query)  # redacted when logged, or an old log
    if kinds:
        return "pii", list(kinds)
    timely = time_sensitive(query)
    if timely:
        return "time_sensitive", [timely]
    try:
        normalize(query)
    except InvalidQueryError:
        return "invalid_query", []
    return None


def collect_phrasings(
    rows: Iterable[dict[str, Any]], report: MiningReport, config: MiningConfig | None = None
) -> dict[str, Phrasing]:
    """Rules 1–4: group the usable rows by key."""
    config = config or MiningConfig()
    by_key: dict[str, Phrasing] = {}
    forms: dict[str, Counter[str]] = {}
    per_user: Counter[str] = Counter()
    per_network: Counter[str] = Counter()
    for row in rows:
        report.rows += 1
        if row.get("tier") == "miss":  # an edge miss: the origin logs the same ask
            _exclude(report.excluded_rows, "edge_miss")
            continue
        status = row.get("status") or 200
        if status >= 400 or row.get("tier") in ("rejected", "error"):
            _exclude(report.excluded_rows, "failed_request")
            continue
        if (row.get("turns") or 1) > 1:
            _exclude(report.excluded_rows, "multi_turn")
            continue
        query = str(row["query"])
        problem = text_problem(query)
        if problem:
            reason, kinds = problem
            _exclude(report.excluded_rows, reason)
            by_kind = report.pii_by_kind if reason == "pii" else report.time_sensitive_by_kind
            for kind in kinds:
                _exclude(by_kind, kind)
            continue
        normalized = normalize(query)
        user = str(row["user"])
        network = str(row.get("network") or "")  # "" in logs written before networks were
        per_user[user] += 1
        per_network[network] += 1 if network else 0
        if (
            per_user[user] > config.max_rows_per_user
            or per_network[network] > config.max_rows_per_network
        ):
            _exclude(report.excluded_rows, "over_user_share")
            continue
        k = key(query)
        phrasing = by_key.get(k)
        if phrasing is None:
            phrasing = by_key[k] = Phrasing(k, normalized, query.strip(), set(), 0, {})
            forms[k] = Counter()
        ts = row["ts"]
        phrasing.hits += 1
        network = network or f"user:{user}"
        phrasing.users.add(user)
        phrasing.networks.add(network)
        _keep_latest(phrasing.latest_by_user, user, ts)
        _keep_latest(phrasing.latest_by_network, network, ts)
        forms[k][" ".join(query.split())] += 1
    for k, phrasing in by_key.items():
        # most common raw form; ties broken by text so that reruns agree
        phrasing.question = min(forms[k].items(), key=lambda item: (-item[1], item[0]))[0]
    return by_key


def _keep_latest(times: dict[str, datetime], name: str, ts: datetime) -> bool:
    """Keep ``name``'s latest time; True if ``name`` is new."""
    new = name not in times
    if new or ts > times[name]:
        times[name] = ts
    return new


def carry(
    by_key: dict[str, Phrasing],
    parent: Iterable[Phrasing],
    report: MiningReport,
    config: MiningConfig,
    now: datetime,
) -> None:
    """Merge the parent run's phrasings into the logged ones (``by_key``), per user and per
    network, keeping the latest ask; asks older than ``carry_half_lives`` half-lives are dropped.
    A carried phrasing absent from the logs enters with 0 hits (hits are this window's asks)."""
    if config.carry_half_lives <= 0:
        return
    floor = math.pow(0.5, config.carry_half_lives)

    def young(times: dict[str, datetime]) -> dict[str, datetime]:
        return {
            name: ts
            for name, ts in times.items()
            if recency_weight(ts, now, config.half_life_days) >= floor
        }

    for old in parent:
        problem = text_problem(old.question)  # today's rules, which may be stricter
        if problem:
            _exclude(report.excluded_phrasings, problem[0])
            continue
        users = young(old.latest_by_user)
        report.expired_users += len(old.latest_by_user) - len(users)
        if not users:
            continue
        report.carried_phrasings += 1
        phrasing = by_key.get(old.key)
        if phrasing is None:
            phrasing = by_key[old.key] = Phrasing(
                old.key, old.normalized, old.question, set(), 0, {}
            )
        for user, ts in users.items():
            report.carried_users += _keep_latest(phrasing.latest_by_user, user, ts)
            phrasing.users.add(user)
        for network, ts in young(old.latest_by_network).items():
            _keep_latest(phrasing.latest_by_network, network, ts)
            phrasing.networks.add(network)


def cluster(
    phrasings: list[Phrasing], embedder: SentenceTransformer | None, config: MiningConfig
) -> list[list[Phrasing]]:
    """Greedy clustering, most popular first: each unassigned phrasing opens a cluster and takes
    every unassigned neighbour at cosine >= threshold whose numbers match."""
    if not phrasings:
        return []
    order = sorted(phrasings, key=lambda p: (-p.askers, -p.hits, p.key))
    if embedder is None or len(order) == 1:
        return [[p] for p in order]
    import faiss
    import numpy as np

    vectors = embedder.encode(
        [p.normalized for p in order],
        batch_size=config.embed_batch,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    ).astype(np.float32)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    lims, _scores, ids = index.range_search(vectors, config.cluster_threshold)
    assigned = [False] * len(order)
    clusters = []
    for i, head in enumerate(order):
        if assigned[i]:
            continue
        assigned[i] = True
        members = [head]
        head_numbers = numbers(head.normalized)
        neighbours = sorted(
            (int(j) for j in ids[lims[i] : lims[i + 1]] if int(j) != i), key=lambda j: j
        )
        for j in neighbours:
            if not assigned[j] and numbers(order[j].normalized) == head_numbers:
                assigned[j] = True
                members.append(order[j])
        clusters.append(members)
    return clusters


def mine(
    rows: Iterable[dict[str, Any]],
    embedder: SentenceTransformer | None,
    config: MiningConfig | None = None,
    now: datetime | None = None,
    carried: Iterable[Phrasing] = (),
) -> tuple[list[HotQuestion], MiningReport]:
    """The hot questions to answer, best first, and the report of what was excluded and why.
    ``carried``: the parent run's phrasings, whose evidence is merged in (``carry``)."""
    config = config or MiningConfig()
    now = now or datetime.now(UTC)
    report = MiningReport()
    by_key = collect_phrasings(rows, report, config)
    carry(by_key, carried, report, config, now)
    report.phrasings = len(by_key)
    kept = []
    for phrasing in by_key.values():
        if phrasing.askers < config.k:
            _exclude(report.excluded_phrasings, "below_k")
            if phrasing.hits:  # a carried phrasing may have no row in this window
                _exclude(report.excluded_rows, "below_k", phrasing.hits)
        else:
            kept.append(phrasing)
    report.phrasings_kept = len(kept)
    hot = []
    for members in cluster(kept, embedder, config):
        latest: dict[str, datetime] = {}
        networks: set[str] = set()
        for member in members:
            networks |= member.networks
            for user, ts in member.latest_by_user.items():
                _keep_latest(latest, user, ts)
        askers = min(len(latest), len(networks)) if networks else len(latest)
        score = sum(recency_weight(ts, now, config.half_life_days) for ts in latest.values()) * (
            askers / max(len(latest), 1)
        )  # many users from few networks weigh as few
        canonical = members[0]  # most distinct users, then most asks (cluster order)
        hot.append(
            HotQuestion(
                canonical=canonical,
                phrasings=members,
                users=askers,
                hits=sum(m.hits for m in members),
                score=score,
            )
        )
        report.merged_phrasings += len(members) - 1
    report.clusters = len(hot)
    hot.sort(key=lambda h: (-h.score, -h.users, h.key))
    if len(hot) > config.top_n:
        dropped = hot[config.top_n :]
        _exclude(report.excluded_phrasings, "below_top_n", sum(len(h.phrasings) for h in dropped))
        if any(h.hits for h in dropped):
            _exclude(report.excluded_rows, "below_top_n", sum(h.hits for h in dropped))
        hot = hot[: config.top_n]
    report.published_clusters = len(hot)
    return hot, report
