"""Synthetic request logs shaped like a large product's, for measuring the nightly job at scale.

A window of ``days`` days of request logs, ``rows`` rows, written as the origin writes them
(Parquet under ``<store>/logs/dt=YYYY-MM-DD/``, the schema of ``base/logs.py``, users and
networks as 32-hex salted hashes):

- a **head** (``head_share``, 40 %): real questions (``questions``: 5,000 of them from
  ``../shared/data`` in ``benchmarks/scale.py``, read by path; the sample logs' in the tests),
  each typed as it is, the question drawn with Zipf popularity (rank ``r`` weighs ``r ** -zipf``);
- a **long tail** (the rest): one-off wordings of the same popular questions as people type them:
  a word dropped, doubled, or two words swapped, and three times in four a trailing word (from the
  questions' own words);
- users asking ~4 questions each on average (activity skewed: a few ask many), two or three users
  per network; 3 % multi-turn follow-ups, 1 % failed requests, 4 % edge misses (the origin logs
  the same ask again).

Seeded: the same arguments write the same logs.

Imported by ``benchmarks/scale.py`` and ``benchmarks/cluster_scale.py``; run alone, it writes one
window of logs and prints {"out", "rows", "files"}:

    .venv/bin/python benchmarks/synthetic_logs.py OUT [--rows 100000] [--days 7] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import random
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

TRAILING_SHARE = 0.75
MULTI_TURN, FAILED, EDGE_MISS = 0.03, 0.01, 0.04


def real_questions(data_dir: Path, n: int = 5000, seed: int = 0) -> list[str]:
    """``n`` distinct real questions from banking77, CLINC150 and HWU64 (read by path)."""
    texts: list[str] = []
    with (data_dir / "banking77" / "train.csv").open(encoding="utf-8") as f:
        texts += [row["text"] for row in csv.DictReader(f)]
    with (data_dir / "clinc150" / "clinc150_full_flat.csv").open(encoding="utf-8") as f:
        texts += [row["text"] for row in csv.DictReader(f)]
    with (data_dir / "hwu64" / "hwu64_10fold_testsets.csv").open(encoding="utf-8") as f:
        texts += [row["text"] for row in csv.DictReader(f)]
    distinct = sorted({" ".join(t.split()) for t in texts if len(t.split()) >= 3})
    rng = random.Random(seed)
    rng.shuffle(distinct)
    return distinct[:n]


def _hashes(prefix: str, n: int) -> np.ndarray:
    import numpy as np

    return np.array([hashlib.sha256(f"{prefix}{i}".encode()).hexdigest()[:32] for i in range(n)])


def perturbed(question: str, vocabulary: Sequence[str], rng: random.Random) -> str:
    """A one-off wording of ``question``: a word dropped, doubled or two swapped; three times in
    four a trailing word."""
    words = question.split()
    op = rng.randrange(3)
    i = rng.randrange(len(words))
    if op == 0 and len(words) > 3:
        del words[i]
    elif op == 1 or len(words) < 2:
        words.insert(i, words[i])
    else:
        i = min(i, len(words) - 2)
        words[i], words[i + 1] = words[i + 1], words[i]
    if rng.random() < TRAILING_SHARE:
        words.append(rng.choice(vocabulary))
    return " ".join(words)


def synthetic_tables(
    rows: int,
    questions: Sequence[str],
    until: date,
    days: int = 7,
    seed: int = 0,
    head_share: float = 0.4,
    zipf: float = 1.0,
    file_rows: int = 50_000,
) -> Iterator[tuple[date, object]]:
    """(day, pyarrow Table) pieces of the logs, each at most ``file_rows`` rows, in time order."""
    import numpy as np
    import pyarrow as pa

    from base.logs import schema

    rng = random.Random(seed)
    gen = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(questions) + 1) ** zipf
    weights /= weights.sum()
    vocabulary = sorted({w.strip("?!.,").lower() for q in questions for w in q.split()} - {""})
    users = max(1, rows // 4)
    user_ids = _hashes("user", users)
    network_ids = _hashes("network", users // 2 + 1)
    start = datetime(until.year, until.month, until.day, tzinfo=UTC) - timedelta(days=days - 1)
    span_ms = days * 86_400_000
    for begin in range(0, rows, file_rows):
        n = min(file_rows, rows - begin)
        picked = gen.choice(len(questions), size=n, p=weights)
        head = gen.random(n) < head_share
        queries = [
            questions[q] if h else perturbed(questions[q], vocabulary, rng)
            for q, h in zip(picked.tolist(), head.tolist(), strict=True)
        ]
        # activity skewed: user i asks ~ 1 / sqrt(i) as often (the most active reach the cap)
        who = np.minimum((users * gen.random(n) ** 2).astype(np.int64), users - 1)
        # time advances through the window from piece to piece (files are written in order)
        lo, hi = begin * span_ms // rows, (begin + n) * span_ms // rows
        offsets = np.sort(gen.integers(lo, max(hi, lo + 1), n))
        kind = gen.random(n)
        turns = np.where(kind < MULTI_TURN, 2, 1).astype(np.int32)
        failed = (kind >= MULTI_TURN) & (kind < MULTI_TURN + FAILED)
        miss = (kind >= MULTI_TURN + FAILED) & (kind < MULTI_TURN + FAILED + EDGE_MISS)
        tier = np.where(failed, "error", np.where(miss, "miss", "generated"))
        status = np.where(failed, 500, np.where(miss, 404, 200)).astype(np.int32)
        ts = np.datetime64(start.replace(tzinfo=None), "ms") + offsets.astype("timedelta64[ms]")
        table = pa.table(
            {
                "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
                "request_id": pa.array([f"r{seed}-{begin + i}" for i in range(n)]),
                "user": pa.array(user_ids[who]),
                "network": pa.array(network_ids[who // 2]),
                "tenant": pa.nulls(n, pa.string()),
                "query": pa.array(queries),
                "normalized": pa.nulls(n, pa.string()),
                "key": pa.nulls(n, pa.string()),
                "turns": pa.array(turns),
                "tier": pa.array(tier),
                "status": pa.array(status),
                "latency_ms": pa.nulls(n, pa.float64()),
                "ttft_ms": pa.nulls(n, pa.float64()),
                "profile": pa.nulls(n, pa.string()),
                "signed": pa.array(np.ones(n, dtype=bool)),  # logged-in users (the crowd rule)
                "asn": pa.nulls(n, pa.string()),
            },
            schema=schema(),
        )
        days_of = (offsets // 86_400_000).astype(np.int64)
        for d in np.unique(days_of).tolist():
            yield (start + timedelta(days=d)).date(), table.filter(pa.array(days_of == d))


def write_synthetic_logs(
    store_root: Path,
    rows: int,
    questions: Sequence[str],
    until: date,
    days: int = 7,
    seed: int = 0,
    **shape: float,
) -> int:
    """Write the logs under ``store_root`` (a folder: a ``file://`` store); the files written."""
    import pyarrow.parquet as pq

    from base.logs import partition_path

    files = 0
    for day, table in synthetic_tables(rows, questions, until, days, seed, **shape):  # type: ignore[arg-type]
        folder = store_root / partition_path(day)
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")  # type: ignore[arg-type]
        (folder / f"synthetic-{seed}-{files:05d}.parquet").write_bytes(buffer.getvalue())
        files += 1
    return files


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path, help="the folder the logs go under (logs/dt=YYYY-MM-DD/)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument(
        "--until", type=date.fromisoformat, default=None, help="the last day (default: today, UTC)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks._common import DATA_DIR

    until = args.until or datetime.now(UTC).date()
    files = write_synthetic_logs(
        args.out, args.rows, real_questions(DATA_DIR), until, args.days, args.seed
    )
    print(json.dumps({"out": str(args.out), "rows": args.rows, "files": files}))


if __name__ == "__main__":
    main()
