"""Mining's k step on processes (``precompute/kstep.py``): the clusters judged a chunk at a time
on several processes mine exactly what one process mines, and the chunks hold whole clusters."""

from __future__ import annotations

import dataclasses
import itertools
import random
from datetime import UTC, date, datetime
from typing import Any

import pytest

from base.keys import key
from precompute.config import MiningConfig

NOW = datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC)


def _mined(found: Any, report: Any) -> tuple[list[Any], dict[str, Any]]:
    hot = [
        (
            h.key,
            h.question,
            h.users,
            h.hits,
            round(h.score, 9),
            h.synthesized,
            [p.key for p in h.phrasings],
            [p.key for p in h.held_back],
            h.rare_tokens,
        )
        for h in found
    ]
    fields = ("excluded_phrasings", "excluded_rows", "qualifying_clusters", "clusters")
    return hot, {f: getattr(report, f) for f in fields} | {"rows": list(report.cluster_rows)}


def test_the_k_step_on_processes_mines_what_one_process_mines(
    embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import precompute.kstep
    import precompute.mining
    from precompute.mining import mine
    from precompute.samplelogs import generate_rows

    rows = generate_rows(date(2026, 11, 28), intents=6, users=90, asks=700, tail_questions=12)
    config = MiningConfig(k=5, cluster_threshold=0.9, rule_workers=1)
    one = _mined(*mine(rows, embedder, config, NOW))
    assert one[0] and one[1]["rows"]  # something published, something reported

    used: list[int] = []
    judge_all = precompute.kstep.judge_all

    def spied(chunks: Any, config: MiningConfig, now: datetime, workers: int = 1) -> Any:
        used.append(workers)
        return judge_all(list(chunks), config, now, workers)

    monkeypatch.setattr(precompute.mining, "judge_all", spied)
    monkeypatch.setattr(precompute.mining, "MANY_WORDINGS", 0)  # processes for any night
    monkeypatch.setattr(precompute.mining, "MIN_PROCESSES", 2)  # on CI's 2 CPUs too
    monkeypatch.setattr(precompute.kstep, "CHUNK_WORDINGS", 5)  # many chunks, in flight at once
    many = _mined(*mine(rows, embedder, dataclasses.replace(config, rule_workers=2), NOW))
    assert used == [2]
    assert many == one


def test_chunks_hold_whole_clusters_in_order_whatever_the_batches() -> None:
    import pyarrow as pa

    from precompute.kstep import cluster_chunks

    rng = random.Random(7)
    for _ in range(20):
        sizes = [rng.randint(1, 9) for _ in range(rng.randint(1, 60))]
        total = sum(sizes)
        cuts = sorted(rng.sample(range(1, total), min(total - 1, rng.randint(0, 8))))
        edges = [0, *cuts, total]
        batches = [pa.table({"row": list(range(a, b))}) for a, b in itertools.pairwise(edges)]
        target = rng.randint(1, 20)
        chunks = list(cluster_chunks(iter(batches), sizes, target))
        assert [s for _, chunk in chunks for s in chunk] == sizes
        rows = [r for table, _ in chunks for r in table.column("row").to_pylist()]
        assert rows == list(range(total))
        for table, chunk in chunks:
            assert table.num_rows == sum(chunk)
        assert all(sum(chunk) >= target for _, chunk in chunks[:-1])
    with pytest.raises(ValueError, match="ran out"):
        list(cluster_chunks(iter([pa.table({"row": [0, 1]})]), [2, 1]))


def test_a_built_question_takes_the_first_candidate_whose_key_is_free() -> None:
    from precompute.safetext import built_question

    candidates = ["How do I reset my password?", "How do I reset my app password?"]
    first = built_question(candidates, set())
    assert first is not None and first.question == candidates[0] and first.users == set()
    second = built_question(candidates, {key(candidates[0])})
    assert second is not None and second.question == candidates[1]
    assert built_question(candidates, {key(c) for c in candidates}) is None
