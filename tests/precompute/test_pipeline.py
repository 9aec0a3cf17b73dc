"""The precompute end to end: request logs in S3 -> mined, generated, built, published release."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from base.keys import InvalidQueryError, key
from base.release import load_release, read_pointer
from base.store import FileStore, Store, open_store
from origin.engine.offline import generate_many
from policy.pii import find_pii
from precompute.config import PipelineConfig, PrecomputeSettings
from precompute.generate import generate_all, nightly_engine
from precompute.pipeline import STAGES, RunParams, run_pipeline
from precompute.samplelogs import generate_rows, write_logs
from precompute.workarea import WorkArea
from semantic.guard import content_tokens
from tests.anonymity import rare_tokens
from tests.conftest import fast_weights
from tests.releases import load_checked
from tests.test_cli import precompute_run

UNTIL = date(2026, 11, 28)
SINCE = UNTIL - timedelta(days=6)


def _alone_above_k(rows: list[dict[str, Any]], k: int) -> set[str]:
    """The keys single-turn, successful, personal-data-free rows of >= k users typed: each is
    published (a question asked by k people, whose every token those k typed), whatever else is."""
    users: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r["turns"] > 1 or r["status"] >= 400 or find_pii(r["query"]):
            continue
        try:
            users[key(r["query"])].add(r["user"])
        except InvalidQueryError:
            continue
    return {q for q, u in users.items() if len(u) >= k}


class _Killer(threading.Thread):
    """Kills (SIGKILL) the Ray worker that starts the first partition of a run in ``store``, as
    soon as it records its attempt: it is then building its engine or answering, and the
    partition is lost with it."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store, self.killed, self.partition = store, "", -1
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            attempts = [p for p in self.store.list() if fnmatch(p, "*/work/*/attempts/*.json")]
            for path in attempts:
                try:
                    record = json.loads(self.store.get(path))
                    host, pid = record["worker"].rsplit(":", 1)
                    if host != socket.gethostname():
                        raise RuntimeError(f"the worker {record['worker']} is not on this host")
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError, RuntimeError) as error:  # the test says why
                    self.killed = f"not killed: {error!r}"
                    return
                self.killed, self.partition = record["worker"], int(record["partition"])
                return


def test_precompute_run_publishes_what_the_rules_allow_and_a_lost_worker_costs_its_partition(
    s3_bucket: str, cli_env: dict[str, str], ray_address: str, embedded_model: Any, tmp_path: Path
) -> None:
    """``edgeqa precompute run``, logs and release in S3, the model stages on the session's Ray
    with two engines at the nightly default (int8), one Ray worker killed as it starts its first
    partition: the run publishes what the rules allow, only the lost partition is answered
    twice, and the release is the one every stage in this process builds, answer for answer."""
    rows = generate_rows(UNTIL, intents=5, users=120, asks=500, tail_questions=20)
    logs = open_store(f"s3://{s3_bucket}/logs-root")
    assert write_logs(logs, rows) == len(rows)
    env = {**cli_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    env["EDGEQA_RAY_ADDRESS"] = ray_address  # the model stages on the session's Ray
    env["EDGEQA_RAY_WORKERS"] = "2"
    out = open_store(f"s3://{s3_bucket}/edge")
    killer = _Killer(out)
    killer.start()
    try:
        result = precompute_run(
            env,
            f"s3://{s3_bucket}/logs-root",
            f"s3://{s3_bucket}/edge",
            "2026-11-22",
            "2026-11-28",
            *("--max-tokens", "64", "--partition-size", "3"),
        )
    finally:
        killer.done.set()
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json.loads(result.stdout)
    assert list(reports) == ["en"]
    report = reports["en"]
    assert report["status"] == "published"
    release = load_checked(out, report["profile"])  # every sha256 checked
    assert release.version == report["version"]
    published = {r["key"] for s in release.shards for r in s.rows.to_pylist()}
    flagged = report["generation"]["flagged"]
    excluded_clusters = dict(report["build"]["excluded_clusters"])
    excluded_clusters.pop("answer_link", None)  # judged at build, not flagged at generation
    assert sum(flagged.values()) == sum(excluded_clusters.values())
    alone = _alone_above_k(rows, k=5)
    if not flagged:  # clusters whose answer was cut off are flagged, never published
        assert published >= alone
    assert report["mining"]["phrasings_kept"] >= len(alone)
    assert published
    # no published text holds a token fewer than k people typed
    rare = rare_tokens(rows, 5)
    for shard in release.shards:
        for r in shard.rows.to_pylist():
            assert not content_tokens(r["question"]) & rare, r["question"]

    excluded = report["excluded_rows"]
    assert excluded["pii"] == 30 and excluded["multi_turn"] == 40
    assert excluded["failed_request"] == 10 and excluded["below_k"] >= 20
    assert set(report["mining"]["pii_by_kind"]) >= {"email", "card", "phone", "url_secret"}
    gen = report["generation"]
    assert gen["answers_per_s"] > 0 and gen["tokens_per_s"] > 0
    assert list(report["timings_s"]) == list(STAGES)  # every stage ran, in order
    assert report["validate"]["status"] == "passed" and report["runner"] == "cli"
    # where each stage ran: the model stages as Ray jobs on the Ray it was told of
    on_ray = rf"ray \({re.escape(ray_address)}, \d workers?\)"
    assert re.fullmatch(on_ray, report["ran_on"]["generate"]), report["ran_on"]
    assert re.fullmatch(rf"this process; embedding: {on_ray}", report["ran_on"]["mine"])
    assert set(report["ran_on"]) == set(STAGES) and report["ran_on"]["build"] == "this process"
    # nothing personal reached the edge
    for shard in release.shards:
        for r in shard.rows.to_pylist():
            assert not find_pii(r["question"])

    # a worker was lost: only its partition was answered twice
    assert killer.killed, "no worker was killed: the run recorded no attempt"
    assert killer.partition >= 0, killer.killed
    generation = report["generation"]
    assert generation["partitions"] >= 3
    attempts = WorkArea(out, report["profile"], report["run_id"]).attempts()
    assert sorted(attempts) == list(range(generation["partitions"]))
    twice = {index: len(tried) for index, tried in attempts.items() if len(tried) > 1}
    assert twice == {killer.partition: 2}, attempts
    assert generation["redone"] == [killer.partition]
    assert killer.killed in {a["worker"] for a in attempts[killer.partition]}

    # the reference: the same logs, every stage in this process with the model loaded here
    local = FileStore(tmp_path / "logs")
    write_logs(local, rows)
    config = PipelineConfig.from_env({}, max_tokens=64, partition_size=3)
    window = RunParams(local.uri, FileStore(tmp_path / "here").uri, SINCE, UNTIL, config)
    here = run_pipeline(window, model=embedded_model)
    assert here["ran_on"]["generate"] == "this process" and here["status"] == "published"
    # the same release, byte for byte in its content (the same version), the same tokens
    assert here["version"] == report["version"]
    assert here["generation"]["generated"] == generation["generated"]
    assert here["generation"]["tokens"] == generation["tokens"]


def test_the_mined_questions_are_parquet_parts_read_back_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hot/``: the mined questions in rank order, a part of ``HOT_PART_ROWS`` at a time, read
    back equal (askers, their latest asks to the microsecond in UTC, held-back wordings, rare
    tokens); generation reads two columns of it; an empty night is an empty dataset."""
    import precompute.workarea as workarea
    from precompute.questions import HotQuestion, Phrasing

    def wording(key: str, seconds: int) -> Phrasing:
        at = datetime(2026, 11, 28, 12, 0, seconds, 123456, tzinfo=UTC)
        return Phrasing(
            key,
            f"n {key}",
            f"How do I {key}?",
            {"u1", "u2"},
            3,
            {"u1": at, "u2": at},
            {"n1"},
            {"n1": at},
            more_users=2,
            latest_by_signer={"u1": at},
            latest_by_asn={"as1": at},
            more_asns=1,
        )

    hot = [
        HotQuestion(
            wording(f"k{i}", i),
            [wording(f"k{i}", i), wording(f"k{i}b", i)],
            2,
            6,
            1.0 / (i + 1),
            held_back=[wording(f"k{i}c", i)],
            rare_tokens={f"k{i}c": 1},
            synthesized=i == 1,
        )
        for i in range(5)
    ]
    monkeypatch.setattr(workarea, "HOT_PART_ROWS", 2)
    work = WorkArea(FileStore(tmp_path), "p", "0123456789abcdef")
    handed: list[tuple[int, list[str]]] = []
    assert work.put_hot(iter(hot), lambda i, part: handed.append((i, [h.key for h in part]))) == 5
    # each part's questions handed over as it is written (``reused/`` beside it: one read)
    assert handed == [(0, ["k0", "k1"]), (1, ["k2", "k3"]), (2, ["k4"])]
    parts = sorted(work.store.list(f"{work.prefix}/hot/"))
    assert [p.rsplit("/", 1)[1] for p in parts] == [
        "00000.parquet",
        "00001.parquet",
        "00002.parquet",
    ]
    assert list(work.hot()) == hot
    parts = list(work.hot_tables(["key", "question"]))
    assert [t.column_names for t in parts] == [["key", "question"]] * 3
    assert [k for t in parts for k in t.column("key").to_pylist()] == [h.key for h in hot]
    # written again (a rerun), smaller: the parts of the longer night are gone
    assert work.put_hot(hot[:1]) == 1 and list(work.hot()) == hot[:1]
    assert work.put_hot([]) == 0 and list(work.hot()) == []


def test_the_cluster_report_is_parquet_parts_read_back_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import precompute.workarea as workarea

    rows = [
        {
            "cluster": f"k{i}",
            "status": "selected",
            "identities": 7,
            "question": f"How do I {i}?",
            "synthesized": False,
            "published": [{"key": f"k{i}", "question": f"How do I {i}?", "identities": 6}],
            "held_back": [
                {"key": f"h{i}", "reason": "rare_tokens", "rare_tokens": 1, "identities": 1}
            ],
        }
        for i in range(3)
    ]
    rows.append(
        {
            "cluster": None,
            "status": "unverified_crowd",
            "identities": 5,
            "signed_users": 0,
            "asns": 1,
            "question": None,
            "synthesized": False,
            "published": [],
            "held_back": [],
        }
    )
    monkeypatch.setattr(workarea, "HOT_PART_ROWS", 3)
    work = WorkArea(FileStore(tmp_path), "p", "0123456789abcdef")
    assert work.put_clusters(iter(rows)) == f"{work.prefix}/clusters/"
    assert len(work.store.list(f"{work.prefix}/clusters/")) == 2
    blank = {"signed_users": None, "asns": None}
    assert list(work.clusters()) == [{**blank, **row} for row in rows]


def test_generation_resumes_after_a_crash_without_redoing_finished_partitions(
    embedded_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import origin.engine.offline as offline

    work = WorkArea(FileStore(tmp_path), "p", "run")
    settings = PrecomputeSettings.from_env({"EDGEQA_MAX_TOKENS": "8"})
    questions = [f"What is {n} plus {n}?" for n in range(5)]
    keys = [key(q) for q in questions]
    generated: list[str] = []
    engine = nightly_engine(settings, fast_weights(), embedded_model)
    crash_after: list[int | None] = [None]  # the engine's worker dies past this many questions

    def crashing(_: Any, prompts: Any, params: Any, progress: bool = False) -> Any:
        if crash_after[0] is not None and len(generated) >= crash_after[0]:
            raise RuntimeError("worker died")
        generated.extend(p[-1]["content"] for p in prompts)
        return generate_many(engine, prompts, params, progress=progress)

    def crashing_engine(after: int | None) -> Any:
        crash_after[0] = after
        return engine

    monkeypatch.setattr(offline, "generate_many", crashing)

    with pytest.raises(RuntimeError, match="worker died"):
        generate_all(
            lambda: crashing_engine(2),
            work,
            keys,
            questions,
            settings,
            2,
            progress=False,
        )
    assert generated == questions[:2]  # the first partition finished and was saved
    rows, report = generate_all(
        lambda: crashing_engine(None),
        work,
        keys,
        questions,
        settings,
        2,
        progress=False,
    )
    assert generated == questions  # only partitions 2 and 3 were generated on the rerun
    assert report.partitions == 3 and report.partitions_reused == 1 and report.generated == 3
    assert [r["question"] for r in rows] == questions
    for r in rows:  # an answer cut off by max_tokens is flagged
        assert r["flag"] == ("truncated" if r["finish_reason"] == "length" else "")
    # a third run reuses everything
    rows_again, again = generate_all(
        lambda: crashing_engine(0),
        work,
        keys,
        questions,
        settings,
        2,
        progress=False,
    )
    assert again.partitions_reused == 3 and rows_again == rows


def test_cli_refuses_bad_dates(cli_env: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        [
            "edgeqa",
            "precompute",
            "run",
            "--logs",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--since",
            "2026-11-30",
            "--until",
            "2026-11-01",
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2 and "after it ends" in result.stderr
    result = subprocess.run(
        [
            "edgeqa",
            "precompute",
            "run",
            "--logs",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--since",
            "yesterday",
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2 and "YYYY-MM-DD" in result.stderr


def test_nothing_to_publish_leaves_the_store_untouched(embedded_model: Any, tmp_path: Path) -> None:
    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams, run_pipeline

    logs, out = FileStore(tmp_path / "logs"), FileStore(tmp_path / "out")
    write_logs(logs, generate_rows(UNTIL, intents=2, users=3, asks=20, tail_questions=0))
    params = RunParams(logs.uri, out.uri, UNTIL, UNTIL, PipelineConfig.from_env({}))
    report = run_pipeline(params, model=embedded_model)
    assert report["status"] == "nothing_to_publish" and report["version"] is None
    assert read_pointer(out, report["profile"]) == (None, None)


def test_the_next_night_reuses_answers_and_keeps_what_the_cdn_served(
    embedded_model: Any, tmp_path: Path
) -> None:
    """Night 2 (the window a day later, one cluster's asks all answered by the CDN, so absent
    from the logs) builds on night 1's release: its answers are reused, the unlogged cluster
    stays published on carried evidence, a revoked one does not come back; 30 days later the
    unlogged cluster has faded out."""
    from datetime import UTC, datetime, timedelta
    from datetime import time as day_time

    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams, run_pipeline
    from precompute.revocations import revoke

    rows = generate_rows(UNTIL, intents=8, users=120, asks=600, tail_questions=10)
    config = PipelineConfig.from_env(
        {}, max_tokens=128, quantization=fast_weights(), ttl_days=3650.0
    )
    out = FileStore(tmp_path / "out")

    def night(until: date, logged: list[dict[str, Any]]) -> tuple[dict[str, Any], dict]:
        logs = FileStore(tmp_path / f"logs-{until}")
        write_logs(logs, logged)
        started = datetime.combine(until, day_time.max, UTC)
        params = RunParams(
            logs.uri, out.uri, until - timedelta(days=6), until, config, started=started
        )
        report = run_pipeline(params, model=embedded_model)
        clusters: dict[str, set[str]] = defaultdict(set)
        for shard in load_release(out, report["profile"]).shards:
            for row in shard.rows.to_pylist():
                clusters[row["cluster"]].add(row["key"])
        return report, clusters

    first, published = night(UNTIL, rows)
    assert first["status"] == "published" and first["generation"]["reused"] == 0
    served, revoked = sorted(published)[:2]  # two clusters: one served by the CDN, one revoked
    revoke(out, first["profile"], "wrong answer", "test", cluster=revoked)
    unlogged = published[served] | published[revoked]
    tonight = [r for r in rows if r["key"] not in unlogged]
    assert len(tonight) < len(rows)

    second, now_published = night(UNTIL + timedelta(days=1), tonight)
    assert second["run_id"] != first["run_id"]  # another night: nothing resumed, reused
    generation = second["generation"]
    assert generation["partitions_reused"] == 0
    assert generation["reused"] / generation["answers"] >= 0.95
    # every phrasing of night 1 but the revoked cluster's (a cluster's canonical phrasing, its
    # id, may change with the window)
    keys = set().union(*published.values())
    assert set().union(*now_published.values()) == keys - published[revoked]
    mining = second["mining"]
    assert mining["carried_from"] == read_pointer(out, first["profile"])[0].parent
    assert mining["carried_phrasings"] >= len(unlogged) and mining["carried_users"] > 0
    release = load_release(out, second["profile"])
    by_key = {r["key"]: r for s in release.shards for r in s.rows.to_pylist()}
    assert {by_key[k]["hits"] for k in published[served]} == {0}  # no ask logged tonight
    assert all(
        by_key[k]["generated_at"]
        == datetime.combine(UNTIL, day_time.max, UTC).replace(microsecond=0)
        for k in by_key
    )  # night 1's answers, dated as generated

    # a month on, the other questions still asked (their asks logged 30 days later)
    later = [{**r, "ts": r["ts"] + timedelta(days=30)} for r in tonight]
    third, faded = night(UNTIL + timedelta(days=30), later)
    assert set().union(*faded.values()) == keys - unlogged
    assert third["mining"]["expired_users"] > 0
    assert third["generation"]["reused"] == third["generation"]["answers"]


def test_rows_embedded_by_a_ray_job_make_the_release_the_build_s_own_embedder_makes(
    embedder, ray_address: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """On a fleet the build's rows are embedded on its GPU workers (``release_encoder``), a Ray
    job in the embedder's chunks: here on a local Ray's CPU actors, the rows and manifest are
    the ones the build's own embedder gives, the vectors too (to float rounding), and the
    report says where they were embedded. Without a fleet (no Ray named) the build embeds in
    its own process."""

    from precompute.config import BuildConfig, PrecomputeSettings
    from precompute.fleet import connect, ran_on
    from precompute.fleet.embedding import encoder, release_encoder
    from tests.precompute.test_build import GOOD, _built, assert_same_release

    texts = {**GOOD, "How do I change my PIN?": "Go to Cards, then tap Change PIN."}
    config = BuildConfig(factory="Flat")
    report, here = _built(embedder, tmp_path / "here", texts, config)
    fleet = connect(PrecomputeSettings.from_env({}))
    on_ray = encoder(fleet, "embedded", None)
    ray_report, there = _built(embedder, tmp_path / "ray", texts, config, encode=on_ray)
    assert there == here and len(here) == 3
    assert (report.embedded_on, ray_report.embedded_on) == ("here", "ray (local, 1 worker)")
    for built, said in ((report, "this process"), (ray_report, "this process; embedding: ray")):
        assert ran_on({"timings_s": {"build": 1.0}, "build": built.as_dict()})["build"].startswith(
            said
        )
    # vectors the same to float rounding: an actor's and this process's thread counts differ
    assert_same_release(tmp_path / "here", tmp_path / "ray")
    assert release_encoder(PrecomputeSettings.from_env({}), "embedded") is None
