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
5. Clustering: every phrasing that passed (one key each) is embedded, and near-duplicates are
   grouped greedily, most asked first (embedder + FAISS inner product, cosine >=
   ``cluster_threshold``, numbers must match). A cluster is one question, answered once.
6. ``below_k``: a cluster asked by fewer than ``k`` distinct askers is dropped, every wording
   of it. Its askers are counted over all its wordings, each identity once however many of them
   it typed: the fewer of its distinct users and its distinct networks (the viewer's /24 or /48,
   ``edge_index/users.py``), so neither one identity nor one network counts twice.
7. Token-level k (what may be published as text): a content token
   (``edge_index.guard.content_tokens``: words but function words, Han characters and pairs of
   them, numbers, named entities) is k-safe when the wordings holding it were typed by at least
   ``k`` askers of the cluster (counted as in rule 6). A wording is published (its key, its row,
   its answer object) only if all its tokens are k-safe; the others are held back
   (``rare_tokens``), though their askers counted in rule 6. The canonical question, which the
   answer is generated from, is the most asked published wording; when no wording is k-safe, it
   is built from k-safe tokens (``safe_question``: the wording that loses the smallest share of
   its tokens, without them), or the cluster is dropped (``no_k_safe_text``). So nothing
   published holds a token that fewer than ``k`` people typed: a name, an account detail, a
   rare circumstance.
8. Ranking: over the cluster's distinct users, each contributes ``0.5 ** (age / half_life)`` of
   their latest ask — distinct users × recency decay, scaled down when they come from fewer
   networks than users. ``below_top_n``: clusters past ``top_n``.

Each cluster that reached k has a row in ``MiningReport.cluster_rows`` (``HotQuestion.
report_row``): its askers, the wordings published, those held back (by key) and why.

Carried evidence (``carry``): answers served from the CDN are never logged, so a published
question would drop below ``k`` the night after and come back the night after that. Before rule 5,
the wordings of the clusters the parent release's run mined, published or held back (its private
``hot.json``: hashed users and networks with the time of their latest ask) are merged in, per
user and per network, keeping the latest time; an ask older than ``carry_half_lives`` half-lives
(weight ``0.5 ** carry_half_lives``, 1/16: 28 days at the default 7-day half-life) is dropped,
so a cluster nobody asks for fades out. The text rules (3-4) are applied to carried phrasings
again; rules 5-8 apply to them as to logged ones.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from edge_index.guard import content_tokens, numbers, remove_tokens
from edge_index.keys import InvalidQueryError, key, normalize
from edge_index.pii import find_pii
from edge_index.redaction import redacted_kinds
from edge_index.timeliness import time_sensitive
from precompute.clustering import cluster
from precompute.config import MiningConfig
from precompute.questions import HotQuestion, Phrasing, askers, held_back_rows

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@dataclass
class MiningReport:
    rows: int = 0
    excluded_rows: dict[str, int] = field(default_factory=dict)
    pii_by_kind: dict[str, int] = field(default_factory=dict)
    time_sensitive_by_kind: dict[str, int] = field(default_factory=dict)
    phrasings: int = 0
    excluded_phrasings: dict[str, int] = field(default_factory=dict)
    clusters: int = 0
    merged_phrasings: int = 0
    qualifying_clusters: int = 0  # asked by at least k identities
    published_clusters: int = 0
    phrasings_kept: int = 0  # wordings published as typed
    held_back_phrasings: int = 0  # wordings of published clusters held back (rare tokens)
    synthesized_questions: int = 0  # clusters published under a question built from k-safe tokens
    # carried evidence: the parent release it came from, its phrasings merged in (with at least
    # one ask young enough), the (phrasing, user) asks they added to the logs', and those too old
    carried_from: str | None = None
    carried_phrasings: int = 0
    carried_users: int = 0
    expired_users: int = 0
    # one row per cluster that reached k (``HotQuestion.report_row``): kept in the run's work
    # area, not in the run report
    cluster_rows: list[dict[str, Any]] = field(default_factory=list)

    def count_published(self, hot: list[HotQuestion]) -> None:
        """The counts of what ``hot`` publishes."""
        self.published_clusters = len(hot)
        self.phrasings_kept = sum(len(h.phrasings) - h.synthesized for h in hot)
        self.held_back_phrasings = sum(len(h.held_back) for h in hot)
        self.synthesized_questions = sum(h.synthesized for h in hot)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "cluster_rows"}


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


@dataclass
class Evidence:
    """Who typed each content token (``edge_index.guard.content_tokens``) of a cluster's
    wordings: the users and networks of every wording holding it, each counted once."""

    tokens: dict[str, set[str]]  # wording key -> its content tokens
    users: dict[str, set[str]]  # token -> users of the wordings holding it
    networks: dict[str, set[str]]

    @classmethod
    def of(cls, members: Iterable[Phrasing]) -> Evidence:
        evidence = cls({}, {}, {})
        for member in members:
            tokens = evidence.tokens[member.key] = content_tokens(member.question)
            for token in tokens:
                evidence.users.setdefault(token, set()).update(member.users)
                evidence.networks.setdefault(token, set()).update(member.networks)
        return evidence

    def safe(self, k: int) -> set[str]:
        """The tokens typed by at least ``k`` askers of the cluster."""
        return {t for t, users in self.users.items() if askers(users, self.networks[t]) >= k}


def safe_question(text: str, safe: set[str]) -> str | None:
    """``text`` without its content tokens not in ``safe`` (``guard.remove_tokens``), when what
    is left is made of ``safe`` tokens only, keeps at least half of ``text``'s content tokens
    and all its numbers ("the limit for 100" never becomes "the limit for"), and passes the text
    rules; else None."""
    tokens = content_tokens(text)
    question = remove_tokens(text, tokens - safe)
    left = content_tokens(question)
    if (
        not tokens
        or not left <= safe
        or 2 * len(left & tokens) < len(tokens)
        or numbers(question) != numbers(text)
        or text_problem(question)
    ):
        return None
    return question


def _split(
    members: list[Phrasing], k: int, taken: set[str]
) -> tuple[list[Phrasing], list[Phrasing], dict[str, int], bool]:
    """What a cluster that reached k publishes: its k-safe wordings (every content token typed
    by ``k`` of the cluster's askers), canonical first, or else a question built from k-safe
    tokens, or else nothing (``no_k_safe_text``); the wordings held back, with how many rare
    tokens each holds; and whether the canonical question was built.
    ``taken``: keys in use, which a built question may not take."""
    evidence = Evidence.of(members)
    safe = evidence.safe(k)
    published = [m for m in members if evidence.tokens[m.key] <= safe]
    held_back = [m for m in members if not evidence.tokens[m.key] <= safe]
    rare = {m.key: len(evidence.tokens[m.key] - safe) for m in held_back}
    if published:
        return published, held_back, rare, False
    # the wording that loses the smallest share of its tokens; the most asked among equals
    for member in sorted(members, key=lambda m: rare[m.key] / len(evidence.tokens[m.key])):
        question = safe_question(member.question, safe)
        if question is not None and key(question) not in taken:
            built = Phrasing(key(question), normalize(question), question, set(), 0, {})
            return [built], held_back, rare, True
    return [], held_back, rare, False


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
    taken = set(by_key)
    hot = []
    for members in cluster(list(by_key.values()), embedder, config):
        report.clusters += 1
        report.merged_phrasings += len(members) - 1
        latest: dict[str, datetime] = {}
        networks: set[str] = set()
        for member in members:
            networks |= member.networks
            for user, ts in member.latest_by_user.items():
                _keep_latest(latest, user, ts)
        users = askers(latest, networks)  # each identity once, whichever wordings it typed
        if users < config.k:
            _exclude_wordings(report, members, "below_k")
            continue
        report.qualifying_clusters += 1
        published, held_back, rare, synthesized = _split(members, config.k, taken)
        if not published:
            _exclude_wordings(report, members, "no_k_safe_text")
            report.cluster_rows.append(
                {
                    "cluster": None,
                    "status": "no_k_safe_text",
                    "identities": users,
                    "question": None,
                    "synthesized": False,
                    "published": [],
                    "held_back": held_back_rows(held_back, rare),
                }
            )
            continue
        taken.add(published[0].key)
        score = sum(recency_weight(ts, now, config.half_life_days) for ts in latest.values()) * (
            users / max(len(latest), 1)
        )  # many users from few networks weigh as few
        hot.append(
            HotQuestion(
                canonical=published[0],
                phrasings=published,
                users=users,
                hits=sum(m.hits for m in members),
                score=score,
                held_back=held_back,
                rare_tokens=rare,
                synthesized=synthesized,
            )
        )
    hot.sort(key=lambda h: (-h.score, -h.users, h.key))
    for dropped in hot[config.top_n :]:
        _exclude_wordings(report, dropped.wordings, "below_top_n")
        report.cluster_rows.append(dropped.report_row("below_top_n"))
    hot = hot[: config.top_n]
    for h in hot:
        _exclude_wordings(report, h.held_back, "rare_tokens")
        report.cluster_rows.append(h.report_row("selected"))
    report.count_published(hot)
    return hot, report


def _exclude_wordings(report: MiningReport, wordings: Iterable[Phrasing], reason: str) -> None:
    """Count ``wordings`` as excluded by ``reason``, and their rows (a carried wording may have
    none in this window)."""
    wordings = list(wordings)
    for counts, n in (
        (report.excluded_phrasings, len(wordings)),
        (report.excluded_rows, sum(w.hits for w in wordings)),
    ):
        if n:
            _exclude(counts, reason, n)


def drop_clusters(
    hot: list[HotQuestion], drop: Callable[[HotQuestion], bool], report: MiningReport, reason: str
) -> list[HotQuestion]:
    """``hot`` without the clusters ``drop`` picks after mining (``revoked``): all their wordings
    and rows are then counted under ``reason``, the held-back ones' no longer as ``rare_tokens``."""
    kept = []
    for h in hot:
        if not drop(h):
            kept.append(h)
            continue
        for counts, n in (
            (report.excluded_phrasings, len(h.held_back)),
            (report.excluded_rows, sum(w.hits for w in h.held_back)),
        ):
            if n:
                counts["rare_tokens"] -= n
                if not counts["rare_tokens"]:
                    del counts["rare_tokens"]
        _exclude_wordings(report, h.wordings, reason)
        for row in report.cluster_rows:
            if row["cluster"] == h.key:
                row["status"] = reason
    report.count_published(kept)
    return kept
