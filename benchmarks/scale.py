"""The nightly job at a large product's scale: the mine stage on growing logs, a big release
built, validated and published, and the edge loading a release of a million entries.

1. **Mine** (``--sizes``, default 100,000 and 1,000,000 rows; ``--full`` adds 10,000,000): synthetic
   logs shaped like a large product's (``benchmarks/synthetic_logs.py``: a Zipf head over 5,000
   real questions from ``../shared/data``, read by path, and a long tail of one-off wordings,
   40/60), written once per size under ``--work``. ``precompute/pipeline.py: mine_stage`` — what
   ``edgeqa precompute run`` runs first — in a child process per size, whose peak RSS is read
   (``VmHWM``): rows, distinct wordings, seconds per step (aggregate, rules, embed,
   cluster, k and text rules, rank), rows/s, peak RSS, the qualifying clusters and the
   clustering's measured neighbour recall. At the first size the same stage runs again with
   exact clustering (``IndexFlatIP``, today's search): the share of its qualifying clusters the
   approximate one finds again. Then each size's clusters are built into a release with
   stand-in answers (``build_release``: no LLM time) for the semantic tier's calibration: its
   state, samples (held-back wordings among them) and calibrated precision. The 10M size runs
   the log window's aggregation and text rules only (``precompute/logwindow.py``): embedding and
   clustering that many wordings is the GPU fleet's work; the embedding rate measured at the
   other sizes is what it needs.
2. **Release** (``--release N``, default 100,000): logs in which N distinct questions are each
   asked by 5 to 7 people, mined; answers from an operator's answers file (``--answers``, so no
   LLM time is spent); then build (written where it is served), validate and publish to
   ``file://``, seconds each. Publishing against S3's latency is ``benchmarks/publish.py``'s.
3. **Edge load** (``--edge-rows M``, default 1,000,000): a release of M entries (its vectors
   drawn at random, not embedded: what is measured is the load) written by the release writer,
   then loaded as the edge loads one (``edge_index.lookup.load_index``) in a child process:
   seconds and peak RSS.

Prints one JSON object: {"config", "nights", "rules", "mine": {"<rows>": {...}}, "exact_overlap",
"release", "edge_load"}.

4. **Two nights** (``--nights 2``, ``--rows-per-day N``, default 150,000): 8 days of N rows a
   day; night 1 mines days 1-7, night 2 days 2-8 in the same store, then days 2-8 again from
   scratch in a new store (``two_nights``): each one's seconds per step and peak RSS, what the
   caches across nights found (``precompute/nightcache.py``), night 2's seconds over night 1's,
   and the overlap of its qualifying clusters and published questions with the run from
   scratch (1.0: the same).

5. **Text rules** (``--rules N``): the rules alone on N distinct texts of the largest size's
   logs, on 1 and on 2 processes: texts/s each, and whether the verdicts are the same.

6. **Aggregation at size** (``--aggregate 10000000,30000000``): the log window alone
   (aggregation and text rules, as ``--full`` does at 10M) at each size with DuckDB given
   ``--aggregate-memory-mb`` (2048, ``EDGEQA_MINING_MEMORY_MB``): seconds, µs per row, peak RSS
   and the window's folder at its fullest (database and spill: what sizes the disk), and the
   last size's µs per row over the first's.

7. **Stages** (``--stages 300000,3000000``): each stage of a night whose every question is
   asked by ~6 people (all published), in its own process: seconds and peak RSS, mine's FAISS
   lists apart; DuckDB given ``--stage-memory-mb`` (512, ``EDGEQA_MINING_MEMORY_MB``: a budget
   the 3M-row night reaches and the 300k one does not, so it is held the same at every size);
   ``--stage-names mine`` runs only those stages (the others read what an earlier run left).

9. **The vector cache's look-up** (``--lookup 100000,400000,1600000``): the night's wordings
   looked up in a cache holding nine in ten of them, at each size, against the per-part
   ``index_in`` it replaced: seconds and µs a wording each (flat with the night: linear).

8. **The k step** (``--kstep 300000``): mining's rules 6-8 on the candidate clusters of N log
   rows, judged 20 times over on 1 and on 2 processes (forced): clusters/s each, the speedup,
   whether the judgements are the same, and what the mining process pays to take them back.

10. **Carried clusters** (``--carried 100000,400000``): rule 5 on N wordings, then a night later
   (13 % of them gone, as many new: half new wordings of old questions, half new questions)
   carrying the first night's clusters (``precompute/incremental.py``) and from scratch: the
   seconds of each, µs a wording, the state's read, map look-up and write, and the clusters.

11. **Reading the mined questions** (``--hot-read 100000``): N questions of five wordings, each
   wording with six askers, four networks and three autonomous systems (the plan's published
   cluster), kept on local disk as mine keeps them (``spill.HotSpill``), read back in rank
   order with their askers and without them (``questions.without_askers``: what ranking,
   counting and the build read): µs a question each, and whether the counts are the same.

12. **The window from its days** (``--days 200000,600000``: rows a day): 8 days; night 1
   reduces days 1-7 and keeps each (``precompute/dayparts.py``) and its text rules' verdicts;
   night 2 (days 2-8) reduced from its days (one read, six taken from the store) and, in a copy
   of the store, from its rows as one: seconds (aggregate, rules), peak RSS, the days' bytes in
   the store, and whether both give the same wordings, every column.

Run: .venv/bin/python benchmarks/scale.py [--sizes 100000,1000000] [--full] [--release 100000]
     [--edge-rows 1000000] [--skip mine,release,edge_load] [--nights 2 --rows-per-day 150000]
     [--rules 100000] [--aggregate 10000000,30000000] [--stages 300000,3000000]
     [--stage-memory-mb 512] [--stage-names mine,generate,build,validate,publish]
     [--kstep 300000] [--lookup 100000,400000,1600000] [--carried 100000,400000]
     [--hot-read 100000] [--days 200000,600000]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import DATA_DIR, ROOT
from benchmarks.synthetic_logs import real_questions, write_synthetic_logs

UNTIL = date(2026, 11, 28)
DAYS = 7
DISK_SAMPLE_S = 0.5  # how often ``--aggregate`` reads the size of the log window's folder
GENERATOR = 2  # bump when synthetic_logs.py changes: cached logs are written again (2: signed)


def _peak_rss_mb() -> float:
    """This process's own peak (``VmHWM``: ``ru_maxrss`` would report a large parent's)."""
    from base.config import peak_rss_mb

    return peak_rss_mb()


def _shared_rss_mb() -> float | None:
    """Of this process's resident memory now, the shared memory it has touched (``RssShmem``):
    a Ray driver's pages of the object store (``LOCAL_OBJECT_STORE_BYTES`` at most), which the
    high-water mark counts though they are the store's, held whoever maps them."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssShmem:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return None


def _params(logs: Path, out: Path, until: date = UNTIL, **mining: Any) -> Any:
    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams

    config = PipelineConfig.from_env().replace(mining=mining)
    started = datetime(until.year, until.month, until.day, 23, 59, 59, tzinfo=UTC)
    since = until - timedelta(days=DAYS - 1)
    return RunParams(
        f"file://{logs}", f"file://{out}", since, until, config, "benchmark", started=started
    )


def _work_area(params: Any, mined: Any) -> Any:
    """The work area of ``mined``'s run (``precompute.results.Mined``)."""
    from base.store import open_store
    from precompute.workarea import WorkArea

    return WorkArea(open_store(params.out_uri), mined.profile, mined.run)


def _stand_in_answers(hot: list[Any], now: datetime) -> dict[str, dict[str, Any]]:
    return {
        h.key: {
            "question": h.question,
            "answer": f"Here is how it works for your question about {h.question.rstrip('?')}: "
            "open the app, choose the topic, and follow the steps shown.",
            "flag": "",
            "finish_reason": "stop",
            "generated_at": now,
        }
        for h in hot
    }


def child_mine(args: dict[str, Any]) -> dict[str, Any]:
    """mine_stage on the logs; the qualifying clusters (their wordings' keys); calibration."""
    from precompute.build import answered, build_release
    from precompute.pipeline import mine_stage, scaled
    from semantic.loading import load_embedder

    out = Path(args["out"])
    mining = {"exact_cluster_rows": 10**12} if args["exact"] else {}
    until = date.fromisoformat(args.get("until", UNTIL.isoformat()))
    params = _params(Path(args["logs"]), out, until, **mining)
    started = time.perf_counter()
    mined = mine_stage(params)
    seconds = time.perf_counter() - started
    work = _work_area(params, mined)
    clusters = [
        sorted([w["key"] for w in row["published"]] + [w["key"] for w in row["held_back"]])
        for row in work.clusters()
    ]
    (out / "qualifying.json").write_text(json.dumps(clusters))
    published = [[h.key, sorted(p.key for p in h.phrasings)] for h in work.hot()]
    (out / "published.json").write_text(json.dumps(published))
    result: dict[str, Any] = {
        "stage_s": round(seconds, 2),
        "peak_rss_mb": _peak_rss_mb(),
        **mined.model_dump(mode="json", include={"logs", "excluded_rows", "mining"}),
    }
    if args["calibrate"]:
        hot = list(work.hot())
        spec = params.config.settings.embedders[params.language]
        config = scaled(params.config, spec).build
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            manifest, report = build_release(
                Path(tmp) / "release",
                answered(hot, _stand_in_answers(hot, params.now)),
                load_embedder(spec),
                spec,
                "scale",
                {"model": "stand-in"},
                config,
                now=params.now,
            )
        threshold = manifest.threshold.as_dict()
        result["calibration"] = {
            "build_s": round(time.perf_counter() - began, 2),
            "rows": report.rows,
            **{
                k: threshold[k]
                for k in (
                    "semantic",
                    "semantic_off_reason",
                    "samples",
                    "held_back_samples",
                    "precision",
                    "precision_lower_bound",
                    "hit_rate",
                    "value",
                    "margin",
                    "agreement",
                )
            },
        }
    return result


def child_aggregate(args: dict[str, Any]) -> dict[str, Any]:
    """The log window alone: aggregation and text rules, no embedding, DuckDB given
    ``memory_mb``: seconds, peak RSS and the window's folder at its fullest (its database and
    what DuckDB spilled, sampled every ``DISK_SAMPLE_S``)."""
    import threading

    from base.logreader import LogDays, LogReadStats, read_log_tables
    from base.store import open_store
    from precompute.carry import carry
    from precompute.incremental import NightCaches
    from precompute.logwindow import LogWindow

    until = date.fromisoformat(args.get("until", UNTIL.isoformat()))
    out = Path(args.get("out", args["logs"]))
    params = _params(Path(args["logs"]), out, until, memory_mb=int(args["memory_mb"]))
    config = params.config.mining
    stats = LogReadStats()
    caches = NightCaches()
    if "out" in args:  # the caches of that store: the text rules' verdicts, the days (--days)
        caches = NightCaches.of_night(
            open_store(params.out_uri),
            "benchmark",
            params.language,
            "embedded",
            params.since,
            params.until,
            config,
        )
    logs = open_store(params.logs_uri)
    days = LogDays.of(logs, params.since, params.until, stats) if args.get("days") else None
    started = time.perf_counter()
    disk = [0]
    with LogWindow(config.memory_mb) as window:
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(DISK_SAMPLE_S):
                disk[0] = max(disk[0], window.disk_bytes())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            if days is None:
                window.add(read_log_tables(logs, params.since, params.until, stats))
            wordings, counts = window.wordings(
                config,
                params.now,
                carry((), config, params.now).tables,
                params.language,
                verdicts=caches.verdicts,
                workers=config.workers(),
                days=days,
                parts=caches.days,
            )
            count = len(wordings)
            seconds = time.perf_counter() - started
            digest = _wordings_digest(wordings) if args.get("digest") else None
        finally:
            stop.set()
            sampler.join()
    caches.close()
    return {
        "wordings_sha256": digest,
        "caches": caches.as_dict(),
        "stage_s": round(seconds, 2),
        "us_per_row": round(seconds / max(stats.rows, 1) * 1e6, 2),
        "peak_rss_mb": _peak_rss_mb(),
        "memory_mb": config.memory_mb,
        "disk_peak_mb": round(disk[0] / 2**20, 1),
        "rows": stats.rows,
        "wordings": count,
        "distinct_texts": counts.distinct_texts,
        "rule_workers": counts.rule_workers,
        "excluded_rows": counts.excluded_rows,
        "seconds": {k: round(v, 2) for k, v in counts.seconds.items()},
    }


def _wordings_digest(wordings: Any) -> str:
    """sha256 of every value of the reduced window, column by column in row order; a list of
    kept askers as a set, and a float to 12 significant digits: the window reduced from its rows
    twice differs in both (DuckDB's ``list`` keeps no order; a sum in another order rounds
    otherwise in its last bits)."""
    from precompute.reduction import COLUMNS

    def canonical(value: Any) -> Any:
        if isinstance(value, float):
            return f"{value:.12g}"
        if isinstance(value, list):
            return sorted(json.dumps(item, sort_keys=True, default=str) for item in value)
        return value

    digest = hashlib.sha256()
    for name in COLUMNS:
        for chunk in wordings.column(name).chunks:  # (the chunks' bounds are not the values')
            for value in chunk.to_pylist():
                digest.update(json.dumps(canonical(value), default=str).encode() + b"\n")
    return digest.hexdigest()


def window_by_days(per_day: int, memory_mb: int, work: Path, seed: int) -> dict[str, Any]:
    """``--days``: 8 days of ``per_day`` rows. Night 1 reduces days 1-7 (its verdicts and
    its days kept in a store); the store is copied; then night 2 (days 2-8) twice: with the
    days kept (each day reduced once: one new day read, six taken) and, in the copy, from the
    window's rows as one (as before each day was kept; the verdicts' cache used by both).
    Seconds (aggregate, rules), peak RSS, the store's days' bytes, and whether both reduced
    the same wordings (every column)."""
    logs = logs_for(work, per_day * (DAYS + 1), seed, DAYS + 1)
    base = {"logs": str(logs), "memory_mb": memory_mb, "digest": True}
    out: dict[str, Any] = {"rows_per_day": per_day}
    with (
        tempfile.TemporaryDirectory(dir=work) as same,
        tempfile.TemporaryDirectory(dir=work) as copy,
    ):
        first = (UNTIL - timedelta(days=1)).isoformat()
        out["night_1"] = run_child("aggregate", {**base, "out": same, "until": first, "days": True})
        shutil.copytree(same, copy, dirs_exist_ok=True)
        out["night_2_days"] = run_child("aggregate", {**base, "out": same, "days": True})
        out["night_2_rows"] = run_child("aggregate", {**base, "out": copy})
        kept = Path(same) / "benchmark" / "work" / "cache" / "days"
        out["days_kept_mb"] = round(
            sum(p.stat().st_size for p in kept.rglob("*") if p.is_file()) / 2**20, 1
        )
    days, rows = out["night_2_days"], out["night_2_rows"]
    if "error" not in days and "error" not in rows:
        out["same_wordings"] = days["wordings_sha256"] == rows["wordings_sha256"]
        out["days_over_rows"] = round(days["stage_s"] / rows["stage_s"], 3)
    return out


def aggregate_sizes(
    sizes: list[int], memory_mb: int, work: Path, seed: int, done: Any
) -> dict[str, Any]:
    """``--aggregate``: the log window alone at each size (``child_aggregate``), and the seconds
    per row and peak RSS of the last size over the first's."""
    results: dict[str, Any] = {}
    for rows in sizes:
        logs = logs_for(work, rows, seed)
        results[str(rows)] = run_child("aggregate", {"logs": str(logs), "memory_mb": memory_mb})
        done("aggregate", results)
    first, last = results[str(sizes[0])], results[str(sizes[-1])]
    if len(sizes) >= 2 and "error" not in first and "error" not in last:
        results["us_per_row_ratio"] = round(last["us_per_row"] / first["us_per_row"], 3)
        results["peak_rss_delta_mb"] = round(last["peak_rss_mb"] - first["peak_rss_mb"], 1)
    return results


def child_rules(args: dict[str, Any]) -> dict[str, Any]:
    """The text rules alone on the first ``texts`` distinct texts of the logs, on 1 and on 2
    processes (``textrules.judge_all``): texts/s each, the verdicts compared."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from precompute.textrules import judge_all, unjudged

    wanted, texts, seen = int(args["texts"]), [], set()
    for path in sorted(Path(args["logs"]).rglob("*.parquet")):
        for query in pc.unique(pq.read_table(path, columns=["query"]).column("query")).to_pylist():
            if query not in seen:
                seen.add(query)
                texts.append(query)
        if len(texts) >= wanted:
            break
    texts = texts[:wanted]
    result: dict[str, Any] = {"texts": len(texts)}
    verdicts = {}
    for workers in (1, 2):
        began = time.perf_counter()
        verdicts[workers] = [
            v for chunk in judge_all(unjudged(texts), "en", workers) for v in chunk
        ]
        result[f"texts_per_s_{workers}"] = round(len(texts) / (time.perf_counter() - began), 1)
    result["speedup"] = round(result["texts_per_s_2"] / result["texts_per_s_1"], 3)
    result["same_verdicts"] = verdicts[1] == verdicts[2]
    return result


def child_kstep(args: dict[str, Any]) -> dict[str, Any]:
    """Mining's k step (rules 6-8, ``precompute/kstep.py``) on the candidate clusters of the
    logs' window: the window mined once (no embedding: each wording its own cluster), the chunks
    of candidate clusters it judged kept, then judged again ``repeat`` times over on 1 and on 2
    processes: candidate clusters a second each, the speedup, the judgements compared."""
    import dataclasses

    import precompute.kstep
    import precompute.mining
    from base.logreader import read_log_tables
    from base.store import open_store
    from precompute.mining import mine

    params = _params(Path(args["logs"]), Path(args["out"]))
    config = dataclasses.replace(params.config.mining, rule_workers=1)
    chunks: list[Any] = []

    def kept(found: Any, config: Any, now: Any, workers: int = 1) -> Any:
        chunks.extend(found)
        return precompute.kstep.judge_all(chunks, config, now, workers)

    precompute.mining.judge_all = kept  # type: ignore[assignment]
    tables = read_log_tables(open_store(params.logs_uri), params.since, params.until)
    hot, report = mine(tables, None, config, params.now)
    work = chunks * int(args.get("repeat", 20))
    clusters = sum(len(sizes) for _, sizes in work)
    result: dict[str, Any] = {
        "mined_k_step_s": round(report.seconds["k_and_text_rules"], 2),
        "candidate_clusters": sum(len(sizes) for _, sizes in chunks),
        "qualifying": report.qualifying_clusters,
        "published": len(hot),
        "judged": clusters,
    }
    judged = {}
    for workers in (1, 2):
        began = time.perf_counter()
        judged[workers] = [
            (j.status, j.users, j.score, [p.key for p in j.published], j.candidates)
            for j in precompute.kstep.judge_all(work, config, params.now, workers)
        ]
        seconds = time.perf_counter() - began
        result[f"seconds_{workers}"] = round(seconds, 2)
        result[f"clusters_per_s_{workers}"] = round(clusters / seconds, 1)
    result["speedup"] = round(result["seconds_1"] / result["seconds_2"], 3)
    result["same_judgements"] = judged[1] == judged[2]
    # what the mining process itself pays a cluster on processes (the judgements' transfer back:
    # on any number of them, the k step judges no faster than this process takes them in)
    import pickle

    sent = [pickle.dumps(precompute.kstep.judge_chunk(b, s, config, params.now)) for b, s in chunks]
    began = time.perf_counter()
    for blob in sent:
        pickle.loads(blob)
    taken = time.perf_counter() - began
    result["taken_back_clusters_per_s"] = round(result["candidate_clusters"] / taken, 1)
    result["taken_back_bytes_per_cluster"] = sum(map(len, sent)) // result["candidate_clusters"]
    return result


def child_lookup(args: dict[str, Any]) -> dict[str, Any]:
    """The vector cache's look-up (``vectorcache._lookup``) of ``n`` wordings in a cache holding
    nine in ten of them (a steady night), in parts of ``PART_ROWS``, against the per-part
    ``index_in`` of every night's key it replaced: seconds and µs a wording each, what each
    found. Vectors of ``dim`` dimensions: what grows with the night is the keys' matching."""
    import hashlib
    import io
    import random

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from base.store import FileStore
    from precompute.nightcache import PART_ROWS, NightCache
    from precompute.vectorcache import _lookup, _valid, _vector_part

    n, dim = int(args["n"]), int(args["dim"])
    folder = Path(args["out"])
    shutil.rmtree(folder, ignore_errors=True)
    store = FileStore(folder / "store")
    keys = [hashlib.sha256(f"wording {i}".encode()).hexdigest() for i in range(n)]
    cached = random.Random(n).sample(keys, n * 9 // 10)
    unit = np.full(dim, 1 / np.sqrt(dim), dtype=np.float32)
    night = UNTIL
    for start in range(0, len(cached), PART_ROWS):
        part = cached[start : start + PART_ROWS]
        values = pa.array(np.tile(unit, len(part)), pa.float32())
        table = pa.table({"key": part, "vector": pa.FixedSizeListArray.from_arrays(values, dim)})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        store.put(
            f"p/work/cache/vectors/f/{night}/{start // PART_ROWS:05d}-b.parquet", buffer.getvalue()
        )
    since = night - timedelta(days=DAYS - 1)
    night_keys = pa.array(keys, pa.string())
    began = time.perf_counter()
    found, _ = _lookup(
        NightCache(store, "p", "vectors", "f", since, night), night_keys, folder / "v"
    )
    new_s = time.perf_counter() - began
    began = time.perf_counter()
    before = 0  # the look-up it replaced: every night's key probed in each part
    old = NightCache(store, "p", "vectors", "f", since, night)
    for _, table in old.tables(["key", "vector"], _vector_part):
        valid = _valid(table, dim, old)
        assert valid is not None
        before += int(pc.index_in(night_keys, value_set=valid[0]).is_valid().sum().as_py())
    old_s = time.perf_counter() - began
    return {
        "wordings": n,
        "parts": -(-len(cached) // PART_ROWS),
        "lookup_s": round(new_s, 2),
        "lookup_us_per_wording": round(new_s / n * 1e6, 2),
        "index_in_s": round(old_s, 2),
        "index_in_us_per_wording": round(old_s / n * 1e6, 2),
        "found": int((found > 0).sum()),
        "found_by_index_in": before,
        "peak_rss_mb": _peak_rss_mb(),
    }


def child_carried(args: dict[str, Any]) -> dict[str, Any]:
    """Rule 5 on ``n`` wordings (384-d, ~4 wordings a question: each a question's vector moved
    to cosine 0.97 of it), then a night later on a window that lost the first 13 % and gained as
    many new ones (half of them new wordings of old questions, half of new questions), carrying
    night 1's clusters (``precompute/incremental.py``) and, in a store of its own, from scratch:
    the seconds of each and their steps, what the carried night did, and the clusters each
    found."""
    import numpy as np
    import pyarrow as pa

    from base.store import FileStore
    from precompute.clustering import ClusterStats, Texts, embed, embedding_order, greedy_clusters
    from precompute.clusterstate import ClusterState
    from precompute.config import MiningConfig
    from precompute.incremental import night_clusters
    from semantic.guard import numbers

    n, dim, share = int(args["n"]), 384, 0.13
    folder = Path(args["out"])
    shutil.rmtree(folder, ignore_errors=True)
    moved, questions, new = 0.25, n // 4, int(n * share)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((questions + new, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    of = np.arange(n + new) % questions
    of[n + 1 :: 2] = questions + np.arange(n + 1, n + new, 2) - n  # new questions
    noise = rng.standard_normal((n + new, dim), dtype=np.float32)
    noise *= moved / np.linalg.norm(noise, axis=1, keepdims=True)
    vectors = centres[of] + noise
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    del noise, centres
    config = MiningConfig(cluster_threshold=0.9)
    # a wording's text: its number in letters (digits would be numbers that must match)
    names = ["".join(chr(97 + int(d)) for d in str(i)) for i in range(n + new)]
    row_of = {name: i for i, name in enumerate(names)}

    def encode(texts: Any, progress: bool = False) -> Any:
        for start in range(0, len(texts), 16_384):
            yield vectors[[row_of[t] for t in texts[start : start + 16_384]]]

    def night(store: Any, first: int, last: int, day: date) -> dict[str, Any]:
        texts = names[first:last]
        keys = pa.array([hashlib.sha256(t.encode()).hexdigest() for t in texts])
        state = ClusterState(store, "p", "f", day - timedelta(days=DAYS - 1), day)
        stats = ClusterStats(wordings=len(texts))

        def from_scratch(heads: Any) -> Any:
            order = embedding_order(len(texts), config.exact_cluster_rows)
            return greedy_clusters(
                embed(Texts(texts), encode, order),
                config.cluster_threshold,
                lambda row: numbers(texts[row]),
                stats=stats,
                order=order,
                heads=heads,
            )

        began = time.perf_counter()
        clusters = night_clusters(
            state, keys, Texts(texts), lambda: encode, config, stats, False, from_scratch
        )
        took = time.perf_counter() - began
        return {
            "wordings": len(texts),
            "clusters": len(clusters),
            "s": round(took, 2),
            "us_per_wording": round(took / len(texts) * 1e6, 2),
            "cluster_s": round(stats.cluster_s, 2),
            "state": state.counts.as_dict(),
            "peak_rss_mb": _peak_rss_mb(),
        }

    carried_store = FileStore(folder / "carried")
    first = night(carried_store, 0, n, UNTIL - timedelta(days=1))
    second = night(carried_store, new, n + new, UNTIL)
    scratch = night(FileStore(folder / "scratch"), new, n + new, UNTIL)
    return {
        "night_1": first,
        "carried": second,
        "from_scratch": scratch,
        "carried_over_scratch": round(second["s"] / scratch["s"], 3),
    }


def _release_night(work: Path, n: int) -> Any:
    """The run parameters of a night whose logs hold ``n`` distinct questions, each asked by 5
    to 7 people, every one answered by an operator's answers file (no LLM time); logs and
    answers written under ``work`` once."""
    logs, out = work / "logs", work / "out"
    answers = work / "answers.jsonl"
    if not (work / ".complete").exists():
        work.mkdir(parents=True, exist_ok=True)
        questions = _release_questions(n)
        with answers.open("w", encoding="utf-8") as f:
            for i, q in enumerate(questions):
                # short: 500,000 of them stay under the answers file's 64 MB (curated.MAX_BYTES)
                text = f"Answer {i}: follow the steps."
                f.write(json.dumps({"question": q, "answer": text}, separators=(",", ":")) + "\n")
        _write_release_logs(logs, questions)
        (work / ".complete").touch()
    params = _params(logs, out)
    return params.__class__(
        **{
            **params.__dict__,
            "config": params.config.replace(
                generation={"curated_answers": str(answers), "partition_size": 4096},
                # pinned, as every answers file is (precompute/curated.py)
                run={
                    "settings": params.config.settings.replace(
                        curated_answers_sha256=hashlib.sha256(answers.read_bytes()).hexdigest()
                    )
                },
            ),
        }
    )


def child_release(args: dict[str, Any]) -> dict[str, Any]:
    """N questions mined, answered from an answers file, built, validated, published (to
    file://)."""
    from precompute.pipeline import (
        build_stage,
        generate_stage,
        mine_stage,
        publish_stage,
        validate_stage,
    )

    params = _release_night(Path(args["work"]), int(args["n"]))
    timings: dict[str, float] = {}

    def timed(name: str, call: Any) -> Any:
        began = time.perf_counter()
        result = call()
        timings[name] = round(time.perf_counter() - began, 2)
        return result

    mined = timed("mine", lambda: mine_stage(params))
    timed("generate", lambda: generate_stage(params, mined))
    built = timed("build", lambda: build_stage(params, mined))
    validated = timed("validate", lambda: validate_stage(params, mined))
    published = timed("publish_file", lambda: publish_stage(params, mined))
    return {
        "questions_asked": int(args["n"]),
        "clusters": built.clusters,
        "rows": built.rows,
        "curated": mined.curated,
        "timings_s": timings,
        "build_validate_publish_file_s": round(
            timings["build"] + timings["validate"] + timings["publish_file"], 2
        ),
        "validate": validated.status,
        "published": published.status,
        # the build's steps (rows, embed, calibrate, write: wall and CPU seconds) and where its
        # rows were embedded; the stage's seconds less these and the upload: the embedder's load
        "build_release_s": built.seconds,
        "build_steps": built.steps,
        "build_embedded_on": built.embedded_on,
        "upload": built.upload,
        "peak_rss_mb": _peak_rss_mb(),
    }


RELEASE_STAGES = ("mine", "generate", "build", "validate", "publish")


def child_stage(args: dict[str, Any]) -> dict[str, Any]:
    """One stage of ``_release_night`` in this process, as a Ray Job runs it (mine's result read
    from the work area by the others): its seconds and its own peak RSS; mine's FAISS lists
    in bytes per wording, and its peak without them."""
    import precompute.pipeline as pipeline
    from precompute.results import Mined

    work = Path(args["work"])
    params = _release_night(work, int(args["n"]))
    if args.get("memory_mb"):
        config = params.config.replace(mining={"memory_mb": int(args["memory_mb"])})
        params = dataclasses.replace(params, config=config)
    stage = args["stage"]
    began = time.perf_counter()
    done: Any  # the stage's result (``precompute/results.py``)
    if stage == "mine":
        done = pipeline.mine_stage(params)
        (work / "mined.json").write_text(json.dumps(done.as_json()))
    else:
        mined = Mined.of(json.loads((work / "mined.json").read_text()))
        done = getattr(pipeline, f"{stage}_stage")(params, mined)
    result: dict[str, Any] = {
        "stage_s": round(time.perf_counter() - began, 2),
        "peak_rss_mb": _peak_rss_mb(),
    }
    if stage == "mine":
        clustering = done.mining["clustering"]
        result["wordings"] = clustering["wordings"]
        result["index"] = clustering["index"]
        result["index_bytes_per_wording"] = clustering["index_bytes_per_wording"]
        lists_mb = clustering["index_bytes"] / 2**20
        result["peak_rss_without_lists_mb"] = round(result["peak_rss_mb"] - lists_mb, 1)
        result["ray_shared_mb"] = _shared_rss_mb()  # the object store's pages, in it to the end
    if stage == "build":
        result["rows"] = done.rows
        # the writer holds one shard's index at a time: the largest, apart (as mine's lists)
        from base.release import read_manifest

        work = _work_area(params, mined)
        built = work.get_json("built.json")
        manifest = read_manifest(work.store, work.profile, built["version"])[0].as_dict()
        index_mb = max(s["index"]["bytes"] for s in manifest["shards"]) / 2**20
        result["largest_index_mb"] = round(index_mb, 1)
        result["peak_rss_without_index_mb"] = round(result["peak_rss_mb"] - index_mb, 1)
    return result


def stage_sizes(
    sizes: list[int],
    work: Path,
    done: Any,
    memory_mb: int = 512,
    stages: tuple[str, ...] = RELEASE_STAGES,
) -> dict[str, Any]:
    """Each stage of the release night in its own process at each size (log rows; a question
    is asked ~6 times), DuckDB given ``memory_mb``, peak RSS per stage, and each stage's growth
    from the first size to the last; ``done`` is handed what is measured after each stage. A
    run of ``stages`` without mine reads what the last run mined."""
    results: dict[str, Any] = {"mining_memory_mb": memory_mb}
    for rows in sizes:
        folder = work / f"stages-{rows}"
        if "mine" in stages:
            shutil.rmtree(folder / "out", ignore_errors=True)
        run_child("night", {"work": str(folder), "n": rows // 6})  # the logs, written once
        per: dict[str, Any] = {}
        results[str(rows)] = per
        for stage in stages:
            per[stage] = run_child(
                "stage",
                {"work": str(folder), "n": rows // 6, "stage": stage, "memory_mb": memory_mb},
            )
            done("stages", results)
            if "error" in per[stage]:
                break
    first, last = results[str(sizes[0])], results[str(sizes[-1])]
    apart = {"mine": "peak_rss_without_lists_mb", "build": "peak_rss_without_index_mb"}
    key = {s: apart.get(s, "peak_rss_mb") for s in first}
    results["growth_mb"] = {
        stage: round(last[stage][key[stage]] - first[stage][key[stage]], 1)
        for stage in RELEASE_STAGES
        if key.get(stage) in first.get(stage, {}) and key[stage] in last.get(stage, {})
    }
    return results


def _release_questions(n: int) -> list[str]:
    """``n`` distinct questions no two of which are one question: real ones, each with its own
    reference number (numbers never merge: mining's rule 5)."""
    from precompute.textrules import text_problem

    base = [
        q.rstrip("?") for q in real_questions(DATA_DIR, 5000) if not any(c.isdigit() for c in q)
    ]
    questions: list[str] = []
    number = 1000
    while len(questions) < n:
        question = f"{base[number % len(base)]} for order {number}?"
        number += 1
        if text_problem(question) is None:
            questions.append(question)
    return questions


def _write_release_logs(root: Path, questions: list[str]) -> None:
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from base.logs import partition_path, schema

    rng = random.Random(0)
    rows: dict[str, list[Any]] = {name: [] for name in schema().names}
    start = datetime(UNTIL.year, UNTIL.month, UNTIL.day, tzinfo=UTC) - timedelta(days=DAYS - 1)
    person = 0
    for q in questions:
        for _ in range(rng.randint(5, 7)):
            person += 1
            values = {
                "ts": start + timedelta(seconds=rng.uniform(0, DAYS * 86400 - 1)),
                "request_id": f"r{person}",
                "user": f"{person:032x}",
                "network": f"n{person:031x}",
                "signed": True,
                "query": q,
                "turns": 1,
                "tier": "generated",
                "status": 200,
            }
            for name in rows:
                rows[name].append(values.get(name))
    table = pa.table(rows, schema=schema()).sort_by("ts")
    day_of = [ts.date() for ts in table.column("ts").to_pylist()]
    for day in sorted(set(day_of)):
        folder = root / partition_path(day)
        folder.mkdir(parents=True, exist_ok=True)
        mask = pa.array([d == day for d in day_of])
        pq.write_table(table.filter(mask), folder / "release.parquet", compression="zstd")


def _edge_release_rows(m: int, now: datetime) -> Any:
    """``m`` rows and random unit vectors made a part at a time, the same on every pass: what a
    store's parts would hand the writer, never all held."""
    import numpy as np

    from base.keys import key, normalize
    from precompute.shards import PART_ROWS, ReleaseRows

    def parts() -> Any:
        for start in range(0, m, PART_ROWS):
            rows = []
            for i in range(start, min(start + PART_ROWS, m)):
                question = f"How do I do thing number {i}?"
                rows.append(
                    {
                        "id": i,
                        "key": key(question),
                        "question": question,
                        "normalized": normalize(question),
                        "answer": f"Answer {i}: open the app and follow the steps.",
                        "users": 5,
                        "hits": 5,
                        "generated_at": now,
                        "expires_at": now + timedelta(days=3650),
                        "cluster": key(question),
                        "canonical": True,
                        "object_sha256": "",
                        "checks": "",
                    }
                )
            rng = np.random.default_rng(start)
            vectors = rng.standard_normal((len(rows), 384), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            yield rows, vectors

    return ReleaseRows(m, 384, parts)


def child_write_edge_release(args: dict[str, Any]) -> dict[str, Any]:
    """A release of M entries, vectors drawn at random, written a part at a time into a store
    folder: the writer's peak RSS (before publishing) and the whole child's."""
    from base.manifest import EmbedderEntry, ProfileEntry, Threshold
    from base.store import FileStore
    from precompute.build import BuildConfig, release_version, write_release
    from precompute.publish import publish

    m = int(args["rows"])
    store_dir = Path(args["store"])
    now = datetime(UNTIL.year, UNTIL.month, UNTIL.day, tzinfo=UTC)
    source = _edge_release_rows(m, now)
    baseline = _peak_rss_mb()
    began = time.perf_counter()
    content = source.content_sha256()
    version = release_version(now, content)
    with tempfile.TemporaryDirectory(dir=store_dir.parent) as tmp:
        write_release(
            Path(tmp),
            source,
            version,
            ProfileEntry(name="scale-edge", inputs={}),
            EmbedderEntry(name="embedded", dim=384),
            Threshold(value=0.9, margin=0.05, semantic=False, calibrated=False),
            BuildConfig(),
            {
                "counts": {"clusters": m, "rows": m},
                "content_sha256": content,
                "created_at": now.isoformat(),
            },
        )
        written = time.perf_counter() - began
        writer_peak = _peak_rss_mb()
        began = time.perf_counter()
        report = publish(FileStore(store_dir), Path(tmp), keep=2)
    return {
        "rows": m,
        "write_s": round(written, 2),
        "writer_peak_rss_mb": writer_peak,
        "rss_before_write_mb": baseline,
        "publish_file_s": round(time.perf_counter() - began, 2),
        "files": report.files,
        "bytes": report.bytes,
        "peak_rss_mb": _peak_rss_mb(),
    }


def child_load_edge_release(args: dict[str, Any]) -> dict[str, Any]:
    from base.store import FileStore
    from edge_index.profiles import load_index
    from semantic.loading import load_embedder

    embedder = load_embedder("embedded")
    baseline = _peak_rss_mb()
    began = time.perf_counter()
    index = load_index(FileStore(Path(args["store"])), "scale-edge", embedder)
    seconds = time.perf_counter() - began
    hit = index.lookup_exact(index.keys[12345 % len(index)]) if len(index) else None
    return {
        "rows": len(index),
        "load_s": round(seconds, 2),
        "peak_rss_mb": _peak_rss_mb(),
        "rss_before_load_mb": baseline,
        "exact_lookup_ok": bool(hit is not None and getattr(hit, "tier", "") == "exact"),
    }


def child_hot_read(args: dict[str, Any]) -> dict[str, Any]:
    """``--hot-read``: N mined questions read back from local disk with and without their
    askers: µs a question (wall and this process's CPU) each."""
    import random

    from precompute.questions import HotQuestion, Phrasing
    from precompute.spill import HotSpill

    n, rng = int(args["n"]), random.Random(0)
    now = datetime(2026, 11, 28, tzinfo=UTC)

    def seen(prefix: str, count: int) -> dict[str, datetime]:
        return {
            f"{prefix}{rng.getrandbits(128):032x}": now - timedelta(seconds=rng.randrange(604800))
            for _ in range(count)
        }

    def wording(i: int, j: int) -> Phrasing:
        users, networks = seen("", 6), seen("n", 4)
        return Phrasing(
            f"{rng.getrandbits(256):064x}", f"how do i do thing {i} {j}",
            f"How do I do thing {i} {j}?", set(users), 9, users, set(networks), networks,
            latest_by_signer=dict(list(users.items())[:2]), latest_by_asn=seen("as", 3),
        )  # fmt: skip

    out: dict[str, Any] = {"questions": n, "wordings_each": 5}
    with tempfile.TemporaryDirectory() as tmp:
        hot = HotSpill(Path(tmp) / "hot")
        for i in range(n):
            wordings = [wording(i, j) for j in range(5)]
            hot.add(HotQuestion(wordings[0], wordings, 6, 9, rng.random()))
        counts = {}
        for name, askers in (("with_askers", True), ("without_askers", False)):
            wall, cpu = time.perf_counter(), time.process_time()
            read = [
                (h.key, [(p.user_count, p.askers) for p in h.phrasings])
                for _, h in hot.ranked(askers=askers)
            ]
            out[name] = {
                "us_a_question": round(1e6 * (time.perf_counter() - wall) / n, 1),
                "cpu_us_a_question": round(1e6 * (time.process_time() - cpu) / n, 1),
            }
            counts[name] = read
        # hot/ written (with reused/'s hand-off of each part's questions): from the questions
        # as Python objects (put_hot, how mine wrote it before), and from Arrow tables
        from base.store import FileStore
        from precompute.workarea import WorkArea

        handed = {}
        for name in ("objects", "tables"):
            work = WorkArea(FileStore(Path(tmp) / name), "p", "r")
            wall, cpu = time.perf_counter(), time.process_time()
            keys: list[str] = []

            def each(i: int, part: list[Any], keys: list[str] = keys) -> None:
                keys.extend(h.key for h in part)

            if name == "objects":
                work.put_hot(hot, each)
            else:
                work.put_hot_tables(hot.tables(), each)
            out[f"write_hot_from_{name}"] = {
                "us_a_question": round(1e6 * (time.perf_counter() - wall) / n, 1),
                "cpu_us_a_question": round(1e6 * (time.process_time() - cpu) / n, 1),
            }
            handed[name] = keys
    out["speedup"] = round(
        out["with_askers"]["us_a_question"] / out["without_askers"]["us_a_question"], 2
    )
    out["same_counts"] = counts["with_askers"] == counts["without_askers"]
    out["same_hot"] = handed["objects"] == handed["tables"]
    return out


CHILDREN = {
    "hot_read": child_hot_read,
    "mine": child_mine,
    "aggregate": child_aggregate,
    "rules": child_rules,
    "kstep": child_kstep,
    "lookup": child_lookup,
    "carried": child_carried,
    "release": child_release,
    "stage": child_stage,
    "night": lambda args: {"logs": _release_night(Path(args["work"]), int(args["n"])).logs_uri},
    "write_edge_release": child_write_edge_release,
    "load_edge_release": child_load_edge_release,
}


def run_child(task: str, args: dict[str, Any]) -> dict[str, Any]:
    """``task`` in a fresh process: its own peak RSS, nothing shared with the last one. A
    failed task is reported (``error``: its last lines), and the run goes on."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", task, "--child-args", json.dumps(args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-3:], "task": task}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = round(time.perf_counter() - began, 2)
    return result


def logs_for(work: Path, rows: int, seed: int, days: int = DAYS) -> Path:
    """Synthetic logs of ``rows`` rows over ``days`` days ending ``UNTIL``, written once."""
    folder = work / (f"logs-{rows}-seed{seed}-g{GENERATOR}" + ("" if days == DAYS else f"-{days}d"))
    done = folder / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        write_synthetic_logs(folder, rows, real_questions(DATA_DIR), UNTIL, days, seed)
        done.touch()
    return folder


def _overlap(a: set[Any], b: set[Any]) -> float:
    return round(len(a & b) / max(len(a | b), 1), 4)


def two_nights(per_day: int, work: Path, seed: int) -> dict[str, Any]:
    """``--nights 2``: 8 days of ``per_day`` rows a day; night 1 mines days 1-7, night 2 days 2-8
    in the same store (what night 1 judged and embedded is cached: ``precompute/nightcache.py``),
    then days 2-8 from scratch in a new store: seconds and peak RSS of each, and how much of
    night 2's qualifying clusters (their wordings) and published questions (key and wordings)
    the run from scratch has too (shared / either)."""
    logs = logs_for(work, per_day * (DAYS + 1), seed, DAYS + 1)
    first = UNTIL - timedelta(days=1)
    runs: dict[str, Any] = {}
    found: dict[str, dict[str, set[Any]]] = {}
    with (
        tempfile.TemporaryDirectory(dir=work) as same,
        tempfile.TemporaryDirectory(dir=work) as new,
    ):
        for name, out, until in (
            ("night_1", same, first),
            ("night_2", same, UNTIL),
            ("from_scratch", new, UNTIL),
        ):
            args = {"logs": str(logs), "out": out, "exact": False, "calibrate": False}
            result = run_child("mine", {**args, "until": until.isoformat()})
            if "error" in result:
                return {name: result}
            mining = result["mining"]
            runs[name] = {
                "window": f"{until - timedelta(days=DAYS - 1)}..{until}",
                "rows": result["logs"]["rows"],
                "distinct_wordings": mining["phrasings"],
                "stage_s": result["stage_s"],
                "seconds": mining["seconds"],
                "peak_rss_mb": result["peak_rss_mb"],
                "qualifying_clusters": mining["qualifying_clusters"],
                "published_clusters": mining["published_clusters"],
                "caches": mining.get("caches"),
                "rule_workers": mining.get("rule_workers"),
            }
            folder = Path(out)
            found[name] = {
                "qualifying": {
                    tuple(c) for c in json.loads((folder / "qualifying.json").read_text())
                },
                "published": {
                    (k, tuple(w)) for k, w in json.loads((folder / "published.json").read_text())
                },
            }
    night_1, night_2 = runs["night_1"]["stage_s"], runs["night_2"]["stage_s"]
    return {
        "rows_per_day": per_day,
        **runs,
        "night_2_over_night_1": round(night_2 / night_1, 3) if night_1 else None,
        "night_2_over_from_scratch": round(night_2 / runs["from_scratch"]["stage_s"], 3),
        "qualifying_overlap": _overlap(
            found["night_2"]["qualifying"], found["from_scratch"]["qualifying"]
        ),
        "published_overlap": _overlap(
            found["night_2"]["published"], found["from_scratch"]["published"]
        ),
    }


def mine_sizes(sizes: list[int], work: Path, seed: int, exact_at: int | None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for rows in sizes:
        logs = logs_for(work, rows, seed)
        with tempfile.TemporaryDirectory(dir=work) as out:
            result = run_child(
                "mine", {"logs": str(logs), "out": out, "exact": False, "calibrate": True}
            )
            if "error" in result:
                results[str(rows)] = result
                continue
            approx = {tuple(c) for c in json.loads((Path(out) / "qualifying.json").read_text())}
        mining = result["mining"]
        seconds = mining["seconds"]
        summary = {
            "rows": result["logs"]["rows"],
            "distinct_wordings": mining["phrasings"],
            "distinct_texts": mining["distinct_texts"],
            "stage_s": result["stage_s"],
            "seconds": seconds,
            "all_but_embedding_s": round(result["stage_s"] - seconds.get("embed", 0.0), 2),
            "rows_per_s": round(result["logs"]["rows"] / result["stage_s"], 1),
            "s_per_row_us": round(result["stage_s"] / result["logs"]["rows"] * 1e6, 1),
            "embed_wordings_per_s": mining["clustering"]["embed_wordings_per_s"],
            "peak_rss_mb": result["peak_rss_mb"],
            "qualifying_clusters": mining["qualifying_clusters"],
            "published_clusters": mining["published_clusters"],
            "clustering": mining["clustering"],
            "excluded_rows": result["excluded_rows"],
            "calibration": result.get("calibration"),
        }
        if exact_at == rows:
            with tempfile.TemporaryDirectory(dir=work) as out:
                exact = run_child(
                    "mine", {"logs": str(logs), "out": out, "exact": True, "calibrate": False}
                )
                truth = {tuple(c) for c in json.loads((Path(out) / "qualifying.json").read_text())}
            summary["exact"] = {
                "stage_s": exact["stage_s"],
                "cluster_s": exact["mining"]["seconds"]["cluster"],
                "qualifying_clusters": exact["mining"]["qualifying_clusters"],
                "found_again": round(len(truth & approx) / max(len(truth), 1), 4),
            }
        results[str(rows)] = summary
    return results


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100000,1000000", help="log rows to mine, in order")
    parser.add_argument("--full", action="store_true", help="also 10,000,000 rows (aggregate)")
    parser.add_argument(
        "--aggregate",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        help="log rows to aggregate and judge only, in order (e.g. 10000000,30000000)",
    )
    parser.add_argument(
        "--aggregate-memory-mb",
        type=int,
        default=2048,
        help="DuckDB's memory for --aggregate and --full (EDGEQA_MINING_MEMORY_MB)",
    )
    parser.add_argument("--release", type=int, default=100_000, help="clusters of the release")
    parser.add_argument("--edge-rows", type=int, default=1_000_000, help="entries the edge loads")
    parser.add_argument(
        "--skip",
        default="",
        help="parts to skip: mine,release,edge_load",
    )
    parser.add_argument(
        "--nights",
        type=int,
        choices=(0, 2),
        default=0,
        help="2: night 1, night 2 a day later in the same store, night 2 from scratch",
    )
    parser.add_argument("--rows-per-day", type=int, default=150_000, help="--nights' logs")
    parser.add_argument(
        "--days",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        help="rows a day (e.g. 200000,600000): night 2's window reduced from its days, kept by "
        "night 1, and from its rows (DuckDB given --aggregate-memory-mb)",
    )
    parser.add_argument(
        "--rules", type=int, default=0, help="N: the text rules on N texts, 1 and 2 processes"
    )
    parser.add_argument(
        "--lookup",
        default="",
        help="wordings (e.g. 100000,400000,1600000): the vector cache's look-up at each size",
    )
    parser.add_argument(
        "--hot-read", type=int, default=0, help="mined questions read back with and without askers"
    )
    parser.add_argument(
        "--carried",
        default="",
        help="wordings (e.g. 100000,400000): a night carrying the last one's clusters, and "
        "the same night from scratch",
    )
    parser.add_argument(
        "--kstep",
        type=int,
        default=0,
        help="N: the k step on the candidate clusters of N log rows, 1 and 2 processes",
    )
    parser.add_argument(
        "--stages",
        default="",
        help="log rows (e.g. 300000,1000000,3000000): each stage of a night in its own process",
    )
    parser.add_argument(
        "--stage-memory-mb", type=int, default=512, help="--stages: DuckDB's memory in mine"
    )
    parser.add_argument(
        "--stage-names",
        default=",".join(RELEASE_STAGES),
        help="--stages: which stages to run (without mine: on what the last run mined)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "scale"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](json.loads(args.child_args))))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    out: dict[str, Any] = {
        "config": {
            "sizes": sizes,
            "full": args.full,
            "release": args.release,
            "edge_rows": args.edge_rows,
            "seed": args.seed,
            "cpus": os.cpu_count(),
            "days": DAYS,
            "nights": args.nights,
            "rows_per_day": args.rows_per_day if args.nights else None,
            "aggregate": args.aggregate,
            "aggregate_memory_mb": args.aggregate_memory_mb,
            "rows_per_day_window": args.days,
        }
    }
    partial = work / "partial.json"  # what is done so far, should a later part fail or hang

    def done(part: str, value: Any) -> None:
        out[part] = value
        partial.write_text(json.dumps(out))

    if args.nights:
        done("nights", two_nights(args.rows_per_day, work, args.seed))
    if args.stages:
        names = tuple(n for n in RELEASE_STAGES if n in args.stage_names.split(","))
        sizes_ = [int(s) for s in args.stages.split(",")]
        done("stages", stage_sizes(sizes_, work, done, args.stage_memory_mb, names))
    if args.rules:
        logs = logs_for(work, max(sizes or [100_000]), args.seed)
        done("rules", run_child("rules", {"logs": str(logs), "texts": args.rules}))
    if args.lookup:
        looked = {}
        for n in (int(x) for x in args.lookup.split(",")):
            looked[str(n)] = run_child("lookup", {"n": n, "dim": 16, "out": str(work / "lookup")})
            done("lookup", looked)
    if args.hot_read:
        done("hot_read", run_child("hot_read", {"n": args.hot_read}))
    if args.carried:
        carried = {}
        for n in (int(x) for x in args.carried.split(",")):
            carried[str(n)] = run_child("carried", {"n": n, "out": str(work / "carried")})
            done("carried", carried)
    if args.kstep:
        logs = logs_for(work, args.kstep, args.seed)
        kstep_out = work / f"kstep-{args.kstep}"
        done("kstep", run_child("kstep", {"logs": str(logs), "out": str(kstep_out)}))
    if "mine" not in skip:
        mined = mine_sizes(sizes, work, args.seed, sizes[0] if sizes else None)
        done("mine", mined)
        ends = [mined[str(size)] for size in (sizes[0], sizes[-1])] if len(sizes) >= 2 else []
        if ends and all("error" not in end for end in ends):
            done(
                "growth",
                {
                    "s_per_row_ratio": round(ends[1]["s_per_row_us"] / ends[0]["s_per_row_us"], 3),
                    "peak_rss_delta_mb": round(ends[1]["peak_rss_mb"] - ends[0]["peak_rss_mb"], 1),
                },
            )
        if args.full:
            logs = logs_for(work, 10_000_000, args.seed)
            mined["10000000"] = {
                "aggregate_only": run_child(
                    "aggregate", {"logs": str(logs), "memory_mb": args.aggregate_memory_mb}
                )
            }
            done("mine", mined)
    if args.days:
        done(
            "days",
            {
                str(n): window_by_days(n, args.aggregate_memory_mb, work, args.seed)
                for n in args.days
            },
        )
    if args.aggregate:
        done(
            "aggregate",
            aggregate_sizes(args.aggregate, args.aggregate_memory_mb, work, args.seed, done),
        )
    if "release" not in skip and args.release:
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            release = {"work": tmp, "n": args.release}
            done("release", run_child("release", release))
    if "edge_load" not in skip and args.edge_rows:
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            store = Path(tmp) / "store"
            store.mkdir()
            written = run_child("write_edge_release", {"rows": args.edge_rows, "store": str(store)})
            loaded = (
                run_child("load_edge_release", {"store": str(store)})
                if "error" not in written
                else {}
            )
            done("edge_load", {"write": written, "load": loaded})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
