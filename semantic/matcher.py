"""The semantic tier's decision, and its calibration from labelled phrasings.

A query is embedded and its ``k`` nearest indexed phrasings are retrieved. The nearest one's
answer is returned only if all of these hold:

- ``score`` (cosine to the nearest phrasing) >= ``threshold``;
- ``margin`` (that score minus the best score of a phrasing of a *different* answer) >= ``margin``:
  a query halfway between two cached questions is ambiguous, whatever its score;
- ``agreement`` (share of the ``vote_k`` nearest phrasings that belong to the same answer) >=
  ``agreement``;
- the guard (``semantic.guard``) finds no differing number, negation or named entity.

``calibrate`` picks ``threshold``, ``margin`` and ``agreement`` from labelled phrasings only (the
cache's own rows): each phrasing is looked up leave-one-out against all the others, and a hit is
correct when it returns its own label's answer (a phrasing whose label has no other phrasing must
miss). Each phrasing is also looked up with its whole label removed ("leave-label-out"): a
question about a topic the cache does not hold, which must miss. Among all settings whose
leave-one-out precision's lower confidence bound (Wilson, one-sided, ``z``) reaches the target and
whose leave-label-out hit rate's upper bound stays within ``max_out_of_scope_hit_rate`` (2 %: the
proxy is pessimistic, a held-out topic sits next to its siblings), and whose precision stays at the
target once out-of-scope lookups are counted too (``out_of_scope_share`` of the semantic tier's
lookups, 5 %, each leave-label-out hit a wrong answer), it keeps the one with the highest hit rate.
The bounds matter: a point estimate at the target lands just below it on unseen queries, and
without the leave-label-out constraint a threshold calibrated on in-scope phrasings alone answers
out-of-scope questions (CLINC150: 7% false hits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from base.config import MAX_OUT_OF_SCOPE_SHARE, OUT_OF_SCOPE_SHARE
from semantic.guard import Guard

if TYPE_CHECKING:
    from base.manifest import Threshold

DEFAULT_K = 10
VOTE_K = 5


@dataclass(frozen=True)
class Decision:
    threshold: float = 0.9
    margin: float = 0.05
    agreement: float = 0.0
    vote_k: int = VOTE_K

    def accepts(self, score: float, margin: float, agreement: float) -> bool:
        return score >= self.threshold and margin >= self.margin and agreement >= self.agreement


@dataclass(frozen=True)
class Features:
    score: float
    margin: float
    agreement: float
    position: int  # index (into the candidate arrays) of the nearest phrasing


def features(
    scores: Sequence[float], answers: Sequence[int], vote_k: int = VOTE_K
) -> Features | None:
    """From the candidates' scores (descending) and answer ids; None when there are none."""
    valid = [i for i, a in enumerate(answers) if a >= 0]
    if not valid:
        return None
    top = valid[0]
    best = answers[top]
    other = next((scores[i] for i in valid if answers[i] != best), None)
    # no other answer among the candidates: the margin is at least top - last candidate
    margin = scores[top] - (other if other is not None else min(scores[i] for i in valid) - 0.05)
    voters = valid[:vote_k]
    agreement = sum(1 for i in voters if answers[i] == best) / len(voters)
    return Features(float(scores[top]), float(margin), float(agreement), top)


def wilson_lower(correct: int, total: float, z: float) -> float:
    if total == 0:
        return 0.0
    p = correct / total
    denominator = 1 + z * z / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return (centre - spread) / denominator


@dataclass(frozen=True)
class Calibration:
    decision: Decision
    target_precision: float
    precision: float  # leave-one-out, at the chosen setting
    precision_lower_bound: float
    hit_rate: float  # leave-one-out share of phrasings answered
    recall: float  # share of phrasings with another phrasing of their answer that hit correctly
    samples: int
    z: float
    calibrated: bool
    out_of_scope_hit_rate: float | None = None  # held-out-label lookups that hit
    out_of_scope_share: float | None = None  # the share of out-of-scope lookups assumed
    held_back_samples: int = 0  # of ``samples``: lookups of wordings not indexed (``Queries``)
    # [threshold, leave-one-out precision (None: no hit), hit rate] at the chosen margin and
    # agreement, at each threshold of the calibration grid: what the chosen point trades
    # (``edgeqa release show --html`` draws it)
    curve: tuple[tuple[float, float | None, float], ...] = ()

    def as_manifest(self) -> dict[str, Any]:
        return {
            "value": self.decision.threshold,
            "margin": self.decision.margin,
            "agreement": self.decision.agreement,
            "vote_k": self.decision.vote_k,
            "calibrated": self.calibrated,
            "target_precision": self.target_precision,
            "precision": round(self.precision, 4),
            "precision_lower_bound": round(self.precision_lower_bound, 4),
            "hit_rate": round(self.hit_rate, 4),
            "recall": round(self.recall, 4),
            "samples": self.samples,
            "held_back_samples": self.held_back_samples,
            "out_of_scope_hit_rate": (
                None if self.out_of_scope_hit_rate is None else round(self.out_of_scope_hit_rate, 4)
            ),
            "out_of_scope_share": self.out_of_scope_share,
            "z": self.z,
            "method": (
                "leave-one-out and leave-label-out on the release's phrasings and held-back "
                "wordings, Wilson bounds"
            ),
            "curve": [list(point) for point in self.curve],
        }


def decision_from_manifest(threshold: Threshold) -> Decision:
    return Decision(
        threshold=float(threshold.value),
        margin=float(threshold.margin or 0.0),
        agreement=float(threshold.agreement or 0.0),
        vote_k=threshold.vote_k or VOTE_K,
    )


def _candidate_features(
    scores: np.ndarray,
    ids: np.ndarray,
    answer: np.ndarray,
    query_answer: np.ndarray,
    query_texts: Sequence[str] | None,
    texts: Sequence[str] | None,
    guard: Guard | None,
    skip: Any,
    k: int,
    vote_k: int = VOTE_K,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features of every query from its candidates (``ids`` into the indexed phrasings, whose
    answers are ``answer``), ``skip(i, j)`` removing candidates; a hit is correct when the
    nearest phrasing's answer is the query's (``query_answer``)."""
    n = len(scores)
    out_score = np.full(n, -np.inf)
    out_margin = np.zeros(n)
    out_agree = np.zeros(n)
    correct = np.zeros(n, dtype=bool)
    for i in range(n):
        keep = [c for c in range(ids.shape[1]) if ids[i, c] >= 0 and not skip(i, ids[i, c])][:k]
        if not keep:
            continue
        cand = ids[i, keep]
        f = features(scores[i, keep].tolist(), answer[cand].tolist(), vote_k)
        if f is None:
            continue
        nearest = int(cand[f.position])
        if (
            guard is not None
            and texts is not None
            and query_texts is not None
            and guard.check(query_texts[i], texts[nearest])
        ):
            continue  # the guard refuses: a miss whatever the scores
        out_score[i], out_margin[i], out_agree[i] = f.score, f.margin, f.agreement
        correct[i] = answer[nearest] == query_answer[i]
    return out_score, out_margin, out_agree, correct


@dataclass(frozen=True)
class Queries:
    """Lookups calibration makes besides the phrasings' own leave-one-out ones: real wordings
    of the indexed labels that are not indexed themselves (a release's held-back wordings),
    each looked up against every indexed phrasing."""

    vectors: np.ndarray
    labels: Sequence[Any]
    texts: Sequence[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)


def leave_one_out(
    vectors: np.ndarray,
    labels: Sequence[Any],
    texts: Sequence[str] | None,
    guard: Guard | None,
    k: int = DEFAULT_K,
    held_out_labels: bool = False,
    vote_k: int = VOTE_K,
    queries: Queries | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per phrasing: score, margin, agreement (score -inf where the guard refuses) and whether
    the nearest *other* phrasing has the same label; then the same for each of ``queries``
    (looked up against all the phrasings: nothing to leave out).

    ``held_out_labels``: look each phrasing (and query) up as if its whole label were not
    cached (all its label's phrasings removed) -- an out-of-scope query about a topic the cache
    lacks.
    """
    import faiss

    codes = {label: i for i, label in enumerate(dict.fromkeys(labels))}
    answer = np.array([codes[label] for label in labels])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    largest = int(np.bincount(answer).max())
    width = min((k + largest) if held_out_labels else (k + 1), len(labels))
    scores, ids = index.search(vectors, width)
    if held_out_labels:
        own = _candidate_features(
            scores, ids, answer, answer, texts, texts, guard,
            lambda i, j: answer[j] == answer[i], k, vote_k,
        )  # fmt: skip
    else:
        own = _candidate_features(
            scores, ids, answer, answer, texts, texts, guard, lambda i, j: j == i, k, vote_k
        )
    if queries is None or not len(queries):
        return own
    asked = np.array([codes.get(label, -2) for label in queries.labels])  # -2: no answer of its
    width = min((k + largest) if held_out_labels else k, len(labels))
    scores, ids = index.search(np.ascontiguousarray(queries.vectors, dtype=np.float32), width)
    if held_out_labels:
        skip = lambda i, j: answer[j] == asked[i]  # noqa: E731
    else:
        skip = lambda i, j: False  # noqa: E731
    more = _candidate_features(
        scores, ids, answer, asked, queries.texts, texts, guard, skip, k, vote_k
    )
    return tuple(np.concatenate([a, b]) for a, b in zip(own, more, strict=True))  # type: ignore[return-value]


def wilson_upper(hits: int, total: int, z: float) -> float:
    return 1.0 - wilson_lower(total - hits, total, z)


GRID_POINTS = 101  # candidate thresholds per calibration


def threshold_grid(scores: np.ndarray, points: int = GRID_POINTS) -> np.ndarray:
    """The thresholds calibration tries, ascending: quantiles of the embedder's own
    leave-one-out nearest-neighbour ``scores`` on the release's phrasings (every embedder
    spreads its cosines differently: all-MiniLM-L6-v2's paraphrases sit near 0.8,
    multilingual-e5's unrelated questions above 0.8), so the grid is as fine where this
    embedder's scores are as anywhere, and never tries a threshold no phrasing scores."""
    finite = scores[np.isfinite(scores)]
    if finite.size == 0:
        return np.array([1.0])
    quantiles = np.quantile(finite, np.linspace(0.0, 1.0, points))
    return np.unique(np.round(quantiles.astype(np.float64), 4))


def _curve(
    loo: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], decision: Decision
) -> tuple[tuple[float, float | None, float], ...]:
    """Leave-one-out precision and hit rate against the threshold, at ``decision``'s margin
    and agreement (``loo``: ``leave_one_out``'s arrays for its vote_k)."""
    score, margin, agree, correct = loo
    allowed = (agree >= decision.agreement) & (margin >= decision.margin)
    points = []
    for t in threshold_grid(score):
        hit = allowed & (score >= t)
        hits = int(hit.sum())
        precision = round(int((hit & correct).sum()) / hits, 4) if hits else None
        points.append((float(t), precision, round(hits / len(score), 4)))
    return tuple(points)


def calibrate(
    vectors: np.ndarray,
    labels: Sequence[Any],
    texts: Sequence[str] | None = None,
    guard: Guard | None = None,
    target_precision: float = 0.99,
    z: float = 1.645,
    fallback: Decision | None = None,
    use_margin: bool = True,
    use_agreement: bool = True,
    max_out_of_scope_hit_rate: float | None = 0.02,
    vote_ks: Sequence[int] = (5, 10),
    out_of_scope_share: float = OUT_OF_SCOPE_SHARE,
    queries: Queries | None = None,
) -> Calibration:
    """Choose the decision with the highest leave-one-out hit rate such that

    - the Wilson lower bound of leave-one-out precision reaches ``target_precision``, and
    - the Wilson upper bound of the held-out-label hit rate (each phrasing looked up with its
      whole label removed: a question about something not cached) stays within
      ``max_out_of_scope_hit_rate`` (None: neither this constraint nor the next; they need >= 2
      labels), and
    - the precision's Wilson lower bound still reaches the target with held-out-label lookups
      mixed in at ``out_of_scope_share`` of all lookups, each hit among them a wrong answer:
      correct / (hits + w * held-out hits), w = share / (1 - share). A low hit rate makes a few
      out-of-scope hits a large part of all hits (MASSIVE zh-CN: 0.995 precise in scope, 0.985
      with its 10 % out-of-scope queries, before this bound);

    ``fallback`` (uncalibrated) when no setting satisfies both.

    ``queries``: more lookups, real wordings of the labels that are not indexed (a release's
    held-back wordings): each counts like a phrasing's leave-one-out lookup (and, with its label
    removed, like its leave-label-out one), so a release that indexes one phrasing per label
    still has lookups that should hit.
    """
    if not 0 <= out_of_scope_share <= MAX_OUT_OF_SCOPE_SHARE:
        # weighted (w <= 1) held-out hits keep the Wilson bound conservative; past 1/2 each
        # would count as more than one trial and the bound would understate their variance
        raise ValueError(f"out_of_scope_share must be in [0, {MAX_OUT_OF_SCOPE_SHARE}]")
    asked = list(queries.labels) if queries is not None else []
    n = len(labels) + len(asked)
    if len(labels) < 2 and not (labels and asked):
        return Calibration(
            fallback or Decision(),
            target_precision,
            0.0,
            0.0,
            0.0,
            0.0,
            n,
            z,
            calibrated=False,
            held_back_samples=len(asked),
        )
    check_oos = max_out_of_scope_hit_rate is not None and len(set(labels)) >= 2
    out_of_scope_weight = out_of_scope_share / (1 - out_of_scope_share)
    counts: dict[Any, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    # a lookup that can hit correctly: another phrasing of its label is indexed
    answerable = np.array(
        [counts[label] > 1 for label in labels] + [label in counts for label in asked]
    )
    margins = np.round(np.arange(0.0, 0.301, 0.01), 2) if use_margin else np.array([-1.0])
    agreements = (0.0, 0.6, 0.8, 1.0) if use_agreement else (0.0,)
    best: tuple[float, Decision, float, float, float, float] | None = None
    loos: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for vote_k in vote_ks if use_agreement else (VOTE_K,):
        loos[vote_k] = leave_one_out(vectors, labels, texts, guard, vote_k=vote_k, queries=queries)
        score, margin, agree, correct = loos[vote_k]
        thresholds = threshold_grid(score)
        if check_oos:
            o_score, o_margin, o_agree, _ = leave_one_out(
                vectors, labels, texts, guard, held_out_labels=True, vote_k=vote_k, queries=queries
            )
        for a in agreements:
            ok_a = agree >= a
            o_ok_a = o_agree >= a if check_oos else None
            for m in margins:
                ok_am = ok_a & (margin >= m)
                o_ok_am = o_ok_a & (o_margin >= m) if o_ok_a is not None else None
                for t in thresholds:
                    hit = ok_am & (score >= t)
                    hits = int(hit.sum())
                    if hits == 0:
                        break  # higher thresholds only hit less
                    right = int((hit & correct).sum())
                    bound = wilson_lower(right, hits, z)
                    if bound < target_precision or (best is not None and hits / n <= best[0]):
                        continue
                    oos_rate = 0.0
                    if o_ok_am is not None:
                        oos_hits = int((o_ok_am & (o_score >= t)).sum())
                        mixed = hits + out_of_scope_weight * oos_hits
                        if wilson_lower(right, mixed, z) < target_precision:
                            continue
                        oos_rate = oos_hits / n
                        limit = max_out_of_scope_hit_rate
                        if wilson_upper(oos_hits, n, z) > limit:  # type: ignore[operator]
                            continue
                    best = (
                        hits / n,
                        Decision(float(t), float(m), float(a), vote_k),
                        right / hits,
                        bound,
                        right / max(int(answerable.sum()), 1),
                        oos_rate,
                    )
    if best is None:
        decision = fallback or Decision()
        loo = leave_one_out(vectors, labels, texts, guard, queries=queries)
        score, margin, _, correct = loo
        hit = (score >= decision.threshold) & (margin >= decision.margin)
        hits = int(hit.sum())
        right = int((hit & correct).sum())
        return Calibration(
            decision,
            target_precision,
            right / hits if hits else 0.0,
            wilson_lower(right, hits, z),
            hits / n if n else 0.0,
            right / max(int(answerable.sum()), 1),
            n,
            z,
            calibrated=False,
            curve=_curve(loo, Decision(decision.threshold, decision.margin)),
            held_back_samples=len(asked),
        )
    hit_rate, decision, precision, bound, recall, oos_rate = best
    return Calibration(
        decision,
        target_precision,
        precision,
        bound,
        hit_rate,
        recall,
        n,
        z,
        True,
        out_of_scope_hit_rate=oos_rate if check_oos else None,
        out_of_scope_share=out_of_scope_share if check_oos else None,
        curve=_curve(loos[decision.vote_k], decision),
        held_back_samples=len(asked),
    )
