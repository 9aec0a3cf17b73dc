"""Helpers shared by the benchmark scripts: the public question sets and summary statistics."""

from __future__ import annotations

import csv
import json
import os
import random
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the project checkout (read by path, never copied into the project)
DATA_DIR = Path(os.environ.get("EDGEQA_BENCH_DATA", ROOT.parent / "shared" / "data"))


def nq_questions(n: int, seed: int = 0) -> list[str]:
    """Real search questions (NQ-open dev), shuffled with a fixed seed."""
    path = DATA_DIR / "nq_open" / "NQ-open.dev.jsonl"
    with path.open(encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f if line.strip()]
    random.Random(seed).shuffle(questions)
    return [q[0].upper() + q[1:] + "?" for q in questions[:n]]


def banking_questions(n: int, seed: int = 0) -> list[str]:
    """Real customer-support questions (banking77 test)."""
    path = DATA_DIR / "banking77" / "test.csv"
    with path.open(encoding="utf-8") as f:
        questions = [row["text"] for row in csv.DictReader(f)]
    random.Random(seed).shuffle(questions)
    return questions[:n]


def summary_ms(values_s: list[float]) -> dict[str, float | None]:
    """mean / p50 / p99 in milliseconds of a list of seconds."""
    if not values_s:
        return {"mean": None, "p50": None, "p99": None}
    ms = sorted(v * 1000.0 for v in values_s)
    p99 = ms[min(len(ms) - 1, max(0, round(0.99 * (len(ms) - 1))))]
    return {
        "mean": round(statistics.fmean(ms), 1),
        "p50": round(statistics.median(ms), 1),
        "p99": round(p99, 1),
    }
