"""The local demo that ``make demo`` runs on the embedded defaults.

Stage 1 of the product: the embedded model answers a few questions through the engine-free path,
with timings. Later stages (mining, release, edge, origin) extend this same entry point.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

from origin.generate import GenerationStats, chat_messages, stream_chat
from origin.model import load_model
from origin.sampling import SamplingParams

DEMO_QUESTIONS = (
    "What is the capital of France?",
    "How many days are there in a leap year?",
    "What is the boiling point of water in Celsius?",
    "Give me one tip for writing clear emails.",
)


def run_demo(
    questions: Sequence[str] = DEMO_QUESTIONS,
    model_spec: str = "embedded",
    max_tokens: int = 64,
    out: TextIO = sys.stdout,
) -> list[tuple[str, str, GenerationStats]]:
    started = time.perf_counter()
    model, tokenizer = load_model(model_spec)
    load_s = time.perf_counter() - started
    out.write(f"model {model_spec!r} loaded on {model.device} in {load_s:.2f} s\n\n")
    results = []
    for question in questions:
        stats = GenerationStats()
        out.write(f"Q: {question}\nA: ")
        out.flush()
        parts = []
        for delta in stream_chat(
            model, tokenizer, chat_messages(question), SamplingParams(max_tokens=max_tokens), stats
        ):
            parts.append(delta)
            out.write(delta)
            out.flush()
        out.write(
            f"\n   [ttft {stats.ttft_ms:.0f} ms, {stats.completion_tokens} tokens, "
            f"{stats.decode_tokens_per_s:.1f} tok/s, total {stats.total_ms:.0f} ms, "
            f"finish {stats.finish_reason}]\n\n"
        )
        results.append((question, "".join(parts), stats))
    return results
