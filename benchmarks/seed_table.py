"""The field report's table, reproduced in one run: what each layer of edgeqa buys, on one trace.

Trace: open questions (NQ-open dev) arriving as a Poisson process at ``--rate`` (above what the
serial baseline can serve). A share ``--repeat`` (0.42, the report's) of the requests repeat or
paraphrase a question from a popular pool, Zipf-distributed (the questions people ask again and
again, yesterday and today); the rest are new questions asked once. A popular question comes in
three wordings: as written, lower-case without the question mark (the same key once normalized),
and with a lead-in ("Quick question: ...", a paraphrase only the semantic tier can match).

Rows, each adding one layer to the row above (the report's rows):

  serial                  transformers ``generate`` (fp32), one request at a time, FIFO
  + INT8                  the same, one at a time, INT8 weights (the edgeqa engine, one slot)
  + continuous batching   the edgeqa engine, INT8, ``--slots`` sequences in flight
  + cache at the origin   the origin's online cache (``origin/server/cache.py``) in front:
                          answers generated during the run, by normalized question
  + release at the edge   last night's release in front of all that: yesterday's logs (the same
                          popular pool, asked by many users, as ``precompute/samplelogs.py``
                          writes them) through the real nightly pipeline (mining, INT8
                          generation, FAISS, publish), looked up through the tier cascade
                          (``edge_index/tiers.py``: exact, the online cache, semantic)

Columns (the report's): mean and p99 TTFT (arrival to first token; a hit's first token is its
answer), qps (requests completed per second the system was busy: its sustained rate), and hit rate
(requests answered without generating).

Prints one JSON object: {"config": {...}, "rows": {"<row>": {"ttft_ms": {"mean", "p99"}, "qps",
"hit_rate", "completed"}}, "monotone": bool}.

Run: .venv/bin/python benchmarks/seed_table.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import nq_questions, summary_ms

if TYPE_CHECKING:
    from collections.abc import Sequence

    from base.store import FileStore
    from edge_index.lookup import ReleaseIndex
    from origin.engine import Engine
    from origin.server.cache import OnlineCache

Answered = tuple[float, float, bool]  # (first token, done) monotonic seconds; a hit?


def wordings(question: str) -> list[str]:
    plain = question.rstrip("?").lower()
    return [question, plain, f"Quick question: {plain}?"]


def make_trace(args: argparse.Namespace) -> tuple[list[tuple[float, str]], list[list[str]]]:
    """(arrival offset s, question) pairs, and the popular pool's wordings."""
    rng = random.Random(args.seed)
    questions = nq_questions(args.requests + args.popular, seed=args.seed)
    popular = [wordings(q) for q in questions[: args.popular]]
    novel = iter(questions[args.popular :])
    weights = [1 / (i + 1) ** 1.1 for i in range(args.popular)]
    trace, at = [], 0.0
    for _ in range(args.requests):
        at += rng.expovariate(args.rate)
        if rng.random() < args.repeat:
            forms = rng.choices(popular, weights)[0]
            trace.append((at, rng.choice(forms)))
        else:
            trace.append((at, next(novel)))
    return trace, popular


async def replay(
    trace: list[tuple[float, str]], answer: Callable[[str, float], Awaitable[Answered]]
) -> dict[str, Any]:
    """Every request at its arrival time through ``answer``; the row's figures."""
    start = time.monotonic() + 0.5

    async def one(offset: float, question: str) -> tuple[float, Answered]:
        await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
        arrival = time.monotonic()
        return arrival, await answer(question, arrival)

    done = await asyncio.gather(*(one(o, q) for o, q in trace))
    ttfts = [first - arrival for arrival, (first, _, _) in done]
    # busy time: the union of [arrival, done] intervals
    busy, end = 0.0, float("-inf")
    for arrival, (_, finished, _) in sorted(done):
        if finished > end:
            busy += finished - max(arrival, end)
            end = finished
    ttft = summary_ms(ttfts)
    return {
        "ttft_ms": {"mean": ttft["mean"], "p99": ttft["p99"]},
        "qps": round(len(done) / busy, 2),
        "hit_rate": round(sum(hit for _, (_, _, hit) in done) / len(done), 3),
        "completed": len(done),
    }


def serial_hf(
    model: Any, tokenizer: Any, max_tokens: int
) -> Callable[[str, float], Awaitable[Answered]]:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    from origin.chat import encode_chat

    class _FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.first: float | None = None
            self.calls = 0

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2 and self.first is None:  # the first call is the prompt
                self.first = time.monotonic()

        def end(self) -> None:
            pass

    config = GenerationConfig(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip

    def run(question: str) -> Answered:
        ids = torch.tensor([encode_chat(tokenizer, [{"role": "user", "content": question}])])
        with torch.inference_mode():
            streamer = _FirstToken()
            model.generate(ids, generation_config=config, streamer=streamer)
            done = time.monotonic()
        return streamer.first or done, done, False

    queue: asyncio.Lock = asyncio.Lock()

    async def answer(question: str, arrival: float) -> Answered:
        async with queue:  # one at a time, FIFO: asyncio.Lock wakes waiters in arrival order
            return await asyncio.to_thread(run, question)

    return answer


def engine_answer(
    engine: Engine, max_tokens: int
) -> Callable[[str, float], Awaitable[tuple[Answered, str]]]:
    from origin.chat import prompt_ids
    from origin.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

    async def answer(question: str, arrival: float) -> tuple[Answered, str]:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        text: list[str] = []
        first: list[float] = []

        def on_output(out: Any) -> None:
            if not first and out.delta_token_ids:
                first.append(time.monotonic())
            text.append(out.delta_text)
            if out.finished:
                loop.call_soon_threadsafe(finished.set_result, None)

        ids = prompt_ids(engine.tokenizer, question)  # the one user turn, in the template
        engine.add_request(ids, params, on_output, arrival=arrival)
        await finished
        return (first[0], time.monotonic(), False), "".join(text)

    return answer


def cached(
    generate: Callable[[str, float], Awaitable[tuple[Answered, str]]],
    cache: OnlineCache,
    index: ReleaseIndex | None,
) -> Callable[[str, float], Awaitable[Answered]]:
    """The tier cascade in front of generation, as the origin runs it: the release's exact tier,
    the online cache, the release's semantic tier; a generated answer goes into the cache."""
    from base.keys import InvalidQueryError, key_of_normalized, normalize
    from edge_index import tiers
    from edge_index.lookup import Hit

    async def answer(question: str, arrival: float) -> Answered:
        try:
            normalized = normalize(question)
        except InvalidQueryError:
            normalized = None
        if normalized is not None:
            key = key_of_normalized(normalized)

            def online(k: str) -> Hit | None:
                entry = cache.get(k)
                return (
                    None
                    if entry is None
                    else Hit("origin_cache", k, question, entry.answer, 1.0, None)
                )

            found = await tiers.lookup(index, question, normalized, key, online)
            if isinstance(found, Hit):
                now = time.monotonic()
                return now, now, True
        times, text = await generate(question, arrival)
        if normalized is not None:
            cache.put(key_of_normalized(normalized), text, 0)
        return times

    return answer


def nightly_release(
    store: FileStore, popular: list[list[str]], args: argparse.Namespace
) -> ReleaseIndex:
    """Yesterday's logs of the popular pool through the real nightly pipeline; the release."""
    from edge_index.profiles import load_index
    from precompute.config import PipelineConfig
    from precompute.pipeline import RunParams, run_pipeline
    from precompute.samplelogs import generate_rows, write_logs
    from semantic.loading import load_embedder

    until = datetime.now(UTC).date()
    rows = generate_rows(
        until, days=2, users=200, asks=40 * len(popular), seed=args.seed, questions=popular,
        aside_rows=0, pii_rows=0, multi_turn_rows=0, failed_rows=0, tail_questions=0,
    )  # fmt: skip
    write_logs(store, rows)
    config = PipelineConfig.from_env(
        {}, top_n=len(popular), max_tokens=args.max_tokens, quantization="int8"
    )
    report = run_pipeline(
        RunParams(store.uri, store.uri, until - timedelta(days=1), until, config, "seed-table")
    )
    if report.get("status") != "published":
        raise RuntimeError(f"no release was published: {report}")
    embedder = load_embedder("embedded")
    return load_index(store, report["profile"], embedder)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="80 requests at 1 req/s (default 1,000)"
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals (req/s)")
    parser.add_argument("--repeat", type=float, default=0.42, help="share of repeated questions")
    parser.add_argument("--popular", type=int, default=40, help="size of the popular pool")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    from base.store import FileStore
    from origin.engine import Engine, EngineConfig
    from origin.model import load_model
    from origin.server.cache import OnlineCache

    if args.quick:
        args.requests, args.popular = 80, 12
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    trace, popular = make_trace(args)
    model, tokenizer = load_model("embedded", device="cpu", dtype="float32")
    rows: dict[str, dict[str, Any]] = {}

    def measure(name: str, answer: Callable[[str, float], Awaitable[Answered]]) -> None:
        rows[name] = asyncio.run(replay(trace, answer))
        print(f"{name}: {rows[name]}", file=sys.stderr, flush=True)

    measure("serial", serial_hf(model, tokenizer, args.max_tokens))

    def engine(slots: int) -> Engine:
        config = EngineConfig(max_num_seqs=slots, max_model_len=512, quantization="int8")
        return Engine(model, tokenizer, config).start()

    def plain(
        generate: Callable[[str, float], Awaitable[tuple[Answered, str]]],
    ) -> Callable[[str, float], Awaitable[Answered]]:
        async def answer(question: str, arrival: float) -> Answered:
            return (await generate(question, arrival))[0]

        return answer

    one = engine(1)
    measure("+ INT8", plain(engine_answer(one, args.max_tokens)))
    one.stop()
    batched = engine(args.slots)
    generate = engine_answer(batched, args.max_tokens)
    measure("+ continuous batching", plain(generate))
    measure("+ cache at the origin", cached(generate, OnlineCache(), None))
    with tempfile.TemporaryDirectory() as tmp:
        index = nightly_release(FileStore(Path(tmp) / "store"), popular, args)
        measure("+ release at the edge", cached(generate, OnlineCache(), index))
    batched.stop()

    names = list(rows)
    monotone = all(
        rows[b]["ttft_ms"]["mean"] <= rows[a]["ttft_ms"]["mean"]
        and rows[b]["qps"] >= rows[a]["qps"]
        for a, b in itertools.pairwise(names)
    )
    config = {k: v for k, v in vars(args).items() if k != "quick"}
    config.update({"threads": torch.get_num_threads(), "questions": "NQ-open dev"})
    print(json.dumps({"config": config, "rows": rows, "monotone": monotone}))


if __name__ == "__main__":
    main()
