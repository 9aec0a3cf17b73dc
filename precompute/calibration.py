"""The semantic tier's decision for a release being built: calibrated on its published phrasings
(leave-one-out, leave-label-out) and on the held-back wordings of its clusters — real paraphrases
its users typed, kept in the run's private work area (``semantic/matcher.py: calibrate``) — and
whether the tier serves (``semantic_decision``: never on a decision calibration could not show
to reach the target precision, unless the build is told to)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from base.manifest import Threshold
from precompute.config import BuildConfig
from semantic.guard import Guard
from semantic.matcher import Calibration, Decision, Queries, calibrate

if TYPE_CHECKING:
    from collections.abc import Iterator

    from precompute.questions import HotQuestion, Phrasing
    from precompute.shards import ReleaseRows
    from semantic.embedder import Embedder


def calibrate_release(
    source: ReleaseRows, config: BuildConfig, held_back: HeldBack | None = None
) -> Calibration:
    """The semantic tier's decision, calibrated leave-one-out on the release's own phrasings
    (label = the answer's cluster) and on the held-back wordings of its clusters (``held_back``:
    real paraphrases of the questions it answers, looked up against the published phrasings;
    they stay in the work area, only the decision is published); a deterministic sample of each
    when there are very many, read from ``source`` in one pass."""
    chosen = np.asarray(_sample(source.count, config.calibration_rows, seed=0), dtype=np.int64)
    labels: list[str] = []
    texts: list[str] = []
    vectors = np.empty((len(chosen), source.dim), dtype=np.float32)
    start = taken = 0
    for rows, part in source.parts():
        stop = start + len(rows)
        upto = int(np.searchsorted(chosen, stop))
        for at, position in enumerate(chosen[taken:upto].tolist(), start=taken):
            labels.append(rows[position - start]["cluster"])
            texts.append(rows[position - start]["question"])
            vectors[at] = part[position - start]
        taken, start = upto, stop
        if taken == len(chosen):
            break
    queries = None
    if held_back is not None and len(held_back.labels):
        picked = _sample(len(held_back.labels), config.calibration_rows, seed=1)
        queries = Queries(
            held_back.vectors[picked],
            [held_back.labels[i] for i in picked],
            [held_back.texts[i] for i in picked],
        )
    return calibrate(
        vectors,
        labels,
        texts,
        Guard(),
        target_precision=config.target_precision,
        out_of_scope_share=config.out_of_scope_share,
        fallback=Decision(
            threshold=0.9 if config.threshold is None else config.threshold,
            margin=0.05 if config.margin is None else config.margin,
        ),
        queries=queries,
    )


def _sample(n: int, limit: int, seed: int) -> list[int]:
    """``range(n)``, or past ``limit`` a deterministic sample of that many, ascending."""
    import random

    if n <= limit:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


@dataclass
class HeldBack:
    """The held-back wordings of a release's clusters, for calibration only: their clusters
    (``labels``), raw texts and vectors, row for row."""

    labels: list[str]
    texts: list[str]
    vectors: np.ndarray

    @classmethod
    def of(
        cls,
        hot: list[HotQuestion],
        built: set[str],
        embedder: Embedder,
        limit: int | None = None,
    ) -> HeldBack:
        """The held-back wordings of the clusters in ``built`` (keys), embedded: all of them,
        or past ``limit`` the deterministic sample ``calibrate_release`` draws."""
        kept = [h for h in hot if h.key in built]
        return cls.sampled(iter(kept), sum(len(h.held_back) for h in kept), embedder, limit)

    @classmethod
    def sampled(
        cls,
        hot: Iterator[HotQuestion],
        count: int,
        embedder: Embedder,
        limit: int | None = None,
    ) -> HeldBack:
        """``of``, the built clusters read once, in order (``count``: their held-back
        wordings): only the sample is held and embedded (a million log rows hold
        back ~110,000 wordings, of which 20,000 calibrate)."""
        from semantic.batch import encode_many

        picked = range(count) if limit is None or count <= limit else _sample(count, limit, 1)
        wanted = iter(picked)
        following = next(wanted, None)
        wordings: list[tuple[str, Phrasing]] = []
        position = 0
        for cluster in hot:
            if following is None:
                break
            for wording in cluster.held_back:
                if position == following:
                    wordings.append((cluster.key, wording))
                    following = next(wanted, None)
                position += 1
        vectors = encode_many(embedder, [p.normalized for _, p in wordings])
        return cls([k for k, _ in wordings], [p.question for _, p in wordings], vectors)


def semantic_decision(calibration: Calibration, config: BuildConfig) -> Threshold:
    """The manifest's ``threshold``: the calibrated decision, and whether the semantic tier
    serves (``semantic``) — never on a decision that calibration could not show to reach the
    target precision, unless the build was told to (``semantic_uncalibrated``); the reason when
    it is off."""
    on = calibration.calibrated or config.semantic_uncalibrated
    reason = None
    if not on:
        reason = (
            f"calibration could not show precision {config.target_precision} on "
            f"{calibration.samples} lookups ({calibration.held_back_samples} of held-back "
            f"wordings; leave-one-out precision "
            f"{calibration.precision:.4f}, lower bound {calibration.precision_lower_bound:.4f}): "
            "exact tier only"
        )
    return Threshold.of(
        {**calibration.as_manifest(), "semantic": on, "semantic_off_reason": reason}
    )
