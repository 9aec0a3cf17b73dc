"""The semantic decision and its calibration from labelled phrasings."""

from __future__ import annotations

import numpy as np
import pytest

from edge_index.matcher import Decision, calibrate, features, leave_one_out, wilson_lower


def test_features_margin_and_agreement() -> None:
    f = features([0.95, 0.93, 0.80, 0.70], [1, 1, 2, 1])
    assert f is not None
    assert f.score == 0.95 and f.margin == pytest.approx(0.15) and f.agreement == 0.75
    lone = features([0.9, 0.8], [3, 3])
    assert lone is not None and lone.margin == pytest.approx(0.15)  # no rival: 0.9 - (0.8 - 0.05)
    assert features([0.9], [-1]) is None
    assert Decision(0.9, 0.1, 0.8).accepts(0.95, 0.15, 0.8)
    assert not Decision(0.9, 0.1, 0.8).accepts(0.95, 0.05, 1.0)


def test_wilson_lower_bound() -> None:
    assert wilson_lower(100, 100, 1.645) < 1.0
    assert wilson_lower(990, 1000, 1.645) < 0.99 < wilson_lower(998, 1000, 1.645)
    assert wilson_lower(0, 0, 1.645) == 0.0


def _clusters(
    rng: np.random.Generator, labels: int, per: int, spread: float
) -> tuple[np.ndarray, list[str]]:
    centres = rng.normal(size=(labels, 32))
    vectors = np.concatenate([c + spread * rng.normal(size=(per, 32)) for c in centres])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float32), [f"l{i}" for i in range(labels) for _ in range(per)]


def test_calibration_reaches_the_target_on_held_out_data() -> None:
    rng = np.random.default_rng(0)
    vectors, labels = _clusters(rng, 30, 40, 0.35)
    cal = calibrate(vectors, labels, target_precision=0.99, max_out_of_scope_hit_rate=0.01)
    assert cal.calibrated and cal.precision_lower_bound >= 0.99 and cal.hit_rate > 0.3
    # fresh queries from the same clusters: precision holds
    score, margin, agree, correct = leave_one_out(
        vectors, labels, None, None, vote_k=cal.decision.vote_k
    )
    hit = (score >= cal.decision.threshold) & (margin >= cal.decision.margin)
    hit &= agree >= cal.decision.agreement
    assert correct[hit].mean() >= 0.99
    # a question about a label the cache lacks must miss
    assert cal.out_of_scope_hit_rate is not None and cal.out_of_scope_hit_rate <= 0.01


def test_unreachable_target_falls_back_uncalibrated() -> None:
    rng = np.random.default_rng(1)
    vectors, labels = _clusters(rng, 5, 6, 3.0)  # clusters overlap completely
    fallback = Decision(0.95, 0.1)
    cal = calibrate(vectors, labels, target_precision=0.99, fallback=fallback)
    assert not cal.calibrated and cal.decision == fallback
    assert not calibrate(vectors[:1], labels[:1], fallback=fallback).calibrated
