"""Generation reuses the parent release's answers: which ones, and without building an engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from base.keys import key
from base.store import FileStore, ObjectNotFoundError
from precompute.config import PrecomputeSettings
from precompute.generate import ParentAnswers, answer_schema, generate_all, reusable_answers
from precompute.questions import HotQuestion, Phrasing
from precompute.workarea import PartitionReader, WorkArea

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


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_a_worker_reads_its_partition_and_its_reused_answers_a_part_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """What a generation worker is handed is a partition's number: it reads the partition's
    questions from ``hot/`` (a partition may straddle two parts) and the answers the run reuses
    for them from ``reused/``, kept beside the part of ``hot/`` their question is in."""
    import precompute.workarea as workarea

    monkeypatch.setattr(workarea, "HOT_PART_ROWS", 3)
    questions = [f"How do I do step {n}?" for n in range(8)]
    hot = [_cluster(q) for q in questions]
    work = WorkArea(FileStore(tmp_path), "p", "run")
    work.put_hot(hot)
    parent = [_row(questions[n], answer=f"Answer {n}.") for n in (1, 4, 7)]
    answers = ParentAnswers(parent, "v1", NOW, timedelta(days=3))
    parts = [  # beside hot/'s parts of 3 questions: reused answers to 1, 4 and 7
        pa.Table.from_pylist(answers.rows(hot[at : at + 3]), schema=answer_schema())
        for at in range(0, len(hot), 3)
    ]
    assert work.put_reused(parts) == 3
    assert [p.rsplit("/", 1)[1] for p in sorted(work.store.list(f"{work.prefix}/reused/"))] == [
        "00000.parquet",  # questions 0-2: 1
        "00001.parquet",  # 3-5: 4
        "00002.parquet",  # 6-7: 7
    ]
    reader = PartitionReader(work, size, len(hot))
    assert reader.partitions == -(-8 // size)
    seen: list[str] = []
    answers: dict[str, str] = {}
    for index in range(reader.partitions):
        keys, texts = reader.questions(index)
        assert keys == [key(q) for q in texts]
        seen += texts
        found = reader.reused(index, keys)
        assert set(found) <= set(keys)
        answers.update({k: row["answer"] for k, row in found.items()})
    assert seen == questions
    assert answers == {key(questions[n]): f"Answer {n}." for n in (1, 4, 7)}
    with pytest.raises(IndexError):
        reader.questions(reader.partitions)
    work.store.delete(f"{work.prefix}/hot/00001.parquet")
    with pytest.raises(ObjectNotFoundError):
        PartitionReader(work, size, len(hot)).questions(4 // size)
    short = PartitionReader(work, size, 9)  # more questions than hot/ holds
    with pytest.raises(ValueError, match="has 2 questions"):
        short.questions(short.partitions - 1)
