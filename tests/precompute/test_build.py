"""Release building: degenerate answers are left out and counted; every row records its checks."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from edge_index.answers import CHECKS
from precompute.build import build_release
from precompute.config import BuildConfig
from precompute.generate import flag_of
from tests.releases import hot_questions

NOW = datetime(2026, 11, 29, tzinfo=UTC)
GOOD = {
    "How do I freeze my card?": "Open the app, tap your card, then tap Freeze card.",
    "What are your opening hours?": "Our branches are open 9am to 5pm, Monday to Friday.",
}
LOOP = (
    "La femme de France, le capital de la femme de France, la femme de France, le capital de "
    "la femme de France."
)


def test_a_repetitive_answer_is_excluded_and_counted(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    looping = "What is the capital of France?"
    stale = "How do I close my account?"  # flagged by no check when it was generated
    hot = hot_questions(embedder, [*GOOD, looping, stale], NOW)
    texts = {**GOOD, looping: LOOP, stale: "Close it in the app. " * 8}
    answers = {
        h.key: {
            "question": h.question,
            "answer": texts[h.question],
            "finish_reason": "stop",
            # what generation records; the stale partition's rows predate the checks
            "flag": ""
            if h.question == stale
            else flag_of(h.question, texts[h.question], "stop", None),
            "generated_at": NOW,
        }
        for h in hot
    }
    manifest, report = build_release(
        tmp_path / "release",
        hot,
        answers,
        embedder,
        "embedded",
        "p",
        {"model": "test"},
        BuildConfig(),
        now=NOW,
    )
    assert report.excluded_clusters == {"answer_repetitive": 2}
    assert report.clusters == 2
    rows = [
        r
        for shard in manifest["shards"]
        for r in pq.read_table(tmp_path / "release" / shard["rows"]["path"]).to_pylist()
    ]
    assert sorted(r["question"] for r in rows) == sorted(GOOD)
    assert {r["checks"] for r in rows} == {",".join(CHECKS)}
