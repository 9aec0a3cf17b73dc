"""Nightly generation on a local Ray against generation in this process, on the same partitions.

The questions are banking77's (``../shared/data``, read by path), split into partitions of
``--partition-size`` as the nightly job splits its mined questions. ``in_process`` answers them
with one engine in this process (``generate.generate_all``: what a run handed a loaded model
does); ``ray_local`` is the nightly job's path (``generate.generate_on_fleet``): a Ray Data job on
a local Ray (``precompute/fleet/``), one engine per actor, one actor per CPU slot, each
partition read from the run's ``hot/`` and written to the work area by the actor that answered
it. The same settings (the nightly
default INT8 weights unless ``--quantization``, greedy, ``--max-tokens``).

Per system: ``answers_per_s`` and ``tokens_per_s`` as the run report measures them (from the
first generated partition's start to the last one's end: the engines' builds not counted), and
``wall_s`` from the call to the last partition written (engines and Ray's actors included).
``identical_answers``: how many of the answers are the same text, token for token.

Prints one JSON object: {"config", "systems": {"in_process": {...}, "ray_local": {...}},
"ray_vs_in_process": {"answers_per_s", "wall"}, "identical_answers", "answers"}.

Run: .venv/bin/python benchmarks/ray_generation.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import banking_questions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from precompute.questions import HotQuestion


def _hot(questions: list[str]) -> list[HotQuestion]:
    """``questions`` as mined ones (one wording each), in order: what a run's ``hot/`` holds."""
    from base.keys import key, normalize
    from precompute.questions import HotQuestion, Phrasing

    hot = []
    for question in questions:
        wording = Phrasing(key(question), normalize(question), question, set(), 1, {})
        hot.append(HotQuestion(wording, [wording], users=5, hits=5, score=1.0))
    return hot


def _system(report: Any, wall: float) -> dict[str, Any]:
    result = report.as_dict()
    return {
        "ran_on": result["ran_on"],
        "answers": result["generated"],
        "tokens": result["tokens"],
        "seconds": result["seconds"],
        "answers_per_s": result["answers_per_s"],
        "tokens_per_s": result["tokens_per_s"],
        "wall_s": round(wall, 2),
        "answers_per_wall_s": round(result["generated"] / wall, 3),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="48 questions, 32 tokens")
    parser.add_argument("--questions", type=int, default=192)
    parser.add_argument("--partition-size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--quantization", default="int8", choices=("int8", "bf16", "none"))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from base.keys import key
    from base.store import FileStore
    from precompute.config import PrecomputeSettings
    from precompute.fleet import connect
    from precompute.fleet.generation import Job, generate_on_fleet
    from precompute.generate import generate_all, nightly_engine, read_partitions
    from precompute.workarea import WorkArea

    if args.quick:
        args.questions, args.max_tokens = 48, 32
    os.environ.pop("EDGEQA_RAY_ADDRESS", None)  # the local Ray: what this compares
    settings = PrecomputeSettings.from_env().replace(max_tokens=args.max_tokens)
    questions = banking_questions(args.questions)
    keys = [key(q) for q in questions]
    at = datetime(2026, 11, 28, 23, 59, 59, tzinfo=UTC)
    systems: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="edgeqa-bench-") as tmp:
        store = FileStore(Path(tmp))
        # in this process: one engine (the run's model loaded here), every partition in turn
        work = WorkArea(store, "bench", "in-process")
        started = time.perf_counter()
        _, report = generate_all(
            lambda: nightly_engine(settings, args.quantization),  # type: ignore[arg-type]
            work,
            keys,
            questions,
            settings,
            args.partition_size,
            generated_at=at,
            progress=False,
        )
        systems["in_process"] = _system(report, time.perf_counter() - started)
        answers["in_process"] = [r["answer"] for r in read_partitions(work)]

        # on a local Ray: the nightly job's path (Ray started first, as a run's mining does)
        fleet = connect(settings)
        work = WorkArea(store, "bench", "ray")
        work.put_hot(_hot(questions))  # the actors read their partitions' questions there
        job = Job.of(
            fleet,
            settings,
            args.quantization,  # type: ignore[arg-type]
            work,
            at,
            args.partition_size,
            len(questions),
        )
        started = time.perf_counter()
        report = generate_on_fleet(fleet, job, work)
        systems["ray_local"] = _system(report, time.perf_counter() - started)
        answers["ray_local"] = [r["answer"] for r in read_partitions(work)]

    same = sum(a == b for a, b in zip(answers["in_process"], answers["ray_local"], strict=True))
    ray, here = systems["ray_local"], systems["in_process"]
    print(
        json.dumps(
            {
                "config": {
                    "questions": len(questions),
                    "partition_size": args.partition_size,
                    "partitions": -(-len(questions) // args.partition_size),
                    "max_tokens": args.max_tokens,
                    "quantization": args.quantization,
                    "cpus": os.cpu_count(),
                },
                "systems": systems,
                "ray_vs_in_process": {
                    "answers_per_s": round(ray["answers_per_s"] / here["answers_per_s"], 3),
                    "wall": round(here["wall_s"] / ray["wall_s"], 3),
                },
                "identical_answers": same,
                "answers": len(questions),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
