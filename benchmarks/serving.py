"""Serving under load: one Poisson arrival trace replayed in-process against each system.

Systems (same model weights, same prompts, same output length, one run):
- ``sequential``: transformers ``generate``, one request at a time (FIFO).
- ``static``: the classic batcher: collect up to 8 requests or 150 ms, then one padded ``generate``.
- ``hf_cb``: transformers' own continuous batching (``ContinuousBatchingManager``).
- ``edgeqa``: the edgeqa engine with its defaults for this machine (batch-invariant fixed-order
  kernels, bf16 weights on a CPU with native bf16, 64 slots); ``edgeqa_library`` is the same with
  ``batch_invariant=False`` (the library GEMMs: what invariance costs or saves); ``edgeqa_fp32`` and
  ``edgeqa_int8`` are the same engine with fp32 and INT8 weights, for comparison.

Every request asks for exactly ``--max-tokens`` tokens (EOS ignored) so that all systems do the same
work. TTFT is measured from the request's arrival to the moment its first token reaches the
caller; TPOT is (last token - first token) / (tokens - 1); throughput is output tokens over the time
from the first arrival to the last completion. A system still busy ``--deadline-s`` after the first
arrival is stopped there: ``completed`` then counts what it finished, and its latencies cover only
those (so they flatter it).

Prints one JSON object:
  {"config": {...}, "systems": {"<name>": {"completed", "ttft_ms": {"mean", "p50", "p99"},
   "tpot_ms": {...}, "output_tok_per_s", "req_per_s"}}, "static_overloaded": bool, "ratios": {...}}

Run: .venv/bin/python benchmarks/serving.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import banking_questions, summary_ms

if TYPE_CHECKING:
    import torch

    from origin.engine import RequestOutput


@dataclass
class Record:
    arrival: float = 0.0
    first: float | None = None
    finish: float | None = None
    tokens: int = 0


class System:
    name = "system"

    def start(self) -> None: ...

    def submit(self, index: int, ids: list[int], record: Record) -> None:
        raise NotImplementedError

    def stop(self) -> None: ...


@functools.cache
def _first_token_streamer() -> Any:
    """The streamer class, made on first use (importing this module imports no transformers)."""
    from transformers.generation.streamers import BaseStreamer

    class _FirstTokenStreamer(BaseStreamer):
        """Marks the first generated token of a (batched) ``generate`` call on the given
        records."""

        def __init__(self, records: list[Record]) -> None:
            self.records = records
            self.calls = 0

        def put(self, value: torch.Tensor) -> None:
            self.calls += 1
            if self.calls == 2:  # the first call carries the prompt
                now = time.perf_counter()
                for record in self.records:
                    record.first = now

        def end(self) -> None:
            pass

    return _FirstTokenStreamer


class _GenerateWorker(System):
    """A worker thread that serves a FIFO queue with padded ``model.generate`` batches."""

    def __init__(self, model, tokenizer, max_tokens: int, batch: int, wait_s: float) -> None:  # type: ignore[no-untyped-def]
        from transformers import GenerationConfig

        self.model, self.tokenizer = model, tokenizer
        self.batch, self.wait_s = batch, wait_s
        self.config = GenerationConfig(
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or 0,
            eos_token_id=None,
        )
        self.queue: queue.Queue[tuple[list[int], Record] | None] = queue.Queue()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, index: int, ids: list[int], record: Record) -> None:
        self.queue.put((ids, record))

    def stop(self) -> None:
        # past the deadline: drop what is still queued, let the batch in flight finish
        self.stopping = True
        self.queue.put(None)
        self.thread.join()

    def _collect(self) -> list[tuple[list[int], Record]] | None:
        first = self.queue.get()
        if first is None or self.stopping:
            return None
        items = [first]
        deadline = first[1].arrival + self.wait_s
        while len(items) < self.batch:
            timeout = deadline - time.perf_counter()
            try:
                item = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.queue.put(None)
                break
            items.append(item)
        return items

    def _run(self) -> None:
        import torch

        while (items := self._collect()) is not None:
            records = [r for _, r in items]
            padded = self.tokenizer.pad(
                {"input_ids": [ids for ids, _ in items]}, padding_side="left", return_tensors="pt"
            )
            with torch.inference_mode():
                out = self.model.generate(
                    **padded,
                    generation_config=self.config,
                    streamer=_first_token_streamer()(records),
                )
            now = time.perf_counter()
            for record in records:
                record.finish = now
                record.tokens = out.shape[1] - padded["input_ids"].shape[1]


class Sequential(_GenerateWorker):
    name = "sequential"

    def __init__(self, model, tokenizer, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(model, tokenizer, max_tokens, batch=1, wait_s=0.0)


class Static(_GenerateWorker):
    name = "static"

    def __init__(self, model, tokenizer, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(model, tokenizer, max_tokens, batch=8, wait_s=0.150)


class HFContinuousBatching(System):
    name = "hf_cb"

    def __init__(self, model, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1)
        self.manager = model.init_continuous_batching(generation_config=config)
        self.max_tokens = max_tokens
        self.records: dict[str, Record] = {}
        self.consumer = threading.Thread(target=self._consume, daemon=True)
        self.done = threading.Event()

    def start(self) -> None:
        self.manager.start()
        self.consumer.start()

    def submit(self, index: int, ids: list[int], record: Record) -> None:
        request_id = f"r{index}"
        self.records[request_id] = record
        self.manager.add_request(
            ids,
            request_id=request_id,
            max_new_tokens=self.max_tokens,
            streaming=True,
            eos_token_id=-1,
        )

    def _consume(self) -> None:
        while not self.done.is_set():
            result = self.manager.get_result(timeout=0.1)
            if result is None:
                continue
            record = self.records[result.request_id]
            now = time.perf_counter()
            if result.generated_tokens and record.first is None:
                record.first = now
            if result.is_finished():
                record.finish = now
                record.tokens = len(result.generated_tokens)

    def stop(self) -> None:
        self.done.set()
        self.consumer.join()
        self.manager.stop(block=True, timeout=10)


class EdgeqaSystem(System):
    def __init__(  # type: ignore[no-untyped-def]
        self,
        name: str,
        model,
        tokenizer,
        max_tokens: int,
        quantization: str,
        speculative: str | None = None,
        batch_invariant: bool = True,
    ) -> None:
        from origin.engine import Engine, EngineConfig
        from origin.sampling import SamplingParams

        self.name = name
        config = EngineConfig(
            batch_invariant=batch_invariant,
            max_num_seqs=64,
            token_budget=512,
            prefill_chunk=256,
            max_model_len=512,
            quantization=quantization,
            speculative=speculative,
        )
        self.engine = Engine(model, tokenizer, config)
        self.params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

    def start(self) -> None:
        from origin.engine import generate_many
        from origin.sampling import SamplingParams

        # warm-up outside the measured window
        generate_many(self.engine, [[1, 2, 3]], SamplingParams(max_tokens=2), progress=False)
        self.engine.start()

    def submit(self, index: int, ids: list[int], record: Record) -> None:
        def on_output(output: RequestOutput) -> None:
            now = time.perf_counter()
            if output.delta_token_ids and record.first is None:
                record.first = now
            if output.finished:
                record.finish = now
                record.tokens = output.completion_tokens

        self.engine.add_request(ids, self.params, on_output)

    def stop(self) -> None:
        self.engine.stop()


def replay(
    system: System, prompts: list[list[int]], arrivals: list[float], deadline_s: float
) -> list[Record]:
    records = [Record() for _ in prompts]
    system.start()
    t0 = time.perf_counter() + 0.05
    for index, (ids, offset) in enumerate(zip(prompts, arrivals, strict=True)):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        records[index].arrival = time.perf_counter()
        system.submit(index, ids, records[index])
    end = t0 + deadline_s
    while time.perf_counter() < end and any(r.finish is None for r in records):
        time.sleep(0.02)
    system.stop()
    return records


def summarize(records: list[Record], total: int) -> dict[str, object]:
    done = [r for r in records if r.finish is not None and r.first is not None]
    if not done:
        return {"completed": 0, "of": total}
    span = max(r.finish for r in done) - min(r.arrival for r in records)  # type: ignore[type-var]
    tokens = sum(r.tokens for r in done)
    return {
        "completed": len(done),
        "of": total,
        "ttft_ms": summary_ms([r.first - r.arrival for r in done]),  # type: ignore[operator]
        "tpot_ms": summary_ms(
            [(r.finish - r.first) / (r.tokens - 1) for r in done if r.tokens > 1]  # type: ignore[operator]
        ),
        "output_tok_per_s": round(tokens / span, 1),
        "req_per_s": round(len(done) / span, 2),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="64 requests x 48 tokens, 90 s per system (< 5 min)"
    )
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=16.0, help="Poisson arrivals per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=600.0, help="per system")
    parser.add_argument(
        "--systems",
        default="sequential,static,edgeqa,edgeqa_library,edgeqa+spec,edgeqa_fp32,edgeqa_int8,hf_cb",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    from origin.chat import encode_chat
    from origin.engine import default_quantization
    from origin.model import load_model

    if args.quick:
        args.requests, args.max_tokens, args.deadline_s = 64, 48, 90.0
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    model, tokenizer = load_model("embedded", device="cpu", dtype="float32")
    questions = banking_questions(args.requests, seed=args.seed)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    rng = random.Random(args.seed)
    arrivals, now = [], 0.0
    for _ in prompts:
        now += rng.expovariate(args.rate)
        arrivals.append(now)

    factories: dict[str, Callable[[], System]] = {
        "sequential": lambda: Sequential(model, tokenizer, args.max_tokens),
        "static": lambda: Static(model, tokenizer, args.max_tokens),
        "edgeqa": lambda: EdgeqaSystem(
            "edgeqa", model, tokenizer, args.max_tokens, default_quantization(model.device)
        ),
        "edgeqa_library": lambda: EdgeqaSystem(
            "edgeqa_library",
            model,
            tokenizer,
            args.max_tokens,
            default_quantization(model.device),
            batch_invariant=False,
        ),
        "edgeqa_fp32": lambda: EdgeqaSystem(
            "edgeqa_fp32", model, tokenizer, args.max_tokens, "none"
        ),
        "edgeqa+spec": lambda: EdgeqaSystem(
            "edgeqa+spec",
            model,
            tokenizer,
            args.max_tokens,
            default_quantization(model.device),
            speculative="ngram+suffix",
        ),
        "edgeqa_int8": lambda: EdgeqaSystem(
            "edgeqa_int8", model, tokenizer, args.max_tokens, "int8"
        ),
        "hf_cb": lambda: HFContinuousBatching(model, args.max_tokens),
    }
    results: dict[str, dict[str, object]] = {}
    for name in args.systems.split(","):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        records = replay(factories[name](), prompts, arrivals, args.deadline_s)
        results[name] = summarize(records, len(prompts))
        print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)

    trace_s = arrivals[-1]
    static = results.get("static", {})
    static_rate = static.get("req_per_s", 0.0)
    ratios = {}
    edge = results.get("edgeqa", {})
    for other in ("static", "hf_cb", "sequential"):
        if (
            other in results
            and edge.get("output_tok_per_s")
            and results[other].get("output_tok_per_s")
        ):
            ratios[f"edgeqa_vs_{other}_tok_per_s"] = round(
                edge["output_tok_per_s"] / results[other]["output_tok_per_s"],
                2,  # type: ignore[operator]
            )
            ttft_other = results[other]["ttft_ms"]["p99"]  # type: ignore[index]
            ratios[f"edgeqa_ttft_p99_over_{other}"] = round(edge["ttft_ms"]["p99"] / ttft_other, 3)  # type: ignore[index]
    library = results.get("edgeqa_library", {})
    if edge.get("output_tok_per_s") and library.get("output_tok_per_s"):
        # the cost of batch invariance under load (> 1: the invariant kernels are faster)
        ratios["edgeqa_invariant_over_library_tok_per_s"] = round(
            edge["output_tok_per_s"] / library["output_tok_per_s"],  # type: ignore[operator]
            2,
        )
    print(
        json.dumps(
            {
                "config": {
                    "requests": len(prompts),
                    "rate_req_per_s": args.rate,
                    "trace_s": round(trace_s, 2),
                    "max_tokens": args.max_tokens,
                    "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
                    "seed": args.seed,
                    "prompts": "banking77 test questions, chat template",
                    "edgeqa_default_quantization": default_quantization(model.device),
                    "threads": torch.get_num_threads(),
                },
                "static_overloaded": bool(static_rate and static_rate < args.rate),
                "note": (
                    f"arrivals at {args.rate} req/s exceed static's service rate "
                    f"({static_rate} req/s): its queue grows for the whole trace"
                    if static_rate and static_rate < args.rate
                    else "static keeps up at this rate"
                ),
                "systems": results,
                "ratios": ratios,
            }
        )
    )


if __name__ == "__main__":
    main()
