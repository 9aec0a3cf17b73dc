"""Batch-1 decode speed and greedy agreement with fp32, side by side.

Systems: ``transformers generate (fp32)`` (the model as loaded, ``model.generate``), and the edgeqa
engine with fp32, bf16 and int8 weights, each batch-invariant (the default: fixed-order kernels)
and with the library kernels (``batch_invariant=False``). Each generates the same number of tokens
(EOS ignored) for the same prompts (real questions from NQ-open), one request at a time.

Agreement is teacher-forced: the fp32 transformers model's greedy continuation is fed to each
system token by token through its own decode path, and agreement is the fraction of positions where
the system's argmax equals the fp32 token. The bandwidth bound is the measured memory read
bandwidth divided by the weight bytes one decode step must read (every layer weight and the LM
head; one embedding row).

Prints one JSON object:
  {"systems": {"<name>": {"tok_per_s", "agreement", "weight_mb"}},
   "invariant_over_library_tok_per_s": {"fp32", "bf16", "int8"} (the cost of invariance: < 1),
   "bandwidth_bound_tok_per_s": {"fp32", "bf16", "int8"}, "memory_bandwidth_gb_s", "config"}

Run: .venv/bin/python benchmarks/decode.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import nq_questions
from transformers import GenerationConfig
from transformers.utils import logging as hf_logging

from origin.engine import Engine, EngineConfig
from origin.engine.runner import Segment
from origin.generate import encode_chat
from origin.model import load_model
from origin.sampling import SamplingParams


def memory_bandwidth_gb_s(megabytes: int = 1024) -> float:
    """Read bandwidth: a sum over a buffer much larger than the caches, best of 5."""
    buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    buffer.sum()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def hf_generate_tok_per_s(model, prompts: list[list[int]], n: int) -> float:  # type: ignore[no-untyped-def]
    config = GenerationConfig(
        max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    total = 0.0
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), generation_config=config)  # warm-up
        for ids in prompts:
            started = time.perf_counter()
            model.generate(torch.tensor([ids]), generation_config=config)
            total += time.perf_counter() - started
    return n * len(prompts) / total


def engine_tok_per_s(engine: Engine, prompts: list[list[int]], n: int) -> float:
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    engine.generate_many([prompts[0]], params, progress=False)  # warm-up
    total = 0.0
    for ids in prompts:
        started = time.perf_counter()
        engine.generate_many([ids], params, progress=False)
        total += time.perf_counter() - started
    return n * len(prompts) / total


def reference_continuations(model, prompts: list[list[int]], n: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    config = GenerationConfig(max_new_tokens=n, do_sample=False, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), generation_config=config)[0]
            out.append(generated[len(ids) :].tolist())
    return out


def teacher_forced_agreement(
    engine: Engine, prompts: list[list[int]], references: list[list[int]]
) -> float:
    """Fraction of reference positions where the engine's decode-path argmax agrees."""
    runner = engine.runner
    slot = runner.cache.allocate()
    agree = total = 0
    try:
        for ids, ref in zip(prompts, references, strict=True):
            logits = runner.forward([Segment(slot, ids, 0)])[0][-1]
            position = len(ids)
            for token in ref:
                agree += int(int(logits.argmax()) == token)
                total += 1
                logits = runner.forward([Segment(slot, [token], position)])[0][-1]
                position += 1
    finally:
        runner.cache.free(slot)
    return agree / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 prompts x 32 tokens (< 5 min)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.tokens = 4, 32
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    model, tokenizer = load_model("embedded", device="cpu", dtype="float32")
    questions = nq_questions(args.prompts, seed=1)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    references = reference_continuations(model, prompts, args.tokens)

    systems: dict[str, dict[str, float]] = {}
    systems["transformers generate (fp32)"] = {
        "tok_per_s": round(hf_generate_tok_per_s(model, prompts, args.tokens), 2),
        "agreement": 1.0,
        "weight_mb": round(sum(p.numel() * 4 for p in model.parameters()) / 1e6, 1),
    }
    weight_bytes = {}
    invariance_cost = {}
    for name, quantization in (("fp32", "none"), ("bf16", "bf16"), ("int8", "int8")):
        # batch-invariant (the default: fixed-order kernels) and the library kernels beside it
        for invariant in (True, False):
            config = EngineConfig(
                max_num_seqs=1,
                max_model_len=1024,
                quantization=quantization,
                batch_invariant=invariant,
            )
            engine = Engine(model, tokenizer, config)
            label = f"edgeqa {name}" + ("" if invariant else " (library kernels, not invariant)")
            if invariant:
                weight_bytes[name] = engine.runner.weight_bytes
            systems[label] = {
                "tok_per_s": round(engine_tok_per_s(engine, prompts, args.tokens), 2),
                "agreement": round(teacher_forced_agreement(engine, prompts, references), 4),
                "weight_mb": round(engine.runner.weight_bytes / 1e6, 1),
            }
            del engine
        library = systems[f"edgeqa {name} (library kernels, not invariant)"]["tok_per_s"]
        # > 1: batch invariance costs nothing here, it is faster
        invariance_cost[name] = round(systems[f"edgeqa {name}"]["tok_per_s"] / library, 2)

    bandwidth = memory_bandwidth_gb_s()
    baseline = systems["transformers generate (fp32)"]["tok_per_s"]
    print(
        json.dumps(
            {
                "config": {
                    "prompts": args.prompts,
                    "new_tokens": args.tokens,
                    "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                },
                "systems": systems,
                "speedup_vs_transformers": {
                    name: round(s["tok_per_s"] / baseline, 2) for name, s in systems.items()
                },
                "invariant_over_library_tok_per_s": invariance_cost,
                "memory_bandwidth_gb_s": round(bandwidth, 1),
                "bandwidth_bound_tok_per_s": {
                    name: round(bandwidth * 1e9 / b, 1) for name, b in weight_bytes.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
