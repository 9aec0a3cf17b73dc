"""The semantic tier's decision for a release being built: calibrated on its published phrasings
(leave-one-out, leave-label-out) and on the held-back wordings of its clusters — real paraphrases
its users typed, kept in the run's private work area (``edge_index/matcher.py: calibrate``) — and
whether the tier serves (``semantic_decision``: never on a decision calibration could not show
to reach the target precision, unless the build is told to)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from base.manifest import Threshold
from edge_index.guard import Guard
from edge_index.matcher import Calibration, Decision, Queries, calibrate
from precompute.config import BuildConfig

if TYPE_CHECKING:
    from edge_index.embedder import Embedder
    from precompute.questions import HotQuestion


def calibrate_rows(
    rows: list[dict[str, Any]],
    vectors: np.ndarray,
    config: BuildConfig,
    held_back: HeldBack | None = None,
) -> Calibration:
    """The semantic tier's decision, calibrated leave-one-out on the release's own phrasings
    (label = the answer's cluster) and on the held-back wordings of its clusters (``held_back``:
    real paraphrases of the questions it answers, looked up against the published phrasings;
    they stay in the work area, only the decision is published); a deterministic sample of each
    when there are very many."""
    chosen = _sample(len(rows), config.calibration_rows, seed=0)
    queries = None
    if held_back is not None and len(held_back.labels):
        picked = _sample(len(held_back.labels), config.calibration_rows, seed=1)
        queries = Queries(
            held_back.vectors[picked],
            [held_back.labels[i] for i in picked],
            [held_back.texts[i] for i in picked],
        )
    return calibrate(
        vectors[chosen],
        [rows[i]["cluster"] for i in chosen],
        [rows[i]["question"] for i in chosen],
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
        or past ``limit`` the deterministic sample ``calibrate_rows`` draws (only those are
        embedded: a million log rows hold back ~110,000 wordings, of which 20,000 calibrate)."""
        from edge_index.query_encoder import encode_many

        wordings = [(h.key, p) for h in hot if h.key in built for p in h.held_back]
        if limit is not None and len(wordings) > limit:
            picked = _sample(len(wordings), limit, seed=1)
            wordings = [wordings[i] for i in picked]
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
