"""Generation reuses the parent release's answers: which ones, and without building an engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from base.keys import key
from base.store import FileStore
from precompute.config import PrecomputeSettings
from precompute.generate import generate_all, reusable_answers
from precompute.questions import HotQuestion, Phrasing
from precompute.workarea import WorkArea

NOW = datetime(2026, 11, 29, tzinfo=UTC)
ANSWER = "Open the app, tap Cards, then Freeze card."


def _cluster(*questions: str) -> HotQuestion:
    phrasings = [Phrasing(key(q), q.lower(), q, {"u"}, 1, {"u": NOW}) for q in questions]
    return HotQuestion(phrasings[0], phrasings, 1, len(phrasings), 1.0)


def _row(question: str, answer: str = ANSWER, days_old: float = 1.0) -> dict[str, Any]:
    return {"key": key(question), "answer": answer, "generated_at": NOW - timedelta(days=days_old)}


def test_which_parent_answers_are_reused() -> None:
    freeze = _cluster("How do I freeze my card?", "Freeze my card please")
    # the parent answered the cluster under another canonical phrasing: served for this one too
    moved = _cluster("How can I freeze my debit card?", "Freeze my card please")
    old = _cluster("How do I order a new card?")
    refusal = _cluster("How do I close my account?")
    unknown = _cluster("What is my sort code?")
    # flagged by the parent's run: reused, flag and all; an engine error is tried again
    cut = _cluster("How do I dispute a transaction?")
    failed = _cluster("How do I set up a direct debit?")
    flagged = [
        {**_row("How do I dispute a transaction?", "First, open"), "flag": "truncated"},
        {**_row("How do I set up a direct debit?", ""), "flag": "error"},
    ]
    parent = [
        _row("How do I freeze my card?"),
        _row("Freeze my card please", answer="Tap Cards, then Freeze.", days_old=2),
        _row("How do I order a new card?", days_old=4),  # past the bound: generated again
        _row("How do I close my account?", answer="I'm sorry, I can't help with that."),
    ]
    hot = [freeze, moved, old, refusal, unknown, cut, failed]
    rows = reusable_answers(hot, parent, "v1", NOW, timedelta(days=3.5), flagged)
    assert [(r["key"], r["answer"], r["flag"]) for r in rows] == [
        (freeze.key, ANSWER, ""),  # the canonical phrasing's own answer first
        (moved.key, "Tap Cards, then Freeze.", ""),
        (cut.key, "First, open", "truncated"),
    ]
    assert rows[0]["generated_at"] == NOW - timedelta(days=1)  # dated as it was generated
    assert {r["reused_from"] for r in rows} == {"v1"}


def test_a_partition_answered_by_the_parent_builds_no_engine(tmp_path: Path) -> None:
    questions = ["How do I freeze my card?", "How do I order a new card?"]
    keys = [key(q) for q in questions]
    reused = {
        r["key"]: r
        for r in reusable_answers(
            [_cluster(q) for q in questions], [_row(q) for q in questions], "v1", NOW, timedelta(1)
        )
    }

    def no_engine() -> Any:
        raise AssertionError("every answer is reused: no engine is needed")

    work = WorkArea(FileStore(tmp_path), "p", "run")
    settings = PrecomputeSettings.from_env({})
    rows, report = generate_all(
        no_engine, work, keys, questions, settings, 1, NOW, progress=False, reused=reused
    )
    assert [r["answer"] for r in rows] == [ANSWER, ANSWER]
    assert (report.reused, report.generated, report.partitions) == (2, 0, 2)
    summary = report.as_dict()
    assert summary["seconds_saved"] is None and summary["answers_per_s"] is None
