"""One API key flooding the origin: what happens to another key's time to first token.

Starts ``edgeqa origin serve`` (a separate process, two API keys, no release: every answer is
generated) three times, side by side in one run:

- ``per_key_limits``: the defaults (``EDGEQA_MAX_IN_FLIGHT_PER_USER`` 8,
  ``EDGEQA_MAX_TOKENS_PER_MINUTE_PER_USER`` 20,000, charged prompt + ``max_tokens`` at admission);
  the flood retries a refused request after 1 s, enough to keep its share always full;
- ``per_key_limits_retry_storm``: the same, but the flood retries every refusal after 20 ms
  (hundreds of requests a second, from a client on the same 2 cores as the server: what the
  deployment's per-IP WAF rate limit stops before the origin);
- ``no_limits``: both set to 0 (what the origin did before #15): only the shared queue bounds.

On each, a "victim" key asks novel questions one after another (closed loop, ``max_tokens`` 32)
alone (``unloaded``), then for a fixed time while a "flood" key keeps 48 streams busy asking for
256 tokens with ``ignore_eos`` (``flooded``); a victim request still without its first token
after 60 s counts as timed out. Prints one JSON object:

  {"config": {...}, "results": {"<setting>": {"unloaded": {...}, "flooded": {...},
   "ttft_p99_ratio", "flood": {"sent", "admitted", "rejected_429"}}}}

with each phase's victim ``completed``, ``rejected_429``, ``timed_out``, ``errors`` and ``ttft_ms``
(mean/p50/p99). #15's aim: ``ttft_p99_ratio`` (flooded p99 / unloaded p99) at most 2.

    python benchmarks/fairness.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, nq_questions, summary_ms
from http_serving import one_request, start_origin

sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from collections.abc import Sequence

VICTIM_KEY = "victim-key-0123456789abcdef"
FLOOD_KEY = "flood-key-0123456789abcdef"
FLOOD_TOKENS = 256
# both keys ask from loopback, one network: the per-network cap (not what this compares) is off
ORIGIN_ENV = {
    "EDGEQA_API_KEYS": f"{VICTIM_KEY},{FLOOD_KEY}",
    "EDGEQA_MAX_QUEUED_REQUESTS": "64",
    "EDGEQA_MAX_IN_FLIGHT_PER_NETWORK": "0",
}
SHARES = ("max_in_flight_per_user", "max_tokens_per_minute_per_user")
NO_LIMITS = {f"EDGEQA_{n.upper()}": "0" for n in SHARES}


def settings() -> dict[str, tuple[dict[str, str], float]]:
    """Each setting compared: (the server's settings, seconds the flood waits before retrying a
    refused request); the per-key limits at the origin's defaults."""
    from origin.config import OriginSettings

    defaults = {f"EDGEQA_{n.upper()}": str(OriginSettings.model_fields[n].default) for n in SHARES}
    return {
        "per_key_limits": (defaults, 1.0),
        "per_key_limits_retry_storm": (defaults, 0.02),
        "no_limits": (NO_LIMITS, 1.0),
    }


async def victim(
    url: str, questions: list[str], max_tokens: int, seconds: float | None = None
) -> list[dict[str, Any]]:
    """The victim's requests, one after another: all of ``questions``, or as many as fit in
    ``seconds``."""
    import httpx

    headers = {"authorization": f"Bearer {VICTIM_KEY}"}
    timeout = httpx.Timeout(60.0)  # to the first byte (and between bytes)
    results = []
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=timeout, headers=headers) as client:
        for question in questions:
            if seconds is not None and time.perf_counter() - started > seconds:
                break
            results.append(await one_request(client, question, max_tokens))
    return results


async def flood(
    url: str, streams: int, retry_s: float, stop: asyncio.Event, counts: dict[str, int]
) -> None:
    import httpx

    headers = {"authorization": f"Bearer {FLOOD_KEY}"}
    body = {
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "max_tokens": FLOOD_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(
        base_url=url, timeout=300, headers=headers, limits=limits
    ) as client:

        async def one_stream() -> None:
            while not stop.is_set():
                counts["sent"] += 1
                try:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        if r.status_code == 200:
                            counts["admitted"] += 1
                            async for _ in r.aiter_raw():
                                if stop.is_set():
                                    break
                        else:
                            counts["rejected_429" if r.status_code == 429 else "other"] += 1
                            await r.aread()
                            await asyncio.sleep(retry_s)
                except httpx.HTTPError:
                    counts["other"] += 1

        await asyncio.gather(*(one_stream() for _ in range(streams)))


async def flooded_phase(
    url: str, questions: list[str], max_tokens: int, streams: int, retry_s: float, seconds: float
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    stop = asyncio.Event()
    counts = {"sent": 0, "admitted": 0, "rejected_429": 0, "other": 0}
    flooding = asyncio.create_task(flood(url, streams, retry_s, stop, counts))
    await asyncio.sleep(3.0)  # let the flood fill its share first
    try:
        results = await victim(url, questions, max_tokens, seconds)
    finally:
        stop.set()
        flooding.cancel()  # streams still waiting in the queue would wait out their timeout
        with contextlib.suppress(asyncio.CancelledError):
            await flooding
    return results, counts


def phase(results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in results if r["status"] == 200 and r["ttft"] is not None]
    return {
        "completed": len(ok),
        "rejected_429": sum(r["status"] == 429 for r in results),
        "timed_out": sum(r["status"] in ("ReadTimeout", "ConnectTimeout") for r in results),
        "errors": sum(
            r["status"] not in (200, 429, "ReadTimeout", "ConnectTimeout") for r in results
        ),
        "ttft_ms": summary_ms([r["ttft"] for r in ok]),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="15 unloaded requests, 30 s flooded (40, 90 s)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=48, help="the flood's concurrent streams")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from edgeqa.local import free_port

    compared = settings()
    n, seconds = (15, 30.0) if args.quick else (40, 90.0)
    questions = nq_questions(200 * len(compared), seed=11)
    report: dict[str, Any] = {
        "config": {
            "victim_unloaded_requests": n,
            "flooded_seconds": seconds,
            "victim_max_tokens": args.max_tokens,
            "flood_streams": args.streams,
            "flood_request": {"max_tokens": FLOOD_TOKENS, "ignore_eos": True},
        },
        "results": {},
    }
    for i, (name, (env_extra, retry_s)) in enumerate(compared.items()):
        port = free_port()
        child = start_origin(None, port, {**ORIGIN_ENV, **env_extra})
        url = f"http://127.0.0.1:{port}"
        try:
            asked = questions[200 * i : 200 * (i + 1)]  # novel everywhere: no cache hits
            asyncio.run(victim(url, asked[:2], args.max_tokens))  # warm up
            unloaded = asyncio.run(victim(url, asked[2 : 2 + n], args.max_tokens))
            flooded, counts = asyncio.run(
                flooded_phase(url, asked[2 + n :], args.max_tokens, args.streams, retry_s, seconds)
            )
            print(f"{name}: done", file=sys.stderr)
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(60)
        quiet, busy = phase(unloaded), phase(flooded)
        p99_quiet, p99_busy = quiet["ttft_ms"].get("p99"), busy["ttft_ms"].get("p99")
        report["results"][name] = {
            "unloaded": quiet,
            "flooded": busy,
            "ttft_p99_ratio": round(p99_busy / p99_quiet, 2) if p99_quiet and p99_busy else None,
            "flood": {"retry_after_refusal_s": retry_s, **counts},
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
