"""The release views (``precompute/views.py``): ``--json`` keeps its field names and writes the
manifest's models as the manifest holds them; the HTML report renders from the views. No
release is built: the views are made from manifest models directly (fast)."""

from __future__ import annotations

import html
import re

from base.manifest import Derived, EmbedderEntry, Expiry, IndexSettings, ProfileEntry, Threshold
from precompute.report import render_html
from precompute.views import (
    CALIBRATION,
    CalibrationChange,
    ChangedCluster,
    ClusterBrief,
    ClusterPhrasing,
    DiffCounts,
    Excluded,
    ReleaseCounts,
    ReleaseDiff,
    ReleaseSummary,
    ReleaseView,
    TopCluster,
    TopQuestion,
    as_json,
    describe_semantic_tier,
)

HOSTILE = "Is <script>alert(1)</script> my card blocked?"
# an old manifest's threshold: some fields absent (they stay absent in ``show``'s JSON)
THRESHOLD = Threshold.of(
    {
        "value": 0.91,
        "margin": 0.05,
        "semantic": False,
        "semantic_off_reason": "too few phrasings",
        "precision": 0.97,
        "hit_rate": 0.4,
        "target_precision": 0.99,
        "curve": [[0.8, 0.95, 0.6], [0.91, 0.97, 0.4], [0.99, None, 0.0]],
        "unknown_later_field": 1,
    }
)


def _view() -> ReleaseView:
    phrasing = ClusterPhrasing(question=HOSTILE, hits=7, canonical=True)
    return ReleaseView(
        version="v2",
        current=True,
        created_at="2026-11-30T00:00:00+00:00",
        parent="v1",
        derived=Derived.of({"from": "v1", "by": "r-1", "runner": "revoke"}),
        runner=None,
        log_range=None,
        counts=ReleaseCounts.of({"clusters": 1, "rows": 2, "expired": 0}),
        excluded=Excluded(rows={"below_k": 120, "pii": 7}, clusters={}),
        calibration=THRESHOLD,
        profile=ProfileEntry.of({"name": "p", "inputs": {"model": "m", "language": "en"}}),
        embedder=EmbedderEntry.of({"name": "embedded", "dim": 384}),
        index=IndexSettings.of(
            {"factory": "Flat", "ef_construction": 0, "ef_search": 0, "nprobe": 0}
        ),
        expiry=Expiry.of({"ttl_days": 7, "jitter": 0.1}),
        signed_by=None,
        top_questions=[TopQuestion(question=HOSTILE, hits=7, users=5, cluster="c", canonical=True)],
        top_clusters=[TopCluster(cluster="c", hits=7, answer="<b>no</b>", phrasings=[phrasing])],
    )


def _diff() -> ReleaseDiff:
    brief = ClusterBrief(cluster="c", question=HOSTILE, phrasings=1)
    return ReleaseDiff(
        old="v1",
        new="v2",
        counts=DiffCounts(
            added=1, dropped=0, changed=1, unchanged=0, phrasings_gained=0, phrasings_lost=0
        ),
        added=[brief],
        dropped=[],
        changed=[ChangedCluster(**brief.model_dump(), old_answer="a", new_answer="b")],
        calibration=CalibrationChange(old=Threshold.of({}), new=THRESHOLD),
    )


def test_json_keeps_its_field_names_and_the_manifest_s_own_shape() -> None:
    shown = _view().as_json()
    assert list(shown) == [
        "version", "current", "created_at", "parent", "derived", "runner", "log_range", "counts",
        "excluded", "calibration", "profile", "embedder", "index", "expiry", "signed_by",
        "top_questions", "top_clusters",
    ]  # fmt: skip
    # the threshold as the manifest holds it: absent fields absent, unknown ones kept
    assert shown["calibration"] == THRESHOLD.as_dict()
    assert "vote_k" not in shown["calibration"] and shown["calibration"]["unknown_later_field"] == 1
    assert shown["derived"] == {"from": "v1", "by": "r-1", "runner": "revoke"}  # its JSON name
    assert shown["counts"] == {"clusters": 1, "rows": 2, "expired": 0}
    assert shown["excluded"] == {"rows": {"below_k": 120, "pii": 7}, "clusters": {}}
    assert list(shown["top_questions"][0]) == ["question", "hits", "users", "cluster", "canonical"]
    assert list(shown["top_clusters"][0]) == ["cluster", "hits", "answer", "phrasings"]

    diff = _diff().as_json()
    assert list(diff) == ["old", "new", "counts", "added", "dropped", "changed", "calibration"]
    assert list(diff["changed"][0]) == [
        "cluster", "question", "phrasings", "old_answer", "new_answer"
    ]  # fmt: skip
    # list's and diff's calibration: the main fields, with the readers' defaults
    assert list(diff["calibration"]["old"]) == list(CALIBRATION)
    assert diff["calibration"]["old"]["value"] == 0.9 and diff["calibration"]["old"]["margin"] == 0
    assert diff["calibration"]["new"]["semantic_off_reason"] == "too few phrasings"

    summary = ReleaseSummary(
        version="v2",
        current=True,
        created_at="2026-11-30T00:00:00+00:00",
        parent=None,
        entries=2,
        clusters=1,
        calibration=THRESHOLD,
        signed_by="k",
        derived=None,
    )
    (listed,) = as_json([summary])
    assert list(listed) == [
        "version", "current", "created_at", "parent", "entries", "clusters", "calibration",
        "signed_by", "derived",
    ]  # fmt: skip
    assert listed["calibration"] == {name: getattr(THRESHOLD, name) for name in CALIBRATION}
    assert listed["derived"] is None
    assert as_json({"plain": 1}) == {"plain": 1}  # rollback's, explain's: printed as they are


def test_the_report_renders_from_the_views() -> None:
    page = render_html(_view(), _diff())
    decision = re.search(r"<th>decision</th><td>(.*?)</td>", page)
    off = describe_semantic_tier(THRESHOLD)
    assert off == "semantic tier: OFF (too few phrasings)"
    assert decision is not None and decision[1] == html.escape(
        f"{off}; threshold 0.91, margin 0.05, agreement 0.0; precision 0.97, hit rate 0.4"
    )
    assert "<th>model</th><td>m</td>" in page and "<th>expired now</th><td>0</td>" in page
    assert HOSTILE not in page and html.escape(HOSTILE) in page  # text, never markup
    assert "v1 → v2: 1 added, 0 dropped, 1 changed" in page
    assert "Log rows left out by mining" in page  # its chart
    assert render_html(_view(), None).count("No parent release is kept") == 1
