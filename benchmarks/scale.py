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
   LLM time is spent); then build, validate and publish to ``file://`` and to S3 (moto's server
   on loopback; ``--skip s3`` leaves it out: moto takes ~60 objects/s), seconds each.
3. **Edge load** (``--edge-rows M``, default 1,000,000): a release of M entries (its vectors
   drawn at random, not embedded: what is measured is the load) written by the release writer,
   then loaded as the edge loads one (``edge_index.lookup.load_index``) in a child process:
   seconds and peak RSS.

Prints one JSON object: {"config", "mine": {"<rows>": {...}}, "exact_overlap", "release",
"edge_load"}.

Run: .venv/bin/python benchmarks/scale.py [--sizes 100000,1000000] [--full] [--release 100000]
     [--edge-rows 1000000] [--skip release,edge_load]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import DATA_DIR, ROOT
from benchmarks.synthetic_logs import real_questions, write_synthetic_logs

UNTIL = date(2026, 11, 28)
DAYS = 7
GENERATOR = 2  # bump when synthetic_logs.py changes: cached logs are written again (2: signed)


def _peak_rss_mb() -> float:
    """This process's own peak (``VmHWM``: ``ru_maxrss`` would report a large parent's)."""
    from precompute.fleet.jobs import peak_rss_mb

    return peak_rss_mb()


def _params(logs: Path, out: Path, **mining: Any) -> Any:
    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams

    config = PipelineConfig.from_env().replace(mining=mining)
    started = datetime(UNTIL.year, UNTIL.month, UNTIL.day, 23, 59, 59, tzinfo=UTC)
    since = UNTIL - timedelta(days=DAYS - 1)
    return RunParams(
        f"file://{logs}", f"file://{out}", since, UNTIL, config, "benchmark", started=started
    )


def _work_area(params: Any, mined: dict[str, Any]) -> Any:
    from base.store import open_store
    from precompute.workarea import WorkArea

    return WorkArea(open_store(params.out_uri), mined["profile"], mined["run"])


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
    from edge_index.embedder import load_embedder
    from precompute.build import build_release
    from precompute.pipeline import mine_stage, scaled

    out = Path(args["out"])
    mining = {"exact_cluster_rows": 10**12} if args["exact"] else {}
    params = _params(Path(args["logs"]), out, **mining)
    started = time.perf_counter()
    mined = mine_stage(params)
    seconds = time.perf_counter() - started
    work = _work_area(params, mined)
    clusters = [
        sorted([w["key"] for w in row["published"]] + [w["key"] for w in row["held_back"]])
        for row in work.get_json("clusters.json")
    ]
    (out / "qualifying.json").write_text(json.dumps(clusters))
    result: dict[str, Any] = {
        "stage_s": round(seconds, 2),
        "peak_rss_mb": _peak_rss_mb(),
        "logs": mined["logs"],
        "excluded_rows": mined["excluded_rows"],
        "mining": mined["mining"],
    }
    if args["calibrate"]:
        hot = list(work.hot())
        spec = params.config.settings.embedders[params.language]
        config = scaled(params.config, spec).build
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            manifest, report = build_release(
                Path(tmp) / "release",
                hot,
                _stand_in_answers(hot, params.now),
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
    """The log window alone: aggregation and text rules, no embedding."""
    from base.logreader import LogReadStats, read_log_tables
    from base.store import open_store
    from precompute.carry import carry
    from precompute.config import MiningConfig
    from precompute.logwindow import LogWindow

    params = _params(Path(args["logs"]), Path(args["logs"]))
    config: MiningConfig = params.config.mining
    stats = LogReadStats()
    started = time.perf_counter()
    with LogWindow(config.memory_mb) as window:
        window.add(read_log_tables(open_store(params.logs_uri), params.since, params.until, stats))
        table, counts = window.wordings(
            config, params.now, carry((), config, params.now).tables, params.language
        )
    return {
        "stage_s": round(time.perf_counter() - started, 2),
        "peak_rss_mb": _peak_rss_mb(),
        "rows": stats.rows,
        "wordings": len(table),
        "distinct_texts": counts.distinct_texts,
        "excluded_rows": counts.excluded_rows,
        "seconds": {k: round(v, 2) for k, v in counts.seconds.items()},
    }


def child_release(args: dict[str, Any]) -> dict[str, Any]:
    """N questions mined, answered from an answers file, built, validated, published (to
    file://, and to S3 on loopback unless ``s3`` is false)."""
    from precompute.pipeline import (
        build_stage,
        generate_stage,
        mine_stage,
        publish_stage,
        validate_stage,
    )

    work = Path(args["work"])
    n = int(args["n"])
    logs, out = work / "logs", work / "out"
    questions = _release_questions(n)
    answers = work / "answers.jsonl"
    with answers.open("w", encoding="utf-8") as f:
        for i, q in enumerate(questions):
            text = f"Reference answer {i}: open the app, choose the topic, follow the steps."
            f.write(json.dumps({"question": q, "answer": text}) + "\n")
    _write_release_logs(logs, questions)
    params = _params(logs, out)
    params = params.__class__(
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
    s3_report = _publish_to_s3(params, mined, timed) if args.get("s3", True) else None
    return {
        "questions_asked": len(questions),
        "clusters": built["clusters"],
        "rows": built["rows"],
        "curated": mined["curated"],
        "timings_s": timings,
        "build_validate_publish_file_s": round(
            timings["build"] + timings["validate"] + timings["publish_file"], 2
        ),
        "validate": validated["status"],
        "published": published["status"],
        "s3_files": s3_report.files if s3_report else None,
        "s3_bytes": s3_report.bytes if s3_report else None,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _publish_to_s3(params: Any, mined: dict[str, Any], timed: Any) -> Any:
    """The staged release published to S3 on loopback (moto's server; ``timed`` as
    ``publish_s3``)."""
    import logging

    from moto.server import ThreadedMotoServer

    from base.store import open_store
    from precompute.publish import publish

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update(
            AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://{host}:{port}",
        )
        import boto3

        boto3.client("s3").create_bucket(Bucket="scale-releases")
        s3 = open_store("s3://scale-releases/edgeqa")
        with _work_area(params, mined).staged_release_folder() as folder:
            return timed(
                "publish_s3", lambda: publish(s3, folder, keep=params.config.keep, signer=None)
            )
    finally:
        server.stop()


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


def child_write_edge_release(args: dict[str, Any]) -> dict[str, Any]:
    """A release of M entries, vectors drawn at random, written into a store folder."""
    import numpy as np

    from base.keys import key, normalize
    from base.manifest import EmbedderEntry, ProfileEntry, Threshold
    from base.store import FileStore
    from precompute.build import BuildConfig, content_sha256, release_version, write_release
    from precompute.publish import publish

    m = int(args["rows"])
    store_dir = Path(args["store"])
    now = datetime(UNTIL.year, UNTIL.month, UNTIL.day, tzinfo=UTC)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((m, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = []
    for i in range(m):
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
    began = time.perf_counter()
    version = release_version(now, content_sha256(rows))
    with tempfile.TemporaryDirectory(dir=store_dir.parent) as tmp:
        write_release(
            Path(tmp),
            rows,
            vectors,
            version,
            ProfileEntry(name="scale-edge", inputs={}),
            EmbedderEntry(name="embedded", dim=384),
            Threshold(value=0.9, margin=0.05, semantic=False, calibrated=False),
            BuildConfig(),
            {
                "counts": {"clusters": m, "rows": m},
                "content_sha256": content_sha256(rows),
                "created_at": now.isoformat(),
            },
        )
        written = time.perf_counter() - began
        began = time.perf_counter()
        report = publish(FileStore(store_dir), Path(tmp), keep=2)
    return {
        "rows": m,
        "write_s": round(written, 2),
        "publish_file_s": round(time.perf_counter() - began, 2),
        "files": report.files,
        "bytes": report.bytes,
        "peak_rss_mb": _peak_rss_mb(),
    }


def child_load_edge_release(args: dict[str, Any]) -> dict[str, Any]:
    from base.store import FileStore
    from edge_index.embedder import load_embedder
    from edge_index.profiles import load_index

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


CHILDREN = {
    "mine": child_mine,
    "aggregate": child_aggregate,
    "release": child_release,
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


def logs_for(work: Path, rows: int, seed: int) -> Path:
    folder = work / f"logs-{rows}-seed{seed}-g{GENERATOR}"
    done = folder / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        write_synthetic_logs(folder, rows, real_questions(DATA_DIR), UNTIL, DAYS, seed)
        done.touch()
    return folder


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100000,1000000", help="log rows to mine, in order")
    parser.add_argument("--full", action="store_true", help="also 10,000,000 rows (aggregate)")
    parser.add_argument("--release", type=int, default=100_000, help="clusters of the release")
    parser.add_argument("--edge-rows", type=int, default=1_000_000, help="entries the edge loads")
    parser.add_argument(
        "--skip",
        default="",
        help="parts to skip: mine,release,edge_load; s3: the release's publish to S3 on loopback",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "scale"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    args = parser.parse_args()
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
        }
    }
    partial = work / "partial.json"  # what is done so far, should a later part fail or hang

    def done(part: str, value: Any) -> None:
        out[part] = value
        partial.write_text(json.dumps(out))

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
            mined["10000000"] = {"aggregate_only": run_child("aggregate", {"logs": str(logs)})}
            done("mine", mined)
    if "release" not in skip and args.release:
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            release = {"work": tmp, "n": args.release, "s3": "s3" not in skip}
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
