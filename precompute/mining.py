"""Hot-question mining: which logged questions may be published, and which matter most.

Rules (``docs/precompute.md``, "Mining rules"), applied in this order, every exclusion counted
by reason:
1. ``failed_request``: rows whose request was rejected or failed (status >= 400, tier
   ``rejected``/``error``) do not count as asks.
   ``edge_miss``: an edge lookup that missed is not counted, the origin logs the same ask.
2. ``multi_turn``: ``turns > 1`` rows never publish (the question depends on the conversation).
3. ``pii``: a query with personal data (``policy.pii``) never publishes, counted per kind.
   ``time_sensitive``: nor one whose answer changes with the time it is asked
   (``policy.timeliness``: "today", "the latest", prices, weather, scores...), counted per kind.
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
   ``base/users.py``), so neither one identity nor one network counts twice.
   ``unverified_crowd``: nor is one that reached k but whose askers hold fewer than
   ``min_signed_users`` distinct signed users (a token the deployment signed, counted as its
   user) or come from fewer than ``min_asns`` autonomous systems: five /24s are five cloud
   regions or free tunnels away, so a crowd made of addresses alone may be one person choosing
   what is published (and what the answer is generated from).
7. Token-level k (what may be published as text): a content token
   (``semantic.guard.content_tokens``: words but function words, Han characters and pairs of
   them, numbers, named entities) is k-safe when the wordings holding it were typed by at least
   ``k`` askers of the cluster (counted as in rule 6) that pass the crowd rule between them. A
   wording is published (its key, its row, its answer object) only if all its tokens are
   k-safe; the others are held back (``rare_tokens``), though their askers counted in rule 6.
   The canonical question, which the answer is generated from, is the most asked published
   wording; when no wording is k-safe, it is built from k-safe tokens (``safe_question``: the
   wording that loses the smallest share of its tokens, without them), or the cluster is dropped
   (``no_k_safe_text``). So nothing published holds a token that fewer than ``k`` people typed
   (a name, an account detail, a rare circumstance), nor one only a rented crowd typed.
8. Ranking: over the cluster's distinct users, each contributes ``0.5 ** (age / half_life)`` of
   their latest ask — distinct users × recency decay, scaled down when they come from fewer
   networks than users. ``below_top_n``: clusters past ``top_n``.

Each cluster that reached k has a row in ``MiningReport.cluster_rows`` (``HotQuestion.
report_row``): its askers, the wordings published, those held back (by key) and why.

Carried evidence: answers served from the CDN are never logged, so a published question would
drop below ``k`` the night after and come back the night after that. Before rule 5, the wordings
of the clusters the parent release's run mined, published or held back (its private
``hot/``: hashed users and networks with the time of their latest ask) are merged in, per
user and per network, keeping the latest time; an ask older than ``carry_half_lives`` half-lives
(weight ``0.5 ** carry_half_lives``, 1/16: 28 days at the default 7-day half-life) is dropped,
so a cluster nobody asks for fades out. The text rules (3-4) are applied to carried phrasings
again; rules 5-8 apply to them as to logged ones.

What runs where: rules 1-4 and the carried evidence's merge run in DuckDB over the window's rows
(``logwindow.py``: no list of rows in Python), the text rules once per distinct text
(``textrules.py``, on several processes when many are new); rule 5 embeds and searches in batches
(``clustering.py``); the verdicts and vectors of the nights before are taken from the caches
across nights, not computed again (``nightcache.py``); rules 6-8 run on the clusters only,
a chunk of clusters at a time on several processes when there are many (``kstep.py``), and a
cluster whose wordings' askers add up to fewer than k is dropped here before any of its wordings
becomes a ``Phrasing``. ``MiningReport.seconds`` times each step.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from base.config import peak_rss_mb
from base.logreader import LogDays
from precompute.carry import carry
from precompute.clustering import (
    Clusters,
    ClusterStats,
    Encoder,
    Heads,
    Texts,
    embed,
    embedding_order,
    greedy_clusters,
    local_encoder,
)
from precompute.clusterstate import ClusterState
from precompute.config import MiningConfig
from precompute.dayparts import TRUSTED_FORMS
from precompute.incremental import NightCaches, night_clusters
from precompute.kstep import MANY_WORDINGS, MIN_PROCESSES, cluster_chunks, judge_all
from precompute.logwindow import LogWindow, WindowCounts
from precompute.nightcache import NightCache, check_verdicts
from precompute.questions import HotQuestion, Phrasing, askers_counts, held_back_rows
from precompute.reduction import Wordings
from precompute.safetext import built_question
from precompute.spill import ClusterSpill, HotSpill
from precompute.vectorcache import vectors_with_cache
from semantic.guard import numbers

if TYPE_CHECKING:
    import pyarrow as pa

    from semantic.embedder import Embedder

log = logging.getLogger(__name__)

# the steps whose seconds the report gives (``MiningReport.seconds``)
STEPS = ("aggregate", "rules", "merge", "embed", "cluster", "k_and_text_rules", "rank")


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
    distinct_texts: int = 0  # raw texts the text rules judged (once each)
    rule_workers: int = 1  # processes the text rules ran on
    # what the caches across nights did (``nightcache.py``): entries found, computed, ...
    caches: dict[str, Any] = field(default_factory=dict)
    # seconds per step (``STEPS``) and how the wordings were clustered (``ClusterStats``)
    seconds: dict[str, float] = field(default_factory=dict)
    # the process's peak resident memory (MB) as each step ended: the step that raised it
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    clustering: dict[str, Any] = field(default_factory=dict)
    # one row per cluster that reached k (``HotQuestion.report_row``): kept in the run's work
    # area, not in the run report (on local disk past a part, when mined into a folder)
    cluster_rows: ClusterSpill = field(default_factory=ClusterSpill)

    def count_published(self, hot: Iterable[HotQuestion]) -> None:
        """The counts of what ``hot`` publishes (read once)."""
        self.published_clusters = self.phrasings_kept = 0
        self.held_back_phrasings = self.synthesized_questions = 0
        for h in hot:
            self.published_clusters += 1
            self.phrasings_kept += len(h.phrasings) - h.synthesized
            self.held_back_phrasings += len(h.held_back)
            self.synthesized_questions += h.synthesized

    def take(self, counts: WindowCounts) -> None:
        """What the log window's reduction counted (rules 1-4, carried evidence)."""
        for name in (
            "rows",
            "excluded_rows",
            "pii_by_kind",
            "time_sensitive_by_kind",
            "carried_users",
            "distinct_texts",
            "rule_workers",
        ):
            setattr(self, name, getattr(counts, name))
        self.seconds.update(counts.seconds)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "cluster_rows"}
        out["seconds"] = {k: round(v, 2) for k, v in self.seconds.items()}
        return out


def _exclude(counts: dict[str, int], reason: str, n: int = 1) -> None:
    counts[reason] = counts.get(reason, 0) + n


def mine(
    rows: Iterable[Mapping[str, Any] | pa.Table] | LogDays,
    embedder: Embedder | None,
    config: MiningConfig | None = None,
    now: datetime | None = None,
    carried: Iterable[Phrasing] = (),
    language: str | None = None,
    progress: bool = False,
    encoder: Callable[[], Encoder] | None = None,
    caches: NightCaches | None = None,
) -> tuple[list[HotQuestion], MiningReport]:
    """The hot questions to answer, best first, and the report of what was excluded and why:
    ``mine_to`` with everything held in memory (a night of a few thousand questions)."""
    hot, report = mine_to(
        None, rows, embedder, config, now, carried, language, progress, encoder, caches
    )
    return list(hot), report


def mine_to(
    folder: Path | None,
    rows: Iterable[Mapping[str, Any] | pa.Table] | LogDays,
    embedder: Embedder | None,
    config: MiningConfig | None = None,
    now: datetime | None = None,
    carried: Iterable[Phrasing] = (),
    language: str | None = None,
    progress: bool = False,
    encoder: Callable[[], Encoder] | None = None,
    caches: NightCaches | None = None,
    ahead: Callable[[str], None] | None = None,
) -> tuple[HotSpill, MiningReport]:
    """The hot questions to answer (read back best first, as often as wanted) and the report of
    what was excluded and why. ``folder``: where the questions and the cluster report are kept
    past a part (``spill.py``; the caller's to remove; None: held in memory).

    ``rows``: the window's request-log rows in log order, as Arrow tables of the logs' columns
    (``base.logreader.read_log_tables``) or dicts; or its days (``base.logreader.LogDays``),
    each reduced on its own and kept in ``caches.days`` (a day found there is not read again);
    reduced by DuckDB (``logwindow.py``), never held as a list. ``carried``: the parent run's
    phrasings, whose evidence is merged in.
    ``language``: only this language's rows count (None: all). ``encoder``: makes what embeds the
    wordings when ``embedder`` (embedding in this process) is None and there are wordings to
    cluster: the nightly job's embeds them on Ray (``fleet.embedding.RayEncoder``).
    ``caches``: the text rules' verdicts and the wordings' vectors kept across nights
    (``nightcache.py``): only what they miss is judged and embedded tonight. ``ahead``: told
    the night's next GPU step a pool's start before it ("embedding" as the text rules start,
    "generation" once the wordings are clustered): the nightly job's asks a fleet's
    autoscaler for the GPUs then (``fleet.ask_ahead``; a failed stage hands them back:
    ``fleet.handed_back``)."""
    config = config or MiningConfig()
    now = now or datetime.now(UTC)
    caches = caches or NightCaches()
    with tempfile.TemporaryDirectory(prefix="edgeqa-mined-") as texts:
        try:
            return _mine(
                folder,
                rows,
                embedder,
                config,
                now,
                carried,
                language,
                progress,
                encoder,
                caches,
                Path(texts) / "cached-texts.parquet",
                ahead or (lambda step: None),
            )
        finally:
            caches.close()  # old parts expire even on a night with nothing to embed, or failed


def _mine(
    folder: Path | None,
    rows: Iterable[Mapping[str, Any] | pa.Table] | LogDays,
    embedder: Embedder | None,
    config: MiningConfig,
    now: datetime,
    carried: Iterable[Phrasing],
    language: str | None,
    progress: bool,
    encoder: Callable[[], Encoder] | None,
    caches: NightCaches,
    cached_texts: Path,
    ahead: Callable[[str], None],
) -> tuple[HotSpill, MiningReport]:
    report = MiningReport(cluster_rows=ClusterSpill(folder and folder / "clusters"))
    hot = HotSpill(folder and folder / "hot")
    evidence = carry(carried, config, now)
    if caches.clusters is not None:
        caches.clusters.prefetch()  # read while the window is aggregated
    with LogWindow(config.memory_mb, writes_to=[cached_texts.parent]) as window:
        days = rows if isinstance(rows, LogDays) else None
        if not isinstance(rows, LogDays):
            window.add(rows)
        ahead("embedding")  # the text rules and the window's reduction come first
        table, counts = window.wordings(
            config,
            now,
            evidence.tables,
            language,
            progress,
            caches.verdicts,
            config.workers(),
            cached_texts,
            days,
            caches.days,
        )
        report.take(counts)
        report.peak_rss_mb["rules"] = peak_rss_mb()
        report.excluded_phrasings.update(evidence.excluded_phrasings)
        report.carried_phrasings = evidence.carried_phrasings
        report.expired_users = evidence.expired_users
        report.phrasings = len(table)
        if embedder is not None:
            encode: Callable[[], Encoder] | None = functools.partial(local_encoder, embedder)
        else:
            encode = encoder
        clusters = _clusters(
            table, encode, config, report, progress, caches.vectors, caches.clusters
        )
        # the generation pool asked for now: the k step and the ranking (~9 min at 1×) run while
        # it starts; the embedding's GPUs, had nothing needed them, kept for it
        ahead("generation")
        report.peak_rss_mb["cluster"] = peak_rss_mb()
        started = time.perf_counter()
        _qualifying(table, clusters, config, now, report, hot)
        report.seconds["k_and_text_rules"] = time.perf_counter() - started
        report.peak_rss_mb["k_and_text_rules"] = peak_rss_mb()
    started = time.perf_counter()
    hot.limit = config.top_n  # read back best first: those past it were not selected
    check = cached_texts.exists()
    kept: dict[str, tuple[str, str, int]] = {}  # checked: the kept wordings' texts, asks

    def selected() -> Iterator[HotQuestion]:  # one pass over all of them, those past the limit too
        for within, h in hot.ranked(askers=False):  # counted, not named: ~6× as fast
            if not within:
                _exclude_wordings(report, h.wordings, "below_top_n")
                report.cluster_rows.append(h.report_row("below_top_n"))
                continue
            if check:
                kept.update((w.key, (w.question, w.normalized, w.hits)) for w in h.wordings)
            _exclude_wordings(report, h.held_back, "rare_tokens")
            report.cluster_rows.append(h.report_row("selected"))
            yield h

    report.count_published(selected())
    if check:
        where = " or ".join(c.root for c in (caches.verdicts, caches.days) if c is not None)
        trusted = cached_texts.with_name(TRUSTED_FORMS)
        check_verdicts(cached_texts, kept, language, where, config.workers(), trusted)
    report.seconds["rank"] = time.perf_counter() - started
    report.peak_rss_mb["rank"] = peak_rss_mb()
    caches.close()
    report.caches = caches.as_dict()
    return hot, report


def _clusters(
    table: Wordings,
    encoder: Callable[[], Encoder] | None,
    config: MiningConfig,
    report: MiningReport,
    progress: bool,
    vectors: NightCache | None = None,
    carried: ClusterState | None = None,
) -> Clusters:
    """Rule 5 on the window's wordings (rows of ``table``, most asked first): clusters of row
    numbers, head first. ``encoder()`` makes what embeds them (None: nothing does, no wording
    joins another); ``vectors``: the cache that holds some of their vectors (None: none);
    ``carried``: the clusters the nights before kept (``clusterstate.py``: only the new
    wordings are embedded and clustered; None: every wording is)."""
    n = len(table)
    stats = ClusterStats(wordings=n)
    normalized = Texts(table.column("normalized"))
    made: list[Encoder] = []

    def encode() -> Encoder:  # made once, when a wording must be embedded
        if not made:
            made.append(encoder())  # type: ignore[misc]
        return made[0]

    def from_scratch(heads: Heads | None = None) -> Clusters:
        order = embedding_order(n, config.exact_cluster_rows)
        if vectors is None:
            chunks = embed(normalized, encode(), order, progress)
        else:
            chunks = vectors_with_cache(
                vectors,
                table.column("key").take(order),  # Arrow: no Python string a key
                normalized.take(order),
                encode,
                progress,
            )
        return greedy_clusters(
            chunks,
            config.cluster_threshold,
            lambda row: numbers(normalized[row]),
            exact_rows=config.exact_cluster_rows,
            list_rows=config.cluster_list_rows,
            nprobe=config.cluster_nprobe,
            stats=stats,
            progress=progress,
            recall=config.cluster_recall,
            order=order,
            heads=heads,
        )

    if encoder is None or n <= 1:
        clusters = Clusters.singletons(n)
    elif carried is None:
        clusters = from_scratch()
    else:
        keys = table.column("key").combine_chunks()
        clusters = night_clusters(
            carried, keys, normalized, encode, config, stats, progress, from_scratch
        )
    report.seconds["embed"] = stats.embed_s
    report.seconds["cluster"] = stats.cluster_s
    report.clustering = stats.as_dict()
    if made:  # where the wordings were embedded (``precompute/fleet/``)
        report.clustering["embedded_on"] = getattr(made[0], "where", "") or "this process"
    elif encoder is not None and n > 1:  # every vector came from the cache, or none was needed
        report.clustering["embedded_on"] = "carried" if stats.index == "carried" else "cache"
    return clusters


def _qualifying(
    table: Wordings,
    clusters: Clusters,
    config: MiningConfig,
    now: datetime,
    report: MiningReport,
    hot: HotSpill,
) -> None:
    """Rules 6-7 and the score of rule 8: the clusters asked by k, each with what it publishes,
    into ``hot``.
    A cluster whose wordings' users or networks add up to fewer than k is below k without a
    look at who they are (their union is no larger): only the others become ``Phrasing``s."""
    # every cluster's sums at once (numpy over the flat rows: a Python pass over the clusters
    # cost 6.8 us each, half an hour at a billion log rows a week)
    rows, sizes = clusters.rows(), clusters.sizes()
    starts = np.cumsum(sizes) - sizes
    users, networks, hits = (
        np.add.reduceat(table.column(name).to_numpy()[rows], starts) if len(rows) else sizes
        for name in ("user_count", "network_count", "hits")
    )
    askers = askers_counts(users, networks)
    candidate = askers >= config.k
    report.clusters += len(sizes)
    report.merged_phrasings += int((sizes - 1).sum())
    below_k_wordings = int(sizes[~candidate].sum())
    below_k_rows = int(hits[~candidate].sum())
    candidates = clusters.select(candidate)
    taken = _KeySet(table.column("key"))
    crowds = signed_crowds = 0
    wordings = int(sizes[candidate].sum())
    workers = config.workers() if wordings > MANY_WORDINGS else 1
    workers = workers if workers >= MIN_PROCESSES else 1
    chunks = cluster_chunks(table.picked(candidates.rows()), candidates.sizes().tolist())
    for judged in judge_all(chunks, config, now, workers):
        if judged.status == "below_k":
            below_k_wordings += judged.count
            below_k_rows += judged.hits
            continue
        if judged.status == "unverified_crowd":
            crowds, signed_crowds = crowds + 1, signed_crowds + bool(judged.signers)
            _exclude_counted(report, judged.count, judged.hits, "unverified_crowd")
            report.cluster_rows.append(
                {
                    "cluster": None,
                    "status": "unverified_crowd",
                    "identities": judged.users,
                    "signed_users": judged.signers,
                    "asns": judged.asns,
                    "question": None,
                    "synthesized": False,
                    "published": [],
                    "held_back": [],
                }
            )
            continue
        report.qualifying_clusters += 1
        published, held_back, rare = judged.published, judged.held_back, judged.rare
        built = None if published else built_question(judged.candidates, taken)
        if built is not None:
            published = [built]
        if not published:
            _exclude_counted(report, judged.count, judged.hits, "no_k_safe_text")
            report.cluster_rows.append(
                {
                    "cluster": None,
                    "status": "no_k_safe_text",
                    "identities": judged.users,
                    "question": None,
                    "synthesized": False,
                    "published": [],
                    "held_back": held_back_rows(held_back, rare),
                }
            )
            continue
        taken.add(published[0].key)
        hot.add(
            HotQuestion(
                canonical=published[0],
                phrasings=published,
                users=judged.users,
                hits=judged.hits,
                score=judged.score,
                held_back=held_back,
                rare_tokens=rare,
                synthesized=built is not None,
            )
        )
    for counts, n in (
        (report.excluded_phrasings, below_k_wordings),
        (report.excluded_rows, below_k_rows),
    ):
        if n:
            _exclude(counts, "below_k", n)
    if crowds and not signed_crowds and config.min_signed_users:
        log.warning(
            "%d question(s) reached k, but none of their askers was a signed user: nothing is "
            "published from unsigned askers alone (EDGEQA_MIN_SIGNED_USERS=%d). Set "
            "EDGEQA_IDENTITY_SECRET on the edge and the origin and send user tokens, or, for a "
            "product without sign-in, EDGEQA_MIN_SIGNED_USERS=0 with EDGEQA_MIN_ASNS and "
            "EDGEQA_ASN_TABLE",
            crowds,
            config.min_signed_users,
        )


KEY_SLICE = 1 << 18  # keys turned into 64-bit prefixes at a time


class _KeySet:
    """The keys in use (every wording's, and each built question's once taken): a built
    question may not take one. The night's keys as sorted 64-bit prefixes, not a set of str."""

    def __init__(self, keys: pa.ChunkedArray) -> None:
        import pyarrow.compute as pc

        parts = [np.empty(0, dtype=np.uint64)]
        for start in range(0, len(keys), KEY_SLICE):  # a slice of Python ints at a time
            prefixes = pc.utf8_slice_codeunits(keys.slice(start, KEY_SLICE), 0, 16).to_pylist()
            parts.append(np.array([int(p, 16) for p in prefixes], dtype=np.uint64))
        self._night = np.sort(np.concatenate(parts))
        self._added: set[str] = set()

    def add(self, k: str) -> None:
        self._added.add(k)

    def __contains__(self, k: object) -> bool:
        if not isinstance(k, str):
            return False
        if k in self._added:
            return True
        prefix = np.uint64(int(k[:16], 16))
        at = int(np.searchsorted(self._night, prefix))
        return at < len(self._night) and self._night[at] == prefix


def _exclude_wordings(report: MiningReport, wordings: Iterable[Phrasing], reason: str) -> None:
    """Count ``wordings`` as excluded by ``reason``, and their rows (a carried wording may have
    none in this window)."""
    wordings = list(wordings)
    _exclude_counted(report, len(wordings), sum(w.hits for w in wordings), reason)


def _exclude_counted(report: MiningReport, wordings: int, rows: int, reason: str) -> None:
    """Count ``wordings`` wordings and their ``rows`` log rows as excluded by ``reason``."""
    for counts, n in ((report.excluded_phrasings, wordings), (report.excluded_rows, rows)):
        if n:
            _exclude(counts, reason, n)


def drop_clusters(
    hot: Iterable[HotQuestion],
    drop: Callable[[HotQuestion], bool],
    report: MiningReport,
    reason: str,
    kept: Callable[[HotQuestion], None] | None = None,
) -> set[str]:
    """The keys of the clusters of ``hot`` (read once) that ``drop`` picks after mining
    (``revoked``): all their wordings and rows are then counted under ``reason``, the held-back
    ones' no longer as ``rare_tokens``, their report rows relabelled, and what is published
    counted again without them. ``kept``: handed each cluster not dropped, in order."""
    dropped: set[str] = set()

    def not_dropped() -> Iterator[HotQuestion]:
        for h in hot:
            if not drop(h):
                if kept is not None:
                    kept(h)
                yield h
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
            dropped.add(h.key)

    report.count_published(not_dropped())
    report.cluster_rows.relabel(dropped, reason)
    return dropped
