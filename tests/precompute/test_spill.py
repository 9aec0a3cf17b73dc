"""What the mine stage keeps on local disk instead of in memory (``precompute/spill.py``), and
the window's wordings read back from DuckDB (``precompute/reduction.py``)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import precompute.spill as spill
from precompute.carry import carry
from precompute.config import MiningConfig
from precompute.logwindow import LogWindow
from precompute.questions import HotQuestion, Phrasing
from precompute.spill import ClusterSpill, HotSpill

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


def _question(n: int, score: float, users: int) -> HotQuestion:
    seen = {f"user-{n}-{i}": NOW - timedelta(minutes=i) for i in range(3)}
    wording = Phrasing(f"{n:064x}", f"question {n}", f"Question {n}?", set(seen), 3, seen)
    return HotQuestion(wording, [wording], users, 3, score)


def _spilled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: bool, seed: int
) -> tuple[list[HotQuestion], HotSpill]:
    """23 questions of random scores and askers kept in a ``HotSpill``: on disk 4 a part,
    read back 3 rows a part at a time (``folder``), or held."""
    monkeypatch.setattr(spill, "SPILL_ROWS", 4)
    monkeypatch.setattr(spill, "READ_ROWS", 3)
    rng = random.Random(seed)
    questions = [_question(n, rng.choice([1.0, 2.5, 3.0]), rng.randint(5, 7)) for n in range(23)]
    hot = HotSpill(tmp_path / "hot" if folder else None)
    for question in questions:
        hot.add(question)
    return questions, hot


@pytest.mark.parametrize("folder", [False, True])
def test_questions_come_back_in_rank_order_from_parts_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: bool
) -> None:
    questions, hot = _spilled(tmp_path, monkeypatch, folder, seed=7)
    assert len(list((tmp_path / "hot").glob("*.parquet"))) == (5 if folder else 0)
    ranked = sorted(questions, key=lambda h: (-h.score, -h.users, h.key))
    assert len(hot) == 23 and list(hot) == ranked
    assert list(hot) == ranked  # read as often as asked
    hot.limit = 10
    assert len(hot) == 10 and list(hot) == ranked[:10]
    # all of them in one read, each with whether it is within the limit
    assert list(hot.ranked()) == [(at < 10, h) for at, h in enumerate(ranked)]


@pytest.mark.parametrize("folder", [False, True])
def test_questions_read_without_their_askers_count_them_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: bool
) -> None:
    """Read without their askers (``without_askers``: what ranking, counting and the build
    read), the questions come back in the same order with the same wordings, texts, hits and
    counts (users, networks, signers, autonomous systems, those named and those only counted),
    and no asker's name: from parts merged and from memory alike."""
    monkeypatch.setattr(spill, "SPILL_ROWS", 4)
    monkeypatch.setattr(spill, "READ_ROWS", 3)
    rng = random.Random(3)

    def wording(n: int) -> Phrasing:
        seen = {f"user-{n}-{i}": NOW - timedelta(minutes=i) for i in range(rng.randint(1, 6))}
        nets = {f"net-{n}-{i}": NOW for i in range(rng.randint(0, 3))}
        signed = dict(list(seen.items())[: rng.randint(0, len(seen))])
        return Phrasing(
            f"{n:064x}", f"question {n}", f"Question {n}?", set(seen), rng.randint(1, 9), seen,
            set(nets), nets, rng.randint(0, 4), rng.randint(0, 2), 0.0, signed,
            {"as1": NOW}, rng.randint(0, 3), rng.randint(0, 1),
        )  # fmt: skip

    questions = []
    for n in range(0, 230, 10):
        published, held = [wording(n + i) for i in range(rng.randint(1, 3))], [wording(n + 5)]
        questions.append(HotQuestion(published[0], published, 6, 9, rng.random(), held, {}))
    hot = HotSpill(tmp_path / "hot" if folder else None)
    for question in questions:
        hot.add(question)
    hot.limit = 20

    def counted(h: HotQuestion) -> list[object]:
        wordings = [(p.key, p.normalized, p.question, p.hits) for p in h.phrasings + h.held_back]
        counts = [
            (p.user_count, p.askers, len(p.latest_by_signer) + p.more_signers,
             len(p.latest_by_asn) + p.more_asns)
            for p in h.phrasings + h.held_back
        ]  # fmt: skip
        return [h.key, h.question, h.users, h.hits, h.score, wordings, counts]

    full, lean = list(hot.ranked()), list(hot.ranked(askers=False))
    assert [(w, counted(h)) for w, h in lean] == [(w, counted(h)) for w, h in full]
    assert [counted(h) for h in hot.questions(askers=False)] == [counted(h) for h in hot]
    assert len(list(hot.questions(askers=False))) == 20
    assert all(
        not p.users and not p.networks and not p.latest_by_user and not p.latest_by_signer
        for _, h in lean
        for p in h.phrasings + h.held_back
    )


@pytest.mark.parametrize("folder", [False, True])
def test_questions_read_as_tables_are_the_rows_read_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: bool
) -> None:
    """``HotSpill.tables`` (what ``hot/`` is written from: the parts merged by their rank
    columns, rows taken with Arrow, never Python objects) holds the first ``limit`` questions
    in rank order, those ``drop`` names left out, exactly as reading them one by one does;
    ``put_hot_tables`` writes the same ``hot/`` as ``put_hot``."""
    import precompute.workarea as workarea
    from base.store import FileStore
    from precompute.workarea import WorkArea

    questions, hot = _spilled(tmp_path, monkeypatch, folder, seed=11)
    for limit, drop in ((None, set()), (17, {questions[3].key, questions[20].key})):
        hot.limit = limit
        expected = [h.as_row() for h in hot if h.key not in drop]
        tables = list(hot.tables(drop))
        assert [row for t in tables for row in t.to_pylist()] == expected
        assert all(len(t) <= 4 for t in tables)
    hot.limit = 17
    monkeypatch.setattr(workarea, "HOT_PART_ROWS", 5)  # parts of 5, 5, 5 and 2
    handed: dict[str, list[tuple[int, list[str]]]] = {"objects": [], "tables": []}
    for way in ("objects", "tables"):
        work = WorkArea(FileStore(tmp_path / way), "p", "r")

        def each(i: int, part: list[HotQuestion], way: str = way) -> None:
            handed[way].append((i, [h.key for h in part]))

        put = work.put_hot(iter(hot), each) if way == "objects" else None
        count = put if put is not None else work.put_hot_tables(hot.tables(), each)
        assert count == 17
    a, b = (WorkArea(FileStore(tmp_path / way), "p", "r") for way in ("objects", "tables"))
    assert (
        [h.as_row() for h in a.hot()] == [h.as_row() for h in b.hot()] == [h.as_row() for h in hot]
    )
    assert handed["objects"] == handed["tables"] and [i for i, _ in handed["tables"]] == [
        0,
        1,
        2,
        3,
    ]
    assert len(list((tmp_path / "tables").rglob("hot/*.parquet"))) == 4


def test_the_cluster_report_keeps_its_order_and_reads_dropped_clusters_relabelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "SPILL_ROWS", 2)
    rows = ClusterSpill(tmp_path / "clusters")
    for n in range(5):
        rows.append(_question(n, 1.0, 5).report_row("selected"))
    rows.append({"cluster": None, "status": "unverified_crowd", "signed_users": 0, "asns": 1})
    rows.relabel([f"{3:064x}"], "revoked")
    got = list(rows)
    assert [r["cluster"] for r in got] == [f"{n:064x}" for n in range(5)] + [None]
    assert [r["status"] for r in got] == ["selected"] * 3 + ["revoked", "selected"] + [
        "unverified_crowd"
    ]
    assert got[-1]["signed_users"] == 0 and got[0]["signed_users"] is None


def test_the_wordings_are_read_from_the_window_by_column_and_by_row() -> None:
    rows = [
        {"ts": NOW - timedelta(hours=i), "user": f"u{i % 7}", "network": f"n{i % 5}", "query": q}
        for i, q in enumerate(["How do I reset my password?"] * 6 + ["Where is my order?"] * 3)
    ]
    config = MiningConfig(k=2)
    with LogWindow(64) as window:
        window.add(rows)
        wordings, _ = window.wordings(config, NOW, carry((), config, NOW).tables)
        assert len(wordings) == 2
        assert wordings.column("hits").to_pylist() == [6, 3]  # most askers first
        (picked,) = wordings.picked([1, 0, 1])
        assert picked.column("hits").to_pylist() == [3, 6, 3]
        with pytest.raises(ValueError, match="no column 'ts'"):
            wordings.column("ts")
        with pytest.raises(IndexError, match=r"\[0, 2\)"):
            list(wordings.picked([2]))
        assert list(wordings.picked([])) == []
