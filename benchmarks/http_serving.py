"""The origin over HTTP on loopback: a Poisson trace of hot and novel questions, streamed.

Publishes a real release first (sample logs -> ``run_precompute``: mining, engine generation,
FAISS build, publish), starts ``edgeqa origin serve`` on it as a separate process, and replays a
Poisson trace with streaming chat requests: half hot questions (the sample logs' phrasings, many
in the release), the rest novel questions from NQ-open, some of them asked twice (the online
cache). The rate overloads the engine on purpose: the bounded queue must answer 429 at once and
the admitted requests must finish with a bounded TTFT.

Prints one JSON object::

  {"config": {...},
   "client": {"completed", "rejected_429", "errors", "ttft_ms": {"mean","p50","p99"},
              "tpot_ms": {...}, "output_tok_per_s", "ttft_ms_by_tier": {...}},
   "server": {"ttft_queue_ms": {...}, "ttft_compute_ms": {...}, "ttft_network_ms": {...}},
   "tiers": {"<tier>": count}}

``server`` comes from the origin's own ``/metrics`` histograms (p50/p99 interpolated within
buckets, as Prometheus' ``histogram_quantile`` does).

    python benchmarks/http_serving.py --quick

``--miss-path`` measures instead what a question that missed at the edge costs the origin before
its first token, with and without the client's missed-hint (``x-edgeqa-missed``: the release the
edge searched, so the origin does not embed and search the question in it again): novel
questions, one at a time (no queue), each asked once, alternately with and without the hint, and
per request the server's own TTFT split read from ``/metrics`` after it::

  {"config": {...}, "without_hint": {"ttft_ms", "server_queue_ms", "server_compute_ms",
   "semantic_lookups"}, "with_hint": {...}, "saved_ms": {...}}

``server_queue_ms`` (arrival -> scheduled) holds the tier lookups; ``semantic_lookups`` counts
the origin's semantic-tier searches (``miss``) and the ones the hint spared it (``skipped``).

    python benchmarks/http_serving.py --miss-path --requests 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, nq_questions, summary_ms

sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from collections.abc import Sequence

    import httpx

    from base.store import FileStore

MODEL = "SmolLM2-135M-Instruct"


def publish_release(
    store: FileStore, top_n: int, max_tokens: int, semantic: bool = False
) -> dict[str, Any]:
    """``semantic``: serve the embedder's measured decision although a release this small cannot
    calibrate its semantic tier (as the demo does), so that the tier runs."""
    from origin.engine import default_quantization
    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams, run_pipeline
    from precompute.samplelogs import generate_rows, write_logs

    until = datetime.now(UTC).date()
    write_logs(store, generate_rows(until, days=3, asks=1500, seed=7))
    # the CPU's fastest weights for the release (emulated bf16 is many times slower than fp32)
    weights = default_quantization("cpu")
    config = PipelineConfig.from_env({}, top_n=top_n, max_tokens=max_tokens, quantization=weights)
    if semantic:
        config = config.replace(build={"semantic_uncalibrated": True})
    params = RunParams(store.uri, store.uri, until - timedelta(days=2), until, config, "benchmark")
    report = run_pipeline(params)
    if report.get("status") != "published":
        raise RuntimeError(f"no release was published: {report}")
    return {"version": report["version"], "clusters": report["mining"]["clusters"]}


def trace(n: int, rate: float, hot_share: float, repeat_share: float, seed: int) -> list[Any]:
    """(arrival offset s, question) pairs of a Poisson process."""
    from precompute.samplelogs import INTENTS

    rng = random.Random(seed)
    hot = [q for intent in INTENTS for q in intent]
    novel = iter(nq_questions(n, seed))
    asked_novel: list[str] = []
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        draw = rng.random()
        if draw < hot_share:
            question = rng.choice(hot)
        elif asked_novel and draw < hot_share + repeat_share:
            question = rng.choice(asked_novel)
        else:
            question = next(novel)
            asked_novel.append(question)
        out.append((t, question))
    return out


async def one_request(client: httpx.AsyncClient, question: str, max_tokens: int) -> dict[str, Any]:
    import httpx

    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    result: dict[str, Any] = {"status": None, "tier": None, "ttft": None, "tpot": None, "tokens": 0}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            result["status"] = response.status_code
            result["tier"] = response.headers.get("x-edgeqa-tier", "rejected")
            first = last = None
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    result["status"] = 500
                elif data.get("choices") and data["choices"][0]["delta"].get("content"):
                    last = time.perf_counter()
                    first = first or last
                elif data.get("usage"):
                    result["tokens"] = data["usage"]["completion_tokens"]
            if first is not None:
                result["ttft"] = first - sent
                if result["tokens"] > 1 and last is not None and result["tier"] == "generated":
                    result["tpot"] = (last - first) / (result["tokens"] - 1)
    except httpx.HTTPError as error:
        result["status"] = f"{type(error).__name__}"
    return result


async def replay(url: str, requests: list[Any], max_tokens: int) -> tuple[list[Any], float]:
    import httpx

    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        started = time.perf_counter()

        async def at(offset: float, question: str) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, offset - (time.perf_counter() - started)))
            return await one_request(client, question, max_tokens)

        results = await asyncio.gather(*(at(t, q) for t, q in requests))
        return list(results), time.perf_counter() - started


def histogram(text: str, name: str) -> dict[str, float | None]:
    """mean / p50 / p99 in ms of a Prometheus histogram in exposition text (summed over labels);
    quantiles interpolated within buckets, as Prometheus' ``histogram_quantile`` does."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    if not count:
        return {"mean": None, "p50": None, "p99": None}

    def quantile(q: float) -> float:
        rank, low, below = q * count, 0.0, 0.0
        for upper, cumulative in sorted(buckets.items()):
            if cumulative >= rank:
                if upper == float("inf"):
                    return low
                share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                return low + (upper - low) * share
            low, below = upper, cumulative
        return low

    return {
        "mean": round(total / count * 1000, 2),
        "p50": round(quantile(0.5) * 1000, 2),
        "p99": round(quantile(0.99) * 1000, 2),
    }


def start_origin(
    store: FileStore | None, port: int, env_extra: dict[str, str]
) -> subprocess.Popen[str]:
    """``edgeqa origin serve`` in a child process, once healthy (and serving the store's release,
    given a store). Per-asker and per-network shares are off unless ``env_extra`` sets them: the
    load generator stands for many users on many networks."""
    import httpx

    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEQA_")}
    env.update(
        {
            "EDGEQA_USER_SALT": "bench-salt-0123456789",
            "EDGEQA_MAX_IN_FLIGHT_PER_USER": "0",
            "EDGEQA_MAX_TOKENS_PER_MINUTE_PER_USER": "0",
            "EDGEQA_MAX_IN_FLIGHT_PER_NETWORK": "0",
            **({"EDGEQA_STORE": store.uri} if store else {}),
            **env_extra,
        }
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "edgeqa", "origin", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the origin exited: {child.stderr.read() if child.stderr else ''}")
        try:
            health = httpx.get(f"{url}/health")
            if health.status_code == 200 and (store is None or health.json().get("release")):
                return child
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    child.kill()
    raise RuntimeError("the origin did not become healthy in 300 s")


def _series(text: str) -> dict[str, float]:
    """Every sample of a Prometheus exposition text, by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def _stream_ttft(
    client: httpx.Client, question: str, max_tokens: int, hint: str | None
) -> float | None:
    """Seconds to the first answer text of one streamed chat request; None when a tier answered
    it (not a miss)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    headers = {"x-edgeqa-missed": hint} if hint else {}
    sent = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{question!r}: {response.status_code} {response.read()[:200]!r}")
        generated = response.headers.get("x-edgeqa-tier") == "generated"
        for line in response.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{question!r}: no text")
    return first - sent if generated else None


def miss_path(url: str, n: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """``n`` novel questions, one at a time, alternately (in a random order per pair) with and
    without the missed-hint naming the origin's release; the client's TTFT and the server's TTFT
    split and semantic-tier lookups of each, from ``/metrics`` deltas."""
    import httpx

    health = httpx.get(f"{url}/health").json()
    profile = httpx.get(f"{url}/config.json").json()["profiles"]["en"]
    hint = f"{profile}/{health['release']}"
    rng = random.Random(seed)
    warmup = 4
    questions = nq_questions(n + warmup, seed + 1)
    queue, compute = "edgeqa_ttft_queue_seconds_sum", "edgeqa_ttft_compute_seconds_sum"
    arms: dict[str, dict[str, list[float]]] = {
        arm: {"ttft": [], "queue": [], "compute": []} for arm in ("without_hint", "with_hint")
    }
    lookups: dict[str, Counter[str]] = {arm: Counter() for arm in arms}
    order: list[str] = []
    answered = 0  # questions a tier answered after all: left out
    with httpx.Client(base_url=url, timeout=300) as client:
        before = _series(client.get("/metrics").text)
        for i, question in enumerate(questions):
            if i % 2 == 0:
                order = rng.sample(list(arms), 2)
            arm = order[i % 2]
            ttft = _stream_ttft(client, question, max_tokens, hint if arm == "with_hint" else None)
            after = _series(client.get("/metrics").text)
            if ttft is None:
                answered += 1
            elif i >= warmup:
                model = f"{{model_name={MODEL}}}"
                arms[arm]["ttft"].append(ttft)
                arms[arm]["queue"].append(after[queue + model] - before[queue + model])
                arms[arm]["compute"].append(after[compute + model] - before[compute + model])
                for outcome in ("hit", "miss", "skipped"):
                    name = f"edgeqa_origin_semantic_lookups_total{{outcome={outcome}}}"
                    # absent on an origin that predates the hint: it searched every time
                    moved = after.get(name, 0.0) - before.get(name, 0.0)
                    lookups[arm][outcome] += int(moved)
            before = after
    report: dict[str, Any] = {"hint": hint, "answered_by_a_tier": answered}
    for arm, values in arms.items():
        report[arm] = {
            "requests": len(values["ttft"]),
            "ttft_ms": summary_ms(values["ttft"]),
            "server_queue_ms": summary_ms(values["queue"]),
            "server_compute_ms": summary_ms(values["compute"]),
            "semantic_lookups": dict(lookups[arm]),
        }
    report["saved_ms"] = {
        f"{what}_{stat}": round(
            report["without_hint"][what][stat] - report["with_hint"][what][stat], 1
        )
        for what in ("ttft_ms", "server_queue_ms")
        for stat in ("mean", "p50")
    }
    return report


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="150 requests (default 600)")
    parser.add_argument("--rate", type=float, default=16.0, help="requests per second")
    parser.add_argument("--max-tokens", type=int, help="default 64 (--miss-path: 8)")
    parser.add_argument("--hot-share", type=float, default=0.5)
    parser.add_argument("--repeat-share", type=float, default=0.1)
    parser.add_argument("--max-queued", type=int, default=16, help="EDGEQA_MAX_QUEUED_REQUESTS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--miss-path",
        action="store_true",
        help="the origin's TTFT for edge misses, with and without the missed-hint (see above)",
    )
    parser.add_argument("--requests", type=int, help="requests (--miss-path: default 40)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.miss_path:
        run_miss_path(args.requests or 40, args.max_tokens or 8)
        return
    import httpx

    from base.store import FileStore
    from edgeqa.local import free_port

    n = args.requests or (150 if args.quick else 600)
    args.max_tokens = args.max_tokens or 64
    with tempfile.TemporaryDirectory(prefix="edgeqa-http-") as tmp:
        store = FileStore(Path(tmp) / "store")
        release = publish_release(store, top_n=34, max_tokens=96)
        port = free_port()
        server_env = {
            "EDGEQA_MAX_QUEUED_REQUESTS": str(args.max_queued),
            "EDGEQA_LOG_REQUESTS": "1",
        }
        child = start_origin(store, port, server_env)
        url = f"http://127.0.0.1:{port}"
        try:
            requests = trace(n, args.rate, args.hot_share, args.repeat_share, args.seed)
            results, wall = asyncio.run(replay(url, requests, args.max_tokens))
            metrics = httpx.get(f"{url}/metrics").text
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(60)

    ok = [r for r in results if r["status"] == 200]
    rejected = [r for r in results if r["status"] == 429]
    errors = [r for r in results if r["status"] not in (200, 429)]
    by_tier: dict[str, list[float]] = {}
    for r in ok:
        if r["ttft"] is not None:
            by_tier.setdefault(r["tier"], []).append(r["ttft"])
    report = {
        "config": {
            "requests": n,
            "rate_per_s": args.rate,
            "max_tokens": args.max_tokens,
            "hot_share": args.hot_share,
            "repeat_share": args.repeat_share,
            "max_queued_requests": args.max_queued,
            "release": release,
            "duration_s": round(wall, 1),
        },
        "client": {
            "completed": len(ok),
            "rejected_429": len(rejected),
            "errors": len(errors),
            "ttft_ms": summary_ms([r["ttft"] for r in ok if r["ttft"] is not None]),
            "tpot_ms": summary_ms([r["tpot"] for r in ok if r["tpot"] is not None]),
            "output_tok_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
            "ttft_ms_by_tier": {tier: summary_ms(v) for tier, v in sorted(by_tier.items())},
        },
        "server": {
            "ttft_queue_ms": histogram(metrics, "edgeqa_ttft_queue_seconds"),
            "ttft_compute_ms": histogram(metrics, "edgeqa_ttft_compute_seconds"),
            "ttft_network_ms": histogram(metrics, "edgeqa_ttft_network_seconds"),
        },
        "tiers": dict(Counter(r["tier"] or "error" for r in results).most_common()),
    }
    if errors:
        report["error_samples"] = [str(r["status"]) for r in errors[:5]]
    print(json.dumps(report, indent=2))


def run_miss_path(n: int, max_tokens: int) -> None:
    import httpx

    from base.store import FileStore
    from edgeqa.local import free_port

    with tempfile.TemporaryDirectory(prefix="edgeqa-http-") as tmp:
        store = FileStore(Path(tmp) / "store")
        # the semantic tier on: the work the hint spares (an uncalibrated one would never run)
        release = publish_release(store, top_n=34, max_tokens=96, semantic=True)
        port = free_port()
        child = start_origin(store, port, {})
        url = f"http://127.0.0.1:{port}"
        try:
            semantic = _series(httpx.get(f"{url}/metrics").text).get(
                "edgeqa_origin_release_semantic_enabled{language=en}"
            )
            started = time.perf_counter()
            measured = miss_path(url, n, max_tokens, seed=0)
            wall = time.perf_counter() - started
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(60)
    config = {
        "mode": "miss_path",
        "requests": n,
        "max_tokens": max_tokens,
        "release": {**release, "semantic_enabled": bool(semantic)},
        "duration_s": round(wall, 1),
    }
    print(json.dumps({"config": config, **measured}, indent=2))


if __name__ == "__main__":
    main()
