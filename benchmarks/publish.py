"""Publishing releases to S3 measured against request latency, not loopback speed.

moto's S3 server on loopback behind a proxy that holds every request ``--latency-ms`` (25 ms by
default: a region's S3 from a worker in it, give or take) before forwarding it, and counts what
it forwarded (``benchmarks/_latency_proxy.py``; each in its own process). Two nights against the
same bucket (``s3://publish-bench/releases``), built without a model (synthetic rows and random
8-d vectors, ``precompute.build.write_release`` with a ``Flat`` index: nothing to train):

- **night 1**: a release of ``--answers`` answers (100,000; ``--quick``: 2,000), the first;
- **night 2**: the same questions with ``--changed`` of the answers (10 %) generated again that
  night, built on night 1's release (its parent); the other answers keep night 1's dates, as the
  pipeline keeps a reused answer's, so their objects are night 1's and are not written again.

Each night's steps: ``build`` (local; no requests), ``upload`` (``publish.upload_release``: the
build stage's last step), ``check`` (``release_check.check_release``: the validate stage's read
back) and ``publish`` (``publish.publish_uploaded``, signed by a fresh ``LocalSigner``). Steps
are cut into parts at the stage marks the functions call: the upload's ``prepare`` (the version
folder and the parent's digests read), ``objects``, ``shards`` (the release's own files) and
``manifest``; the publish's ``prepare`` (pointer and manifest read, signature written), ``flip``
and ``prune``. For each step: the requests by kind (put, get, head, list, delete,
delete_objects, other), per published answer, the most in flight at once, the longest serial
run (requests each started with none other in flight, one after another; it carries across a
step's parts), seconds, ``objects_per_s`` (the release's answers over the step's seconds; the
upload's ``written_per_s``: the objects it wrote), requests/s, responses by status, bytes each
way, and the CPU seconds of this process (the client), the proxy and moto; for the night: the
sum of upload, check and publish, and the bound ``2 × (requests × latency ÷ concurrency) +
60 s`` beside their wall time.

Then the **ceiling**: night 2's upload again (its changed answers worded anew, so as many objects
are written) with the proxy's delay at 0: the requests/s moto and this machine sustain, and each
night's requests at that rate (``at_ceiling_s``); and night 2's check again at 0 ms
(``ceiling.check``: moto answers a LIST by reading every key of the bucket, S3 does not). A
night whose wall time is near ``at_ceiling_s`` is bound by moto and the CPUs, not by latency;
near the latency term (``requests × latency ÷ concurrency``), by latency.

Last, **prune_abandoned**: ``prune`` run as if two days had passed, at 25 ms: it removes the
ceiling's release (built, never published) and the answer objects only it wrote, in
``DeleteObjects`` batches of 1,000 (the nights' objects are held by the kept releases).

Prints one JSON object {"config", "nights": [{"night", "version", "parent", "steps": {"build",
"upload", "check", "publish"}, "total", "bound"}, ...], "ceiling", "prune_abandoned"}, also
written to ``benchmarks/out/publish.json``.

Run: .venv/bin/python benchmarks/publish.py [--quick] [--answers 100000] [--changed 0.10]
     [--latency-ms 25] [--concurrency 128] [--skip-ceiling] [--work DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT
from benchmarks._latency_proxy import KINDS, MotoProcess, ProxyProcess

BUCKET = "publish-bench"
STORE_URI = f"s3://{BUCKET}/releases"
PROFILE = "bench"
DIM = 8
TTL_DAYS = 30.0
WORDS = (
    "account balance card transfer limit fee branch online statement payment refund interest "
    "loan mortgage savings deposit withdraw password login verify identity address update "
    "close open pending declined international currency exchange rate cheque standing order "
    "direct debit overdraft charge dispute fraud report lost stolen replace activate pin"
).split()


# --- the synthetic release ---------------------------------------------------------------


def _answer(rng: random.Random, index: int, tag: str) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 80)))
    return f"Answer {index}{tag}: {words[0].upper()}{words[1:]}."


def _expires(generated_at: datetime, key: str) -> datetime:
    jitter = int(key[:8], 16) / 0xFFFFFFFF  # up to 20 % later, fixed by the key
    return (generated_at + timedelta(days=TTL_DAYS * (1 + 0.2 * jitter))).replace(microsecond=0)


def night_rows(
    n: int, night: datetime, seed: int, previous: list[dict[str, Any]] | None, changed: set[int]
) -> list[dict[str, Any]]:
    """``n`` rows (``base.release.row_schema``'s fields): night 1's (``previous`` None), or
    ``previous``'s with the answers at ``changed`` generated again at ``night``."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if previous is not None and i not in changed:
            rows.append({**previous[i], "object_sha256": ""})
            continue
        if previous is None:
            question = f"Synthetic question {i}: how do I {' '.join(rng.sample(WORDS, 4))}?"
            normalized = question.lower()
            key = hashlib.sha256(normalized.encode()).hexdigest()
            base = {
                "id": i,
                "key": key,
                "question": question,
                "normalized": normalized,
                "users": 5 + i % 7,
                "hits": 5 + i % 31,
                "cluster": key,
                "canonical": True,
                "checks": "",
            }
        else:
            base = dict(previous[i])
        rows.append(
            {
                **base,
                "answer": _answer(rng, i, f" (seed {seed})"),
                "generated_at": night,
                "expires_at": _expires(night, base["key"]),
                "object_sha256": "",
            }
        )
    return rows


def build(
    staging: Path,
    rows: list[dict[str, Any]],
    vectors: Any,
    now: datetime,
    parent: str | None,
) -> tuple[str, str]:
    """The release of ``rows`` written to ``staging`` as the build stage writes one; (its
    version, its manifest's sha256)."""
    from base.manifest import EmbedderEntry, ProfileEntry, Threshold
    from base.release import sha256_hex
    from precompute.build import release_version, write_release
    from precompute.config import BuildConfig
    from precompute.shards import ReleaseRows, content_sha256

    content = content_sha256(rows)
    version = release_version(now, content)
    manifest = write_release(
        staging,
        ReleaseRows.in_memory(rows, vectors),
        version,
        ProfileEntry(name=PROFILE, inputs={}),
        EmbedderEntry.of({"name": "bench", "dim": DIM}),
        Threshold.of({"calibrated": False, "semantic": False, "semantic_off_reason": "bench"}),
        BuildConfig(factory="Flat", ttl_days=TTL_DAYS),
        {
            "counts": {"clusters": len(rows), "rows": len(rows)},
            "content_sha256": content,
            "created_at": now.isoformat(),
            "runner": "bench",
            **({"parent": parent} if parent else {}),
        },
    )
    return manifest.version, sha256_hex((staging / "manifest.json").read_bytes())


# --- measuring ---------------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class Meter:
    """Steps measured on their own: the proxy's counters zeroed at each step's start and read at
    its end, and at each stage mark the step's function calls (its parts)."""

    def __init__(self, proxy: ProxyProcess, moto: MotoProcess, answers: int) -> None:
        self.proxy, self.answers = proxy, answers
        assert proxy.process is not None and moto.process is not None
        self.pids = {"proxy": proxy.process.pid, "moto": moto.process.pid}

    def _cpu(self) -> dict[str, float]:
        return {"client": time.process_time(), **{k: _cpu_s(p) for k, p in self.pids.items()}}

    def step(
        self, fn: Callable[[Callable[[str], None]], Any], first_part: str | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``fn(mark)`` run and measured; ``mark(name)`` starts its part ``name``."""
        parts: dict[str, dict[str, Any]] = {}
        current: list[Any] = [first_part, 0.0]

        def mark(name: str | None) -> None:
            now = time.perf_counter()
            if current[0] is not None:
                # the serial run carries on across a step's parts
                found = self.proxy.reset(keep_run=True)
                parts[current[0]] = {"seconds": round(now - current[1], 3), **_counts(found)}
            current[:] = [name, now]

        self.proxy.reset()
        cpu, started = self._cpu(), time.perf_counter()
        mark(first_part)
        result = fn(mark)
        seconds = time.perf_counter() - started
        mark(None)
        after = self._cpu()
        if not parts:
            parts["all"] = {"seconds": round(seconds, 3), **_counts(self.proxy.reset())}
        summary = self.summary(seconds, list(parts.values()))
        summary["cpu_s"] = {k: round(after[k] - cpu[k], 2) for k in cpu}
        if len(parts) > 1 or "all" not in parts:
            summary["parts"] = {
                name: {k: v for k, v in part.items() if not k.startswith(("statuses", "bytes"))}
                for name, part in parts.items()
            }
        return result, summary

    def summary(self, seconds: float, parts: list[dict[str, Any]]) -> dict[str, Any]:
        requests = {kind: sum(p["requests"].get(kind, 0) for p in parts) for kind in KINDS}
        total = sum(requests.values())
        statuses: dict[str, int] = {}
        for part in parts:
            for status, count in part.get("statuses", {}).items():
                statuses[status] = statuses.get(status, 0) + count
        return {
            "seconds": round(seconds, 3),
            "requests": {k: v for k, v in requests.items() if v},
            "requests_total": total,
            "requests_per_answer": round(total / self.answers, 4),
            "max_in_flight": max((p["max_in_flight"] for p in parts), default=0),
            "max_serial_run": max((p["max_serial_run"] for p in parts), default=0),
            "objects_per_s": round(self.answers / seconds, 1) if seconds else None,
            "requests_per_s": round(total / seconds, 1) if seconds else None,
            "statuses": dict(sorted(statuses.items())),
            "bytes_up": sum(p.get("bytes_up", 0) for p in parts),
            "bytes_down": sum(p.get("bytes_down", 0) for p in parts),
        }


def _counts(found: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": {k: v for k, v in found["requests"].items() if v},
        "requests_total": found["total"],
        "max_in_flight": found["max_in_flight"],
        "max_serial_run": found["max_serial_run"],
        "statuses": found["statuses"],
        "bytes_up": found["bytes_in"],
        "bytes_down": found["bytes_out"],
    }


def _total(meter: Meter, steps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The steps that make requests (all but the build), summed: their wall time, requests and
    CPU (each step's serial run is its own: the longest of them)."""
    timed = [step for name, step in steps.items() if name != "build"]
    total = meter.summary(sum(step["seconds"] for step in timed), timed)
    cpu: dict[str, float] = {}
    for step in timed:
        for name, seconds in step["cpu_s"].items():
            cpu[name] = round(cpu.get(name, 0.0) + seconds, 2)
    return {**total, "cpu_s": cpu, "build_s": steps["build"]["seconds"]}


def bound(requests: int, latency_ms: float, concurrency: int, wall_s: float) -> dict[str, Any]:
    latency_term = requests * latency_ms / 1000.0 / concurrency
    formula = 2 * latency_term + 60.0
    return {
        "formula": "2 × (requests × latency ÷ concurrency) + 60 s",
        "requests": requests,
        "latency_term_s": round(latency_term, 2),
        "bound_s": round(formula, 2),
        "wall_s": round(wall_s, 2),
        "within": wall_s <= formula,
    }


# --- the run -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    parser.add_argument("--quick", action="store_true", help="2,000 answers (unless --answers)")
    parser.add_argument("--answers", type=int, default=None, help="answers a night (100,000)")
    parser.add_argument(
        "--changed", type=float, default=0.10, help="share of answers changed on night 2"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=25.0, help="delay the proxy adds to each request"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="S3 requests in flight (EDGEQA_S3_CONCURRENCY; default: it, or 128)",
    )
    parser.add_argument("--keep", type=int, default=5, help="releases publish keeps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-ceiling", action="store_true", help="leave out the 0 ms ceiling measurement"
    )
    parser.add_argument("--work", type=Path, default=None, help="staging folder (a temporary one)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "out" / "publish.json", help="JSON copy"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    cli = parser()
    args = cli.parse_args(argv)
    answers = args.answers or (2_000 if args.quick else 100_000)
    if not 0 < args.changed <= 1:
        cli.error("--changed must be in (0, 1]")
    if args.concurrency is not None:
        os.environ["EDGEQA_S3_CONCURRENCY"] = str(args.concurrency)

    with tempfile.TemporaryDirectory(prefix="edgeqa-publish-bench-", dir=args.work) as tmp:
        result = run(args, answers, Path(tmp))
    text = json.dumps(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)


def publish_night(
    meter: Meter,
    store: Any,
    staging: Path,
    rows: list[dict[str, Any]],
    vectors: Any,
    now: datetime,
    parent: str | None,
    keep: int,
    signer: Any,
) -> tuple[str, dict[str, dict[str, Any]]]:
    """One night's release built, uploaded, checked and published; (its version, each step's
    measures)."""
    from base.release_check import check_release
    from precompute.prune import mark_checked
    from precompute.publish import publish_uploaded, upload_release

    (version, sha), build_s = meter.step(lambda mark: build(staging, rows, vectors, now, parent))
    upload, upload_s = meter.step(lambda mark: upload_release(store, staging, mark), "prepare")
    upload_s["report"] = upload.as_dict()
    upload_s["manifest_sha256"] = sha
    upload_s["written_per_s"] = round(upload.objects_written / upload_s["seconds"], 1)

    def check(mark: Any) -> None:  # the validate stage's: checked, then marked so
        check_release(store, PROFILE, version, sha)
        mark_checked(store, PROFILE, version, sha)

    _, check_s = meter.step(check)
    published, publish_s = meter.step(
        lambda mark: publish_uploaded(
            store, PROFILE, version, sha, keep=keep, signer=signer, on_stage=mark
        ),
        "prepare",
    )
    publish_s["report"] = published.as_dict()
    shutil.rmtree(staging, ignore_errors=True)
    return version, {"build": build_s, "upload": upload_s, "check": check_s, "publish": publish_s}


def run(args: argparse.Namespace, answers: int, tmp: Path) -> dict[str, Any]:
    import logging

    import numpy as np

    logging.getLogger("botocore").setLevel(logging.WARNING)
    with MotoProcess() as moto, ProxyProcess(moto.url, args.latency_ms) as proxy:
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": proxy.url,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
        )
        import boto3

        from base.config import StoreSettings
        from base.signing import LocalSigner, generate_keypair
        from base.store import open_store
        from precompute.publish import upload_release

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        concurrency = StoreSettings.from_env().s3_concurrency
        store = open_store(STORE_URI)
        signer = LocalSigner(generate_keypair()[0])
        meter = Meter(proxy, moto, answers)

        rng = np.random.default_rng(args.seed)
        vectors = rng.standard_normal((answers, DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        changed = set(
            random.Random(args.seed).sample(range(answers), max(1, round(args.changed * answers)))
        )
        today = datetime.now(UTC).replace(microsecond=0)
        first_at, second_at = today - timedelta(days=1), today

        first = night_rows(answers, first_at, args.seed + 1, None, set())
        second = night_rows(answers, second_at, args.seed + 2, first, changed)
        nights: list[dict[str, Any]] = []
        parent: str | None = None
        for number, (rows, now) in enumerate(((first, first_at), (second, second_at)), start=1):
            version, steps = publish_night(
                meter, store, tmp / f"night{number}", rows, vectors, now, parent, args.keep, signer
            )
            total = _total(meter, steps)
            nights.append(
                {
                    "night": number,
                    "version": version,
                    "parent": parent,
                    "answers_generated": len(changed) if parent else answers,
                    "steps": steps,
                    "total": total,
                    "bound": bound(
                        total["requests_total"], args.latency_ms, concurrency, total["seconds"]
                    ),
                }
            )
            parent = version

        ceiling = None
        if not args.skip_ceiling:
            # night 2's upload again, its changed answers worded anew (as many objects new), at
            # 0 ms: a release built on night 1's, uploaded and never published
            again = night_rows(answers, second_at, args.seed + 99, first, changed)
            staging = tmp / "ceiling"
            nights_first = nights[0]["version"]
            meter.step(
                lambda mark: build(
                    staging, again, vectors, second_at + timedelta(seconds=1), nights_first
                )
            )
            proxy.set_latency(0)
            try:
                upload, ceiling = meter.step(
                    lambda mark: upload_release(store, staging, mark), "prepare"
                )
                # and night 2's check again at 0 ms: its listings are moto's slowest requests
                # (a LIST reads every key of the bucket there), a read-back S3 serves in ms
                from base.release_check import check_release

                last = nights[-1]
                sha = last["steps"]["upload"]["manifest_sha256"]
                _, checked = meter.step(
                    lambda mark: check_release(store, PROFILE, last["version"], sha)
                )
            finally:
                proxy.set_latency(args.latency_ms)
            ceiling = {"latency_ms": 0, **ceiling, "report": upload.as_dict(), "check": checked}
            rate = ceiling["requests_per_s"] or 0.0
            for night in nights:
                requests = night["total"]["requests_total"]
                night["bound"]["at_ceiling_s"] = round(requests / rate, 2) if rate else None
            shutil.rmtree(staging, ignore_errors=True)

        # two days on, prune (at 25 ms) removes the abandoned release and the objects only it
        # wrote: no kept release names them (DeleteObjects batches of 1,000)
        from precompute.prune import prune

        later = datetime.now(UTC) + timedelta(days=2)
        removed, pruned = meter.step(lambda mark: prune(store, PROFILE, args.keep, now=later))
        pruned["removed"] = removed

    config = {
        "answers": answers,
        "changed": args.changed,
        "changed_answers": len(changed),
        "latency_ms": args.latency_ms,
        "concurrency": concurrency,
        "keep": args.keep,
        "store": STORE_URI,
        "cpus": os.cpu_count(),
        "dim": DIM,
        "quick": args.quick,
    }
    return {"config": config, "nights": nights, "ceiling": ceiling, "prune_abandoned": pruned}


if __name__ == "__main__":
    main()
