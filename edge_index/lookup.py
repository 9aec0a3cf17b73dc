"""Lookups against one loaded release: the exact tier (key map) and the semantic tier (FAISS).

The order the tiers are tried in is ``tiers.py``'s.

``ReleaseIndex`` holds everything a lookup needs in memory: a dict from key to row for the exact
tier, and the release's FAISS shards (searched together, ids offset per shard) with each row's
answer id for the semantic tier. It is immutable once built, so the service swaps whole indexes
on a new release and a lookup in flight keeps the one it started with. A row past its
``expires_at`` is never served (by either tier): the question goes on to the origin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from base.keys import key_of_normalized, normalize
from edge_index.explain import (
    Candidate,
    DecisionBars,
    ExactState,
    Explanation,
    Features,
    Outcome,
    Phrasing,
    Trace,
)
from semantic.guard import Guard
from semantic.matcher import DEFAULT_K, Decision, decision_from_manifest, features
from semantic.query import QueryEncoder, query_encoder

if TYPE_CHECKING:
    from base.release import LoadedRelease
    from semantic.embedder import Embedder


@dataclass(frozen=True)
class Hit:
    tier: str  # "exact" or "semantic"
    key: str  # the key of the phrasing that matched
    question: str
    answer: str
    score: float
    version: str | None  # None: not from a release (the origin's online cache)
    tokens: int | None = None  # the answer's length in tokens, when the tier knows it


@dataclass(frozen=True)
class Miss:
    # "no_release", "no_match", "below_threshold", "margin", "agreement", "guard:<check>",
    # "expired", "revoked", "semantic_off" (the release's calibration failed: exact hits only)
    # "language_not_served" (no profile of the question's language here), "skipped" (neither
    # tier searched: a client's lookup at the edge has just missed in this release, tiers.py)
    reason: str
    version: str | None
    score: float | None = None


class ReleaseIndex:
    def __init__(
        self,
        release: LoadedRelease,
        embedder: Embedder,
        decision: Decision | None = None,
        guard: Guard | None = None,
        k: int = DEFAULT_K,
        encoder: QueryEncoder | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: epoch seconds, compared with each row's ``expires_at``."""
        import faiss
        import pyarrow as pa
        import pyarrow.compute as pc

        manifest = release.manifest
        self.release = release
        self.version = release.version
        self.manifest = manifest
        self.embedder = embedder
        threshold = manifest.threshold
        self.decision = decision or decision_from_manifest(threshold)
        # the semantic tier serves only a decision calibration showed to reach its target (or
        # one a caller chose): an uncalibrated release answers exact hits only
        self.semantic = decision is not None or threshold.semantic
        flags = manifest.guard
        self.guard = guard if guard is not None else Guard(**flags.as_dict())
        self.k = k
        self.keys: list[str] = []
        self.questions: list[str] = []
        self.answers: list[str] = []
        self.clusters: list[str] = []
        answer_ids: list[int] = []
        by_answer: dict[str, int] = {}
        self.exact: dict[str, int] = {}
        self.shards: list[tuple[Any, int]] = []  # (faiss index, id offset)
        self.clock = clock
        # phrasings taken down (``precompute/revocations.py``): never served, even before the
        # release without them is loaded (``revoke``)
        self.revoked = frozenset(manifest.revoked.keys if manifest.revoked else ())
        expires: list[np.ndarray] = []  # per shard: epoch seconds (no expiry: int64 max)
        ef_search = manifest.index.ef_search
        for shard in release.shards:
            offset = len(self.keys)
            columns = shard.rows.select(["key", "question", "answer", "cluster"]).to_pydict()
            for k_, q, a, c in zip(
                columns["key"],
                columns["question"],
                columns["answer"],
                columns["cluster"],
                strict=True,
            ):
                self.exact.setdefault(k_, len(self.keys))
                self.keys.append(k_)
                self.questions.append(q)
                self.answers.append(a)
                self.clusters.append(c)
                answer_ids.append(by_answer.setdefault(c, len(by_answer)))
            seconds = pa.timestamp("s", tz="UTC")  # whatever unit the file holds
            expiry = shard.rows.column("expires_at").cast(seconds, safe=False).cast(pa.int64())
            expires.append(pc.fill_null(expiry, np.iinfo(np.int64).max).to_numpy())
            inner = faiss.downcast_index(shard.index)
            if hasattr(inner, "hnsw"):
                inner.hnsw.efSearch = max(ef_search, k)
            if hasattr(inner, "nprobe"):
                inner.nprobe = manifest.index.nprobe
            self.shards.append((shard.index, offset))
        self.answer_ids = np.asarray(answer_ids, dtype=np.int64)
        self.expires_at = np.concatenate(expires) if expires else np.zeros(0, np.int64)
        self.encoder = encoder or query_encoder(embedder)

    def __len__(self) -> int:
        return len(self.keys)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.encoder(texts)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and global row ids of the k nearest rows over every shard, best first."""
        all_scores, all_ids = [], []
        for index, offset in self.shards:
            scores, ids = index.search(vectors, min(k, index.ntotal))
            all_scores.append(scores)
            all_ids.append(np.where(ids >= 0, ids + offset, -1))
        if not all_scores:
            return np.zeros((len(vectors), 0), np.float32), np.zeros((len(vectors), 0), np.int64)
        scores = np.concatenate(all_scores, axis=1)
        ids = np.concatenate(all_ids, axis=1)
        order = np.argsort(-scores, axis=1)[:, :k]
        return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)

    def expired(self, row: int) -> bool:
        return bool(self.expires_at[row] <= self.clock())

    def revoke(self, keys: frozenset[str]) -> None:
        """Stop serving these phrasings now (a release without them is on its way)."""
        self.revoked = self.revoked | keys

    def lookup_exact(self, key: str) -> Hit | None:
        row = self.exact.get(key)
        if row is None or self.expired(row) or key in self.revoked:
            return None
        return Hit("exact", key, self.questions[row], self.answers[row], 1.0, self.version)

    def lookup_semantic(
        self, query: str, normalized: str | None = None, key: str | None = None
    ) -> Hit | Miss:
        """``normalized`` and ``key``: ``query``'s, when the caller has them (``tiers.lookup``
        does): not computed again."""
        if not self.semantic:  # not even embedded
            return Miss("semantic_off", self.version)
        normalized = normalized if normalized is not None else normalize(query)
        key = key if key is not None else key_of_normalized(normalized)
        if key in self.revoked:
            # the revoked wording itself never gets a neighbour's answer in its place
            return Miss("revoked", self.version)
        vector = self.embed([normalized])
        scores, ids = self.search(vector, self.k)
        return self.decide(query, scores[0], ids[0])

    def decide(
        self,
        query: str,
        scores: np.ndarray,
        ids: np.ndarray,
        trace: Trace | None = None,
    ) -> Hit | Miss:
        """The semantic tier's decision on ``query``'s candidates; ``trace`` (when given) receives
        the features and the guard's verdict the decision was made on (``explain``)."""
        trace = trace if trace is not None else Trace()
        if not self.semantic:
            return Miss("semantic_off", self.version)
        answers = [int(self.answer_ids[i]) if i >= 0 else -1 for i in ids]
        f = features(scores.tolist(), answers, self.decision.vote_k)
        if f is None:
            return Miss("no_match", self.version)
        row = int(ids[f.position])
        trace.features = Features(
            score=round(f.score, 6),
            margin=round(f.margin, 6),
            agreement=round(f.agreement, 6),
            nearest=Phrasing(key=self.keys[row], question=self.questions[row]),
        )
        if f.score < self.decision.threshold:
            return Miss("below_threshold", self.version, f.score)
        if f.margin < self.decision.margin:
            return Miss("margin", self.version, f.score)
        if f.agreement < self.decision.agreement:
            return Miss("agreement", self.version, f.score)
        refused = self.guard.check(query, self.questions[row])
        trace.guard = refused or "passed"
        if refused:
            return Miss(f"guard:{refused}", self.version, f.score)
        if self.expired(row):
            return Miss("expired", self.version, f.score)
        if self.keys[row] in self.revoked:
            return Miss("revoked", self.version, f.score)
        return Hit(
            "semantic",
            self.keys[row],
            self.questions[row],
            self.answers[row],
            f.score,
            self.version,
        )

    def explain(self, query: str, candidates: int = 10) -> Explanation:
        """Why a lookup of ``query`` in this release ends as it does, by the steps a lookup takes
        (``tiers.lookup`` without a tier of the caller's own): the key and the exact tier, the
        nearest phrasings with their scores, the features against the calibrated decision, the
        guard's verdict, and the outcome. ``InvalidQueryError`` for a query no lookup takes."""
        normalized = normalize(query)
        key = key_of_normalized(normalized)
        row = self.exact.get(key)
        exact = self.lookup_exact(key)
        scores, ids = self.search(self.embed([normalized]), self.k)
        trace = Trace()
        semantic = self.decide(query, scores[0], ids[0], trace)
        outcome = exact if exact is not None else semantic
        nearest = [
            Candidate(
                key=self.keys[i],
                question=self.questions[i],
                cluster=self.clusters[i],
                score=round(float(score), 6),
            )
            for score, i in zip(scores[0].tolist(), ids[0].tolist(), strict=True)
            if i >= 0
        ]
        if isinstance(outcome, Hit):
            result = Outcome(
                hit=True,
                tier=outcome.tier,
                key=outcome.key,
                question=outcome.question,
                answer=outcome.answer,
            )
        else:
            result = Outcome(hit=False, reason=outcome.reason)
        return Explanation(
            query=query,
            normalized=normalized,
            key=key,
            version=self.version,
            exact=ExactState(
                published=row is not None, served=exact is not None, revoked=key in self.revoked
            ),
            candidates=nearest[:candidates],
            decision=DecisionBars(**asdict(self.decision)),
            features=trace.features,
            guard=trace.guard,
            outcome=result,
        )
