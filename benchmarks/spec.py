"""Speculative decoding at batch 1: tokens/s with and without each proposer, side by side.

Workload: repeated paraphrased questions. For each of several banking77 intents, the answer to the
intent's first phrasing is generated first (it seeds the suffix index, as a release's answers
would), then the other phrasings are asked one at a time and measured. Every system answers the
same measured questions greedily with the same engine settings (the origin's defaults:
batch-invariant fixed-order kernels, the weights ``auto`` picks: the GGUF blocks on a CPU), so
"identical" means bitwise the same greedy output; ``identical`` compares each system's answers
with the baseline's. Run it under ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY`` caps to check
another CPU's arithmetic (``config.aten_capability`` says which ran).

Prints one JSON object:
  {"config": {...}, "systems": {"baseline": {"tok_per_s"},
   "<proposer>": {"tok_per_s", "speedup", "acceptance_rate", "identical",
                  "mean_accepted_per_draft", "forward_reduction", "verification_cost"}}}

``forward_reduction`` is output tokens / target forwards: the speedup the proposer would give if
verifying a draft cost no more than a plain decoding step, i.e. the ceiling its predictions allow;
``verification_cost`` = ``forward_reduction / speedup``, what a verifying forward cost against a
plain one as measured: speculation pays exactly where ``forward_reduction`` is above it.

Run: .venv/bin/python benchmarks/spec.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA_DIR

if TYPE_CHECKING:
    from collections.abc import Sequence

    from origin.engine import Engine
    from origin.sampling import SamplingParams


def paraphrase_groups(intents: int, per_intent: int, seed: int) -> list[list[str]]:
    """``intents`` groups of ``per_intent`` phrasings of one banking77 intent each."""
    by_intent: dict[str, list[str]] = defaultdict(list)
    with (DATA_DIR / "banking77" / "train.csv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            by_intent[row["category"]].append(row["text"].strip())
    rng = random.Random(seed)
    names = sorted(by_intent)
    rng.shuffle(names)
    return [rng.sample(by_intent[name], per_intent) for name in names[:intents]]


def run(
    engine: Engine, questions: list[str], params: SamplingParams
) -> tuple[list[str], float, int]:
    """Answer one at a time: the answers, output tokens per second, output tokens."""
    from origin.engine import generate_many

    texts, tokens, elapsed = [], 0, 0.0
    for question in questions:
        started = time.perf_counter()
        result = generate_many(engine, [question], params, progress=False)[0]
        elapsed += time.perf_counter() - started
        texts.append(result.text)
        tokens += len(result.token_ids)
    return texts, tokens / elapsed, tokens


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 intents x 3 phrasings (< 5 min)")
    parser.add_argument("--intents", type=int, default=10)
    parser.add_argument("--per-intent", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proposers", default="ngram,suffix,draft")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    from origin.engine import Engine, EngineConfig, seed_answers
    from origin.model import load_model
    from origin.runtime import auto_quantization
    from origin.sampling import SamplingParams

    if args.quick:
        args.intents, args.per_intent, args.max_tokens = 5, 3, 48
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    model, tokenizer = load_model("embedded", device="cpu", dtype="float32")
    groups = paraphrase_groups(args.intents, args.per_intent, args.seed)
    seeds = [g[0] for g in groups]
    measured = [q for g in groups for q in g[1:]]
    params = SamplingParams(max_tokens=args.max_tokens)
    weights = auto_quantization("cpu", model, 1024)
    settings = {"max_num_seqs": 1, "max_model_len": 1024, "quantization": weights}

    baseline = Engine(model, tokenizer, EngineConfig(**settings))  # type: ignore[arg-type]
    run(baseline, measured[:1], params)  # warm-up
    seeded, _, _ = run(baseline, seeds, params)
    reference, baseline_tps, _ = run(baseline, measured, params)
    systems: dict[str, dict[str, object]] = {"baseline": {"tok_per_s": round(baseline_tps, 2)}}

    for proposer in args.proposers.split(","):
        draft = (model, tokenizer) if proposer == "draft" else None
        engine = Engine(
            model,
            tokenizer,
            EngineConfig(speculative=proposer, **settings),
            draft=draft,  # type: ignore[arg-type]
        )
        if proposer == "suffix":
            seed_answers(engine, seeded, seeds)
        run(engine, measured[:1], SamplingParams(max_tokens=4))  # warm-up, tiny
        before = engine.spec_metrics()
        texts, tps, tokens = run(engine, measured, params)
        after = engine.spec_metrics()
        spec = {
            name: after[name] - before[name]
            for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
        }
        spec["acceptance_rate"] = spec["num_accepted_tokens"] / max(spec["num_draft_tokens"], 1)
        drafts = max(spec["num_drafts"], 1)
        systems[proposer] = {
            "tok_per_s": round(tps, 2),
            "speedup": round(tps / baseline_tps, 2),
            "acceptance_rate": round(spec["acceptance_rate"], 3),
            "mean_accepted_per_draft": round(spec["num_accepted_tokens"] / drafts, 2),
            # the speedup if a verification cost no more than a plain step: an upper bound set
            # by how much of the answers the proposer predicts
            "forward_reduction": round(tokens / max(tokens - spec["num_accepted_tokens"], 1), 2),
            # what a verifying forward cost against a plain step, as measured: speculation pays
            # where forward_reduction is above it
            "verification_cost": round(
                tokens / max(tokens - spec["num_accepted_tokens"], 1) / (tps / baseline_tps), 2
            ),
            "identical": texts == reference,
        }
        print(f"{proposer}: {systems[proposer]}", file=sys.stderr, flush=True)

    print(
        json.dumps(
            {
                "config": {
                    "intents": args.intents,
                    "measured_questions": len(measured),
                    "seeded_answers": len(seeded),
                    "max_tokens": args.max_tokens,
                    "num_speculative_tokens": EngineConfig().num_speculative_tokens,
                    "weights": weights or "fp32",
                    "batch_invariant": EngineConfig().batch_invariant,
                    "aten_capability": torch.backends.cpu.get_cpu_capability(),
                    "draft": "the embedded model drafting for itself",
                    "threads": torch.get_num_threads(),
                },
                "systems": systems,
            }
        )
    )


if __name__ == "__main__":
    main()
