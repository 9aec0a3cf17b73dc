"""Request latency while the log store is down: writes on the request path vs a background writer.

The edge service answers lookups at a fixed rate (open loop, 50 req/s by default) while its request
logs go to a store that works for the first half of the run and then fails every write after a
0.2 s stall (an S3 outage that times out). Two writers, side by side in one process run:

- ``inline``: ``LogWriter(flush_interval_s=0)``, the batch tools' mode: the store written on the
  request path every ``max_rows`` rows, and on a failure the rows kept and retried on the next
  write — what the servers' writer did before #15 (every request of an outage re-encodes the
  buffer and waits for the store);
- ``background``: ``LogWriter`` as the services run it: a background thread writes, failed files
  spill to a local folder (bounded), nothing waits on the store.

Prints one JSON object: {"config": {...}, "results": [{"writer", "phase" ("store_up" |
"store_down"), "requests", "failed", "p50_ms", "p99_ms", "max_ms"}, ...], "memory": {"<writer>":
{"buffered_rows", "spilled_rows", "spill_bytes", "dropped_rows"}}}

Run: .venv/bin/python benchmarks/log_outage.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

if TYPE_CHECKING:
    from collections.abc import Sequence


def outage_store(root: Path) -> Any:
    """A folder that, once its ``down`` is set, stalls 0.2 s and fails every write (a timing-out
    S3). The class is made here: ``base`` is imported once the arguments are parsed."""
    from base.store import FileStore, StoreError

    class OutageStore(FileStore):
        down = False

        def put(self, path: str, data: bytes, content_type: str | None = None) -> None:
            if self.down:
                time.sleep(0.2)
                raise StoreError(f"{path}: the store is unreachable")
            super().put(path, data, content_type)

    return OutageStore(root)


async def drive(url: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """Latencies (ms) of lookups sent every 1/rate s for ``seconds`` (open loop), and how many
    failed (a timeout or a refused connection; their latency is the time to the failure)."""
    import httpx

    latencies: list[float] = []
    failures = 0
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

        async def one(i: int) -> None:
            nonlocal failures
            started = time.perf_counter()
            try:
                await client.get("/v1/lookup", params={"q": f"how do I reset my PIN number {i}"})
            except httpx.HTTPError:
                failures += 1
            latencies.append((time.perf_counter() - started) * 1000)

        tasks, start = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return latencies, failures


def summary(writer: str, phase: str, latencies: list[float], failures: int) -> dict[str, Any]:
    import numpy as np

    values = np.asarray(latencies)
    return {
        "writer": writer,
        "phase": phase,
        "requests": len(latencies),
        "failed": failures,
        "p50_ms": round(float(np.percentile(values, 50)), 2),
        "p99_ms": round(float(np.percentile(values, 99)), 2),
        "max_ms": round(float(values.max()), 2),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="15 s per phase instead of 60")
    parser.add_argument("--rate", type=float, default=50.0, help="lookups per second")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from base.logs import LogWriter
    from base.store import StoreError
    from edge_index.server.app import create_app
    from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
    from edgeqa.local import LocalServer
    from semantic.loading import load_embedder

    seconds = 15.0 if args.quick else 60.0
    embedder = load_embedder("embedded")
    results, memory = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("inline", "background"):
            store = outage_store(Path(tmp) / name / "store")
            if name == "inline":
                logs = LogWriter(store, source="edge", max_rows=200, flush_interval_s=0)
            else:
                logs = LogWriter(
                    store, source="edge", max_rows=200, spill_dir=Path(tmp) / name / "spill"
                )
            watcher = ReleaseWatcher(store, "p", embedder, 3600, metrics_prefix=EDGE_METRICS)
            with LocalServer(create_app(watcher, logs)) as server:
                asyncio.run(drive(server.url, args.rate, 2.0))  # warm up
                for phase in ("store_up", "store_down"):
                    store.down = phase == "store_down"
                    latencies, failures = asyncio.run(drive(server.url, args.rate, seconds))
                    results.append(summary(name, phase, latencies, failures))
            memory[name] = {
                "buffered_rows": logs.buffered_rows,
                "spilled_rows": logs.rows_spilled,
                "spill_bytes": logs.spill_bytes,
                "dropped_rows": logs.rows_dropped,
            }
            store.down = False
            try:
                logs.close()
            except StoreError:
                pass
    config = {"rate_per_s": args.rate, "seconds_per_phase": seconds, "max_rows": 200}
    print(json.dumps({"config": config, "results": results, "memory": memory}))


if __name__ == "__main__":
    main()
