"""The semantic decision and its calibration from labelled phrasings."""

from __future__ import annotations

import numpy as np
import pytest

from semantic.matcher import Decision, calibrate, features, leave_one_out, wilson_lower


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


def test_out_of_scope_lookups_count_against_precision() -> None:
    """Topics in sibling pairs: a question about a topic the release lacks lands on its sibling.
    Calibrated for in-scope lookups only, the decision keeps its precision on them but not once
    some lookups are out of scope; ``out_of_scope_share`` counts those hits as wrong answers and
    trades hit rate for precision on the mix."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(15, 32))
    parts = [
        c + 0.5 * rng.normal(size=32) + 0.3 * rng.normal(size=(30, 32))
        for c in centres
        for _ in range(2)
    ]
    vectors = np.concatenate(parts)
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    labels = [f"l{i}" for i in range(len(parts)) for _ in range(30)]

    def mixed_precision_bound(cal, share: float) -> float:  # type: ignore[no-untyped-def]
        d = cal.decision
        arrays = [
            leave_one_out(vectors, labels, None, None, held_out_labels=held, vote_k=d.vote_k)
            for held in (False, True)
        ]
        (score, margin, agree, correct), (o_score, o_margin, o_agree, _) = arrays
        hit = (score >= d.threshold) & (margin >= d.margin) & (agree >= d.agreement)
        o_hit = (o_score >= d.threshold) & (o_margin >= d.margin) & (o_agree >= d.agreement)
        weight = share / (1 - share)
        return wilson_lower(int((hit & correct).sum()), hit.sum() + weight * o_hit.sum(), 1.645)

    in_scope_only = calibrate(vectors, labels, out_of_scope_share=0.0)
    mixed = calibrate(vectors, labels, out_of_scope_share=0.3)
    assert in_scope_only.calibrated and mixed.calibrated
    assert mixed.as_manifest()["out_of_scope_share"] == 0.3
    assert mixed_precision_bound(in_scope_only, 0.3) < 0.99 <= mixed_precision_bound(mixed, 0.3)
    assert mixed.hit_rate < in_scope_only.hit_rate
    assert mixed.decision.threshold > in_scope_only.decision.threshold
    with pytest.raises(ValueError, match="out_of_scope_share"):
        calibrate(vectors, labels, out_of_scope_share=1.0)
