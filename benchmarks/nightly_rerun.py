"""Two nights of the nightly pipeline: the first from scratch, the next building on it.

Both runs read the same sample logs (``precompute/samplelogs.py`` defaults: 7 days, 16 support
intents) and publish into one temporary store with the production settings (INT8 engine,
``max_tokens`` 256 unless ``--max-tokens``): ``first`` mines the 7 days ending ``UNTIL`` with
no release before it; ``second`` is the next night — the window a day later, no new logs (the
hot questions were all answered from the CDN, which logs nothing) — and builds on the first's
release: carried evidence keeps its clusters, its answers are reused. Each run loads what it
needs (tokenizer, embedder, model) as a fresh nightly process would; the model conversion cache
is warmed first so neither pays for it.

Prints one JSON object: {"config", "runs": {"first": {...}, "second": {...}}, "reuse_ratio",
"speedup", "generation_seconds_saved_est"}.

Run: .venv/bin/python benchmarks/nightly_rerun.py [--max-tokens N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from datetime import time as day_time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from collections.abc import Sequence

    from base.store import FileStore
    from precompute.config import PipelineConfig

UNTIL = date(2026, 11, 28)


def night(logs: FileStore, out: FileStore, until: date, config: PipelineConfig) -> dict[str, Any]:
    from precompute.pipeline import RunParams, run_pipeline

    started = datetime.combine(until, day_time.max, UTC)  # the DAG's data interval end
    params = RunParams(
        logs.uri,
        out.uri,
        until - timedelta(days=6),
        until,
        config,
        runner="benchmark",
        started=started,
    )
    began = time.perf_counter()
    report = run_pipeline(params)
    seconds = time.perf_counter() - began
    generation = report["generation"]
    return {
        "seconds": round(seconds, 2),
        "timings_s": report["timings_s"],
        "status": report["status"],
        "version": report["version"],
        "clusters_published": report["build"]["clusters"],
        "rows_published": report["build"]["rows"],
        "carried_phrasings": report["mining"]["carried_phrasings"],
        "answers": generation["answers"],
        "generated": generation["generated"],
        "reused": generation["reused"],
        "flagged": generation["flagged"],
        "generation_seconds": generation["seconds"],
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--max-tokens", type=int, default=None, help="default EDGEQA_MAX_TOKENS")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from base.languages import DEFAULT_LANGUAGE
    from base.store import FileStore
    from origin.conversion import ensure_converted
    from origin.model import embedded_gguf_path
    from precompute.config import PipelineConfig
    from precompute.samplelogs import generate_rows, write_logs
    from semantic.loading import load_embedder

    config = PipelineConfig.from_env(max_tokens=args.max_tokens)
    settings = config.settings
    ensure_converted(embedded_gguf_path(), Path(settings.cache_dir).expanduser())
    # the run's embedder (EDGEQA_EMBEDDER's for the default language): its files into the page
    # cache for both runs alike
    load_embedder(settings.embedders[DEFAULT_LANGUAGE], cache_dir=Path(settings.cache_dir))
    rows = generate_rows(UNTIL)
    with tempfile.TemporaryDirectory(prefix="edgeqa-nightly-") as tmp:
        logs, out = FileStore(Path(tmp) / "logs"), FileStore(Path(tmp) / "out")
        write_logs(logs, rows)
        runs = {
            "first": night(logs, out, UNTIL, config),
            "second": night(logs, out, UNTIL + timedelta(days=1), config),
        }
    first, second = runs["first"], runs["second"]
    per_answer = first["generation_seconds"] / max(first["generated"], 1)
    print(
        json.dumps(
            {
                "config": {
                    "logs": "precompute/samplelogs.py defaults, 7 days",
                    "log_rows": len(rows),
                    "max_tokens": settings.max_tokens,
                    "quantization": config.generation.quantization,
                    "windows": [
                        f"{UNTIL - timedelta(days=6)}..{UNTIL}",
                        f"{UNTIL - timedelta(days=5)}..{UNTIL + timedelta(days=1)}",
                    ],
                },
                "runs": runs,
                "reuse_ratio": round(second["reused"] / max(second["answers"], 1), 3),
                "speedup": round(first["seconds"] / second["seconds"], 2),
                "generation_seconds_saved_est": round(second["reused"] * per_answer, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
