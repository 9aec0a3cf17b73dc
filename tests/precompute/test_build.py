"""Release building: degenerate answers are left out and counted; every row records its checks."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from base.answer_objects import bucket_entry, bucket_problem, object_path
from base.release import serialize_index
from policy.answers import CHECKS
from precompute.build import answered, build_release
from precompute.config import BuildConfig
from precompute.curated import CURATED
from precompute.generate import flag_of
from precompute.shards import ReleaseRows, build_index, write_release_files
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
        answered(hot, answers),
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
        for shard in manifest.shards
        for r in pq.read_table(tmp_path / "release" / shard.rows.path).to_pylist()
    ]
    assert sorted(r["question"] for r in rows) == sorted(GOOD)
    assert {r["checks"] for r in rows} == {",".join(CHECKS)}


def test_held_back_wordings_calibrate_a_release_that_publishes_one_wording_per_cluster(
    embedder, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Each cluster publishes one k-safe wording; its other wordings (held back: a rare word)
    are real paraphrases, looked up against the published ones: the semantic tier calibrates on
    them, where on the published phrasings alone it cannot (one per label: nothing to hit)."""
    from base.keys import key, normalize
    from precompute.questions import HotQuestion, Phrasing
    from tests.precompute.test_mining import TASKS, WORDINGS

    def phrasing(question: str) -> Phrasing:
        users = {f"u{i}": NOW for i in range(5)}
        return Phrasing(key(question), normalize(question), question, set(users), 5, users)

    hot = []
    for verb, thing in TASKS:
        published = phrasing(WORDINGS[0].format(verb, thing))
        held_back = {}
        for wording in WORDINGS:
            for tail in ("", " asap", " please help", " thanks", " quickly"):
                held = phrasing(wording.format(verb, thing).rstrip("?") + tail)
                if held.key != published.key:
                    held_back[held.key] = held
        rare = dict.fromkeys(held_back, 1)
        hot.append(HotQuestion(published, [published], 10, 10, 1.0, list(held_back.values()), rare))
    answers = {
        h.key: {
            "question": h.question,
            "answer": f"To {h.question[9:].rstrip('?')}, open the app and follow the steps.",
            "flag": "",
            "finish_reason": "stop",
            "generated_at": NOW,
        }
        for h in hot
    }

    def threshold(clusters: list[HotQuestion], where: str) -> dict:  # type: ignore[type-arg]
        manifest, _ = build_release(
            tmp_path / where,
            answered(clusters, answers),
            embedder,
            "embedded",
            "p",
            {},
            BuildConfig(),
            now=NOW,
        )
        return manifest.threshold.as_dict()

    on = threshold(hot, "with")
    assert on["semantic"] and on["calibrated"]
    assert on["held_back_samples"] == 600 and on["samples"] == 625
    assert on["precision"] >= 0.99 and on["precision_lower_bound"] >= 0.99
    alone = [HotQuestion(h.canonical, h.phrasings, h.users, h.hits, h.score) for h in hot]
    off = threshold(alone, "without")
    assert not off["semantic"] and off["held_back_samples"] == 0
    assert "exact tier only" in off["semantic_off_reason"]
    for where in ("with", "without"):  # the held-back texts stay in the work area
        published = b"".join(p.read_bytes() for p in (tmp_path / where).rglob("*") if p.is_file())
        assert b"please help" not in published and b"quickly" not in published


def test_only_the_held_back_wordings_calibration_samples_are_embedded(embedder) -> None:  # type: ignore[no-untyped-def]
    """Past ``calibration_rows`` the held-back wordings are sampled before they are embedded:
    the same sample, and the same calibration, as embedding them all and sampling after."""
    from base.keys import key, normalize
    from precompute.calibration import HeldBack, calibrate_release
    from precompute.questions import HotQuestion, Phrasing
    from tests.precompute.test_mining import TASKS, WORDINGS

    def phrasing(question: str) -> Phrasing:
        return Phrasing(key(question), normalize(question), question, set(), 5, {})

    hot, rows = [], []
    for verb, thing in TASKS[:6]:
        wordings = [phrasing(w.format(verb, thing)) for w in WORDINGS]
        hot.append(HotQuestion(wordings[0], wordings[:2], 10, 10, 1.0, wordings[2:], {}))
        rows += [{"cluster": wordings[0].key, "question": w.question} for w in wordings[:2]]
    built = {h.key for h in hot}
    every = HeldBack.of(hot, built, embedder)
    config = BuildConfig(calibration_rows=7)
    sampled = HeldBack.of(hot, built, embedder, config.calibration_rows)
    assert len(every.labels) > 7 and len(sampled.labels) == 7
    assert set(sampled.texts) < set(every.texts)
    import numpy as np

    from semantic.batch import encode_many

    vectors = encode_many(embedder, [r["question"] for r in rows])
    release = ReleaseRows.in_memory(rows, vectors)
    assert calibrate_release(release, config, sampled) == calibrate_release(release, config, every)
    at = [every.texts.index(t) for t in sampled.texts]
    assert np.allclose(sampled.vectors, every.vectors[at], atol=1e-6)


def test_a_shard_stays_under_what_readers_accept() -> None:
    from base.manifest import MAX_SHARD_FILE_BYTES
    from precompute.shards import shard_rows_for

    rows = shard_rows_for(BuildConfig(), 384)
    assert 400_000 < rows < 500_000  # a million phrasings go out in three shards
    assert rows * 384 * 4 < MAX_SHARD_FILE_BYTES  # the vectors alone fit, with room for links
    assert shard_rows_for(BuildConfig(shard_rows=1000), 384) == 1000


def _built(  # type: ignore[no-untyped-def]
    embedder, tmp_path: Path, texts: dict[str, str], config: BuildConfig, encode=None, **extra
):
    """The release built from ``texts`` (question -> generated answer, flagged as generation
    flags it), its rows embedded by ``encode`` (None: ``embedder`` here): its report and its
    rows."""
    hot = hot_questions(embedder, list(texts), NOW)
    answers = {
        h.key: {
            "question": h.question,
            "answer": texts[h.question],
            "finish_reason": "stop",
            "flag": flag_of(h.question, texts[h.question], "stop", None),
            "generated_at": NOW,
            **extra,
        }
        for h in hot
    }
    manifest, report = build_release(
        tmp_path,
        answered(hot, answers),
        embedder,
        "embedded",
        "p",
        {"model": "test"},
        config,
        now=NOW,
        encode=encode,
    )
    rows = [
        r
        for shard in manifest.shards
        for r in pq.read_table(tmp_path / shard.rows.path).to_pylist()
    ]
    return report, rows


def test_an_answer_with_a_link_is_not_published_by_default(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A forged crowd's question ("... the answer is: visit evil.example") gets the model to
    repeat it: such an answer is left out (``answer_link``) unless the deployment allows links
    (EDGEQA_ALLOW_ANSWER_LINKS), and then its rows say the check did not run."""
    linked = "How long does a transfer take?"
    texts = {**GOOD, linked: "It takes two hours. The answer is: visit evil.example to check."}
    report, rows = _built(embedder, tmp_path / "default", texts, BuildConfig())
    assert report.excluded_clusters == {"answer_link": 1}
    assert sorted(r["question"] for r in rows) == sorted(GOOD)
    assert not any("evil" in r["answer"] for r in rows)
    assert {r["checks"] for r in rows} == {",".join(CHECKS)}

    allowed = BuildConfig(allow_links=True)
    report, rows = _built(embedder, tmp_path / "allowed", texts, allowed)
    assert report.excluded_clusters == {} and len(rows) == 3
    assert {r["checks"] for r in rows} == {",".join(c for c in CHECKS if c != "link")}
    # an operator's curated answers are trusted content: their links are the operator's own
    curated = {linked: "See bank.example/transfers for the cut-off times."}
    report, rows = _built(
        embedder, tmp_path / "curated", curated, BuildConfig(), reused_from=CURATED
    )
    assert report.excluded_clusters == {} and len(rows) == 1


def _rows(n: int) -> tuple[list[dict[str, object]], np.ndarray]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rows: list[dict[str, object]] = [
        {
            "id": i,
            "key": f"{i:064x}",
            "question": f"Question {i}?",
            "normalized": f"question {i}",
            "answer": f"Answer {i}.",
            "users": 5,
            "hits": 6,
            "generated_at": now,
            "expires_at": now,
            "cluster": f"{i // 3:064x}",
            "canonical": i % 3 == 0,
            "object_sha256": "",
            "checks": "",
        }
        for i in range(n)
    ]
    vectors = np.random.default_rng(1).standard_normal((n, 8)).astype(np.float32)
    return rows, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("factory", ["HNSW8,Flat", "IVF2,Flat"])
def test_rows_read_in_uneven_parts_write_the_release_written_from_memory(
    tmp_path: Path, factory: str
) -> None:
    """The writer reads its rows a part at a time (a store's parts need not align with shards):
    parts of 7 rows across shards of 140 give the files one list in memory gives, every shard's
    index trained on the same sample (128 of 140 rows) and every object proved against the same
    root."""
    rows, vectors = _rows(300)
    config = BuildConfig(factory=factory, shard_rows=140)

    def parts():  # type: ignore[no-untyped-def]
        fresh, _ = _rows(300)
        for start in range(0, 300, 7):
            yield fresh[start : start + 7], vectors[start : start + 7]

    streamed = ReleaseRows(300, 8, parts)
    assert streamed.content_sha256() == ReleaseRows.in_memory(rows, vectors).content_sha256()
    shards_a, objects_a, root_a = write_release_files(
        tmp_path / "a", ReleaseRows.in_memory(rows, vectors), "v1", "p", config
    )
    shards_b, objects_b, root_b = write_release_files(tmp_path / "b", streamed, "v1", "p", config)
    assert [s.count for s in shards_a] == [140, 140, 20]
    assert (shards_a, objects_a, root_a) == (shards_b, objects_b, root_b)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    whole = build_index(vectors[140:280], factory, config)  # one call, the whole shard in hand
    assert serialize_index(whole) == (tmp_path / "b" / shards_b[1].index.path).read_bytes()
    table = pq.read_table(tmp_path / "b" / shards_b[1].rows.path)
    assert table.column("id").to_pylist() == list(range(140))
    assert table.column("key").to_pylist() == [r["key"] for r in rows[140:280]]
    # every key's bucket proves itself to the root and names the object its row names
    digests = table.column("object_sha256").to_pylist()
    for row, digest in zip(table.to_pylist(), digests, strict=True):
        bucket = json.loads((tmp_path / "b" / "k" / f"{row['key'][:3]}.json").read_bytes())
        assert bucket_problem(bucket, row["key"][:3], "p", "v1", root_b) is None
        assert bucket_entry(bucket, row["key"]) == digest
        obj = json.loads((tmp_path / "b" / object_path(digest)).read_bytes())
        assert obj["key"] == row["key"] and obj["answer"] == row["answer"]
    assert objects_b.count == 300 and objects_b.buckets == len(
        list((tmp_path / "b" / "k").iterdir())
    )


def test_a_source_shorter_than_it_says_is_refused(tmp_path: Path) -> None:
    rows, vectors = _rows(10)
    short = ReleaseRows(12, 8, ReleaseRows.in_memory(rows, vectors).parts)
    with pytest.raises(ValueError, match="has 10 rows, not the 12 stated"):
        write_release_files(tmp_path, short, "v1", "p", BuildConfig())
    uneven = ReleaseRows(10, 8, lambda: iter([(rows, vectors[:9])]))
    with pytest.raises(ValueError, match="10 rows came with 9 vectors"):
        write_release_files(tmp_path / "u", uneven, "v1", "p", BuildConfig())


def test_a_build_cut_in_many_parts_writes_the_release_one_part_writes(
    embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The build keeps a part of its rows and vectors at a time in a local folder: cut every
    2 rows (clusters straddle parts), it writes the rows, objects and proofs one part writes,
    and vectors that agree. Parts are whole embedder chunks, so at the default size each vector
    is the one embedding every row at once gives."""
    import precompute.build as build
    from semantic.batch import TOKENIZE_CHUNK

    assert build.PART_ROWS % TOKENIZE_CHUNK == 0
    texts = {
        **GOOD,
        "How do I change my PIN?": "Go to Cards, choose your card, then tap Change PIN.",
        "How do I order a new card?": "Open Cards and tap Order a replacement card.",
        "Where can I find my sort code?": "Your sort code is on the Account details screen.",
        "How do I set up a standing order?": "Tap Payments, then Standing orders, then New.",
    }
    _, whole = _built(embedder, tmp_path / "whole", texts, BuildConfig(factory="Flat"))
    monkeypatch.setattr(build, "PART_ROWS", 2)
    _, cut = _built(embedder, tmp_path / "cut", texts, BuildConfig(factory="Flat"))
    assert len(whole) > 2 and cut == whole
    assert_same_release(tmp_path / "whole", tmp_path / "cut")


def assert_same_release(one: Path, other: Path) -> None:
    """Two releases built under ``one`` and ``other`` hold the same answers and rows (their
    manifests' roots and content hashes), and vectors equal to float rounding."""
    a, b = (json.loads((folder / "manifest.json").read_bytes()) for folder in (one, other))
    assert (a["answers_root"], a["content_sha256"]) == (b["answers_root"], b["content_sha256"])
    vectors = []
    for folder in (one, other):
        index = faiss.read_index(str(folder / "shards" / "00000.faiss"))
        vectors.append(index.reconstruct_n(0, index.ntotal))
    assert np.allclose(vectors[0], vectors[1], atol=1e-5)


def test_vectors_the_encoder_does_not_give_for_every_row_fail_the_build(
    embedder, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """An encoder that gives fewer vectors than rows, or vectors of another dimension, stops
    the build with a message, not a release with rows and no vector."""

    def short(texts, progress=False):  # type: ignore[no-untyped-def]
        yield np.zeros((len(texts) - 1, 384), dtype=np.float32)

    def wide(texts, progress=False):  # type: ignore[no-untyped-def]
        yield np.zeros((len(texts), 385), dtype=np.float32)

    with pytest.raises(ValueError, match="gave 2 vectors for 3 rows"):
        _built(embedder, tmp_path / "a", {**GOOD, "Hi?": "Hello."}, BuildConfig(), encode=short)
    with pytest.raises(ValueError, match="the release's have 384 dimensions"):
        _built(embedder, tmp_path / "b", GOOD, BuildConfig(), encode=wide)


def test_a_build_with_no_row_still_calls_its_encoder_with_nothing(embedder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every cluster left out: the encoder is called once, with no text, so one that asked a
    fleet for GPUs ahead of the build hands them back (``RayEncoder``), and the release has no
    row."""
    called: list[int] = []

    def encode(texts, progress=False):  # type: ignore[no-untyped-def]
        called.append(len(texts))
        yield from ()

    report, rows = _built(embedder, tmp_path, {"What is France?": LOOP}, BuildConfig(), encode)
    assert called == [0] and rows == [] and report.excluded_clusters == {"answer_repetitive": 1}
