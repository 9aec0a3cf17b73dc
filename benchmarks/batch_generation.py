"""Nightly generation: the engine's batch against one-at-a-time ``generate`` on the same questions.

The questions are what the nightly job would answer: the sample logs (``precompute/samplelogs.py``)
mined with the production rules. ``edgeqa`` answers all of them the way ``precompute`` does
(``nightly_engine``: INT8 weights unless ``--quantization``, every question of a partition in one
``generate_many``); ``sequential`` answers the first ``--sample`` of them with transformers
``generate``, fp32, one question at a time — what a naive batch job does. Same prompts (system
prompt, chat template), greedy, the same ``--max-tokens``.

Prints one JSON object: {"config", "systems": {"edgeqa": {...}, "sequential": {...}},
"speedup_tokens_per_s"}.

Run: .venv/bin/python benchmarks/batch_generation.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from collections.abc import Sequence

    from precompute.config import PrecomputeSettings


def engine_batch(
    settings: PrecomputeSettings, quantization: str, model: Any, questions: list[str]
) -> dict[str, Any]:
    from origin.chat import chat_messages
    from origin.engine import generate_many
    from origin.sampling import SamplingParams
    from precompute.generate import nightly_engine

    engine = nightly_engine(settings, quantization, model)  # type: ignore[arg-type]
    prompts = [chat_messages(q, settings.system_prompt) for q in questions]
    params = SamplingParams(max_tokens=settings.max_tokens)
    started = time.perf_counter()
    results = generate_many(engine, prompts, params, progress=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(r.token_ids) for r in results)
    return _rates(len(questions), tokens, seconds, f"edgeqa engine, {quantization}, batched")


def sequential(settings: PrecomputeSettings, model: Any, questions: list[str]) -> dict[str, Any]:
    import torch

    from origin.chat import chat_messages, encode_chat, eos_token_ids

    weights, tokenizer = model
    eos = sorted(eos_token_ids(weights, tokenizer))
    tokens = 0
    started = time.perf_counter()
    for question in questions:
        ids = encode_chat(tokenizer, chat_messages(question, settings.system_prompt))
        input_ids = torch.tensor([ids], device=weights.device)
        with torch.inference_mode():
            out = weights.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=settings.max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        tokens += int(out.shape[1] - input_ids.shape[1])
    seconds = time.perf_counter() - started
    return _rates(len(questions), tokens, seconds, "transformers generate, one at a time, fp32")


def _rates(questions: int, tokens: int, seconds: float, system: str) -> dict[str, Any]:
    return {
        "system": system,
        "questions": questions,
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "answers_per_s": round(questions / seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="64 tokens, 4 sequential questions")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--sample", type=int, default=8, help="questions answered one at a time")
    parser.add_argument("--quantization", default="int8", choices=("int8", "bf16", "none"))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from origin.model import load_model
    from precompute.config import MiningConfig, PrecomputeSettings
    from precompute.mining import mine
    from precompute.samplelogs import generate_rows
    from semantic.loading import load_embedder

    if args.quick:
        args.max_tokens, args.sample = 64, 4
    settings = PrecomputeSettings.from_env(max_tokens=args.max_tokens)
    until = datetime.now(UTC).date()
    hot, _ = mine(
        generate_rows(until, days=7), load_embedder(), MiningConfig(cluster_threshold=0.9), None
    )
    questions = [h.question for h in hot]
    model = load_model(settings.model, "cpu", "float32", settings.cache_dir)
    systems = {
        "edgeqa": engine_batch(settings, args.quantization, model, questions),
        "sequential": sequential(settings, model, questions[: args.sample]),
    }
    speedup = systems["edgeqa"]["tokens_per_s"] / systems["sequential"]["tokens_per_s"]
    config = {
        "questions": len(questions),
        "max_tokens": args.max_tokens,
        "logs": "precompute/samplelogs.py, 7 days",
        "quantization": args.quantization,
    }
    print(
        json.dumps(
            {"config": config, "systems": systems, "speedup_tokens_per_s": round(speedup, 2)}
        )
    )


if __name__ == "__main__":
    main()
